"""Autograde's executor, named in nbgrader_config.py in place of nbgrader's Execute: `BoundedExecute` runs each
submission's kernel in a sandbox (ttlib.grading.sandbox) under CPU-time, memory and output bounds; a dead kernel
costs only the tests not run; demos run only their definitions; then the hidden tests run in a process of their own
and decide the scores (ttlib.grading.hidden_tests), and a static scan flags what an instructor should read
(ttlib.grading.scan). The other nbgrader plugins of the course are in ttlib.grading.plugins.
"""

from __future__ import annotations

import ast
import os
import re

import nbformat
from jupyter_client.manager import AsyncKernelManager
from nbclient.exceptions import CellTimeoutError, DeadKernelError
from nbclient.util import run_sync
from nbgrader.preprocessors import Execute
from traitlets import Bool, Float, Integer

from .nbrun import poll_shell_in_steps


# ---- autograde: a bounded, contained run per submission ----------------------------------------------------------
def _gib(n_bytes: float) -> str:
    return f"{n_bytes / 2**30:.2f} GiB"


def _mib(n: float) -> str:
    return f"{n / 2**20:g} MiB"


def error_output(ename: str, evalue: str):
    return nbformat.v4.new_output("error", ename=ename, evalue=evalue, traceback=[f"{ename}: {evalue}"])


def _env_number(name: str, default: float) -> float:
    value = os.environ.get(name)
    return float(value) if value not in (None, "") else default


def _size(content) -> int:
    """About how much text an output message holds (characters)."""
    if isinstance(content, str):
        return len(content)
    if isinstance(content, dict):
        return sum(len(k) + _size(v) for k, v in content.items())
    if isinstance(content, (list, tuple)):
        return sum(_size(v) for v in content)
    return 8


def _reads_as_score(output) -> bool:
    """Whether nbgrader would take this output of a test cell for the cell's score: an execute_result (nbgrader
    reads the first one as partial credit, before any error after it), or a display of a number."""
    if output.get("output_type") == "execute_result":
        return True
    if output.get("output_type") != "display_data":
        return False
    text = output.get("data", {}).get("text/plain", "")
    text = "".join(text) if isinstance(text, list) else str(text)
    try:
        float(text)
        return True
    except ValueError:
        return False


_WARNED: set[str] = set()  # guarantees already reported missing in this grading run (one warning per run)
OUTPUT_NOTE = "[ttlib: output over the grading limit ({}): the rest was dropped]\n"


def _answer_test_or_setup(cell) -> bool:
    meta = cell.metadata.get("nbgrader", {})
    return bool(meta.get("solution") or meta.get("grade") or "setup" in cell.metadata.get("tags", []))


def _definitions(source: str) -> str:
    """The definitions of a demo cell (imports, functions, classes, constants) as source; '' when it has none or
    does not parse."""
    from ..exercises.hidden import definitions

    module, _ = definitions(source)
    return ast.unparse(module) if module is not None and module.body else ""


class SandboxedKernelManager(AsyncKernelManager):
    """jupyter_client's kernel manager, starting the kernel inside a ttlib.grading.sandbox.Sandbox (`sandbox`)."""

    sandbox = None

    def format_kernel_cmd(self, extra_arguments=None):
        cmd = super().format_kernel_cmd(extra_arguments)
        return self.sandbox.command(cmd) if self.sandbox is not None else cmd


class BoundedExecute(Execute):
    """nbgrader's `Execute`, with bounds a submission cannot escape, in a sandbox it cannot leave:

    - time, counted in CPU seconds of the kernel's whole process tree (so a correct submission is not cut short on
      a machine running other work): `timeout` per cell (as in nbgrader) and `notebook_timeout` for the whole
      notebook, kernel start included; each cell gets at most what is left of the notebook's time. A clock backstop,
      `wall_factor` times larger, still ends a submission that sleeps. A looping function that later cells call
      again, or a reply nbclient misses (jupyter/nbclient#312), cannot stretch a submission past these. A cell's
      last output is awaited `iopub_timeout` s on the clock after the kernel's reply (nbclient's 4 s, which
      nbgrader makes fatal, cost an honest submission on a busy machine all its points);
    - `memory_limit` (bytes): the kernel and every process it started (setsid'd ones included, where the sandbox
      runs); past it the whole tree is killed;
    - output: at most `output_limit` characters per cell and `notebook_output_limit` per notebook are kept (the rest
      is dropped with a one-line note, in the kernel and again here), and no single message over
      `message_limit` bytes is read, so printing gigabytes cannot grow the grading process;
    - a kernel that dies (killed for memory, or a crash) costs only the cells that had not run: the cells before
      keep their outputs and grades, every later test cell gets an error (0 points), and grading goes on;
    - test cells keep no output that nbgrader would read as their score (an execute_result, a displayed number):
      a submission cannot set its own score or make nbgrader's bookkeeping fail;
    - graded tests never wait on demos: of a cell that is neither the instructor's setup (tagged `setup`), an answer
      nor a test, only the definitions run (imports, functions, classes, constants -- what the hidden tests see
      too), unless `run_demos`. Demos decide no points, and a student's own run of them is in their notebook;
    - the hidden tests decide the points (`hidden_tests`): they run after the kernel, in a sandboxed process of
      their own (ttlib.grading.hidden_tests), on the release's setup cells and the submission's definitions, with
      `exercise_cpu` CPU seconds an exercise; in the kernel they do nothing (TTLIB_GRADING=1). Each test cell keeps
      what it printed (stderr moved to stdout: a warning costs nothing) and gets the hidden tests' verdict;
    - a static scan of the student's own cells (ttlib.grading.scan) is stored in the notebook's metadata
      (`ttlib.flags`): `StudentTotals` and the feedback show it; it decides no points;
    - `sandbox` (Linux, see ttlib.grading.sandbox): the kernel runs in a scratch folder of its own, removed
      afterwards; it writes only there and reads only Python, ttlib and the datasets (Landlock); nothing it starts
      outlives it. Where the system lacks a piece, one warning per grading run says which guarantee does not hold.

    The environment variables TTLIB_GRADE_CELL_TIMEOUT, TTLIB_GRADE_NOTEBOOK_TIMEOUT, TTLIB_GRADE_EXERCISE_CPU (CPU
    seconds), TTLIB_GRADE_WALL_FACTOR and TTLIB_GRADE_MEMORY_GB override the configured values (handy for one run,
    and for the tests)."""

    notebook_timeout = Integer(600, help="CPU seconds a whole submission may use (kernel start included)").tag(
        config=True)
    wall_factor = Float(5.0, help="the clock's backstop: a cell or notebook may take this many times its CPU "
                                  "seconds on the clock").tag(config=True)
    memory_limit = Float(6 * 2**30, help="bytes of resident memory the kernel (and its children) may use").tag(
        config=True)
    memory_poll = Float(0.05, help="seconds between two looks at the kernel's memory").tag(config=True)
    output_limit = Integer(4 * 2**20, help="characters of output kept per cell").tag(config=True)
    notebook_output_limit = Integer(32 * 2**20, help="characters of output kept per notebook").tag(config=True)
    message_limit = Integer(32 * 2**20, help="bytes: a larger message from the kernel is refused").tag(config=True)
    file_size_limit = Integer(0, help="bytes: the largest file a submission may write (0: the memory limit; Ray "
                                      "sizes its object store file by the memory it may use)").tag(config=True)
    grader_memory_limit = Integer(512 * 2**20, help="bytes the grading process may grow by while it receives one "
                                                    "submission's output; past it the kernel is stopped").tag(
        config=True)
    sandbox = Bool(True, help="run each kernel in ttlib.grading.sandbox (Linux)").tag(config=True)
    threads = Integer(1, help="OpenMP/MKL threads in the kernel (OMP_NUM_THREADS): with one, CPU seconds measure "
                              "the work done, on any machine").tag(config=True)
    run_demos = Bool(False, help="run demo cells whole (default: only their definitions, as the hidden tests "
                                 "do)").tag(config=True)
    hidden_tests = Bool(True, help="decide the test cells of ttlib.exercises by their hidden tests, run in a "
                                   "process of their own").tag(config=True)
    exercise_cpu = Float(120.0, help="CPU seconds the hidden tests of one exercise may use").tag(config=True)
    iopub_timeout = Integer(120, help="seconds on the clock to wait for a cell's last output once the kernel has "
                                      "answered (nbclient waits 4: a busy machine delays it, and nbgrader then "
                                      "stops the notebook)").tag(config=True)
    strip_score_outputs = Bool(True, help="remove from test cells the outputs nbgrader reads as partial credit (this "
                                          "course gives none: a submission could set its own score)").tag(config=True)

    def __init__(self, **kwargs):
        kwargs.setdefault("kernel_manager_class", SandboxedKernelManager)
        super().__init__(**kwargs)

    def preprocess(self, nb, resources=None, km=None):
        import time

        from . import sandbox

        self._cell_limit = _env_number("TTLIB_GRADE_CELL_TIMEOUT", self.timeout)
        self._notebook_limit = _env_number("TTLIB_GRADE_NOTEBOOK_TIMEOUT", self.notebook_timeout)
        self._memory_bytes = _env_number("TTLIB_GRADE_MEMORY_GB", self.memory_limit / 2**30) * 2**30
        self._wall_factor = _env_number("TTLIB_GRADE_WALL_FACTOR", self.wall_factor)
        self._start = time.monotonic()
        self._wall_deadline = self._start + self._wall_factor * self._notebook_limit
        self._stopped = None  # why the remaining cells are not run (a message), once that happens
        self._notebook_output = 0
        self._cell_output, self._cell_noted, self._cell_cpu0 = 0, False, 0.0
        self._watchdog = None
        self._box_protected = []
        self._box = self._make_sandbox(resources or {}) if self.sandbox else None
        self.timeout_func = self._cell_timeout
        cap = (f"--IPKernelApp.exec_lines=__import__('ttlib.grading.sandbox').grading.sandbox.limit_kernel_output("
               f"{self.output_limit}, {self.notebook_output_limit})")  # the kernel drops its excess output itself
        self.extra_arguments = [*(a for a in self.extra_arguments if not a.startswith(cap[:40])), cap]
        sandbox.adopt_orphans()  # the second line: what escapes a sandbox comes to this process, and is ended below
        before = sandbox.own_children()
        student = ((resources or {}).get("nbgrader") or {}).get("student", "?")
        try:
            nb, resources = super().preprocess(nb, resources, km)
        finally:
            if self._watchdog is not None:
                self._watchdog.close()
            if self._box is not None:
                self._box.close()  # ends whatever is left of the kernel's tree, removes the scratch folder
            strays = sandbox.end_orphans(before)
            if strays:
                self.log.warning("ttlib: %s left %d process(es) behind; they were ended", student, len(strays))
            self.log.info("ttlib: %s ran in %.1f s of CPU time, %.1f s on the clock (limits: %g CPU s a cell, %g "
                          "in all, %s of memory)%s", student, self._cpu(), time.monotonic() - self._start,
                          self._cell_limit, self._notebook_limit, _gib(self._memory_bytes),
                          f"; {self._stopped}" if self._stopped else "")
        self._judge(nb, resources or {}, student)
        return nb, resources

    def _released(self, resources) -> str | None:
        """The path of the notebook as released to students (its setup cells are the instructor's), or None."""
        from nbgrader.coursedir import CourseDirectory

        info = resources.get("nbgrader") or {}
        if not info.get("assignment") or not info.get("notebook"):
            return None
        coursedir = CourseDirectory(config=self.config)
        for step in (coursedir.release_directory, coursedir.source_directory):
            path = os.path.join(coursedir.format_path(step, ".", info["assignment"]), f"{info['notebook']}.ipynb")
            if os.path.isfile(path):
                return path
        return None

    def _judge(self, nb, resources, student: str) -> None:
        """The hidden tests' verdicts on the test cells, and the scan's flags in the notebook's metadata."""
        from . import hidden_tests, sandbox, scan

        nb.metadata.pop("ttlib", None)  # only this run's findings, never what a submission wrote there
        released = self._released(resources)
        if released is None:
            self.log.warning("ttlib: %s: no released notebook found; the kernel's run decides the scores", student)
            return
        flags = [str(f) for f in scan.scan_notebook(nb, nbformat.read(released, as_version=4))]
        nb.metadata["ttlib"] = {"flags": flags}
        if flags:
            self.log.warning("ttlib: %s flagged for review: %s", student, "; ".join(flags))
        if not (self.hidden_tests and hidden_tests.hidden_exercises(nb)):
            return
        limits = sandbox.Limits(memory_bytes=self._memory_bytes, file_size_bytes=int(self.file_size_limit or
                                self._memory_bytes), output_bytes=16 * 2**20, threads=self.threads or None)
        run = hidden_tests.run_hidden(nb, released, limits=limits, protected=self._box_protected,
                                      exercise_cpu=_env_number("TTLIB_GRADE_EXERCISE_CPU", self.exercise_cpu))
        hidden_tests.apply_verdicts(nb, run.verdicts)
        failed = [g for g, verdict in run.verdicts.items() if verdict is not None]
        self.log.info("ttlib: %s's hidden tests: %d of %d passed, %.1f s of CPU time, %.1f s on the clock%s",
                      student, len(run.verdicts) - len(failed), len(run.verdicts), run.cpu_seconds, run.seconds,
                      "".join(f"; {note}" for note in run.notes))

    def _make_sandbox(self, resources):
        """A sandbox for this submission's kernel; None (with one warning per run) where the system has none."""
        from nbgrader.coursedir import CourseDirectory

        from . import sandbox

        caps = sandbox.capabilities()
        for missing in caps.missing():
            if missing not in _WARNED:
                _WARNED.add(missing)
                self.log.warning("ttlib sandbox: %s (see `ttlib grade doctor`)", missing)
        if not caps.sandboxed:
            return None
        protected = {os.getcwd(), CourseDirectory(config=self.config).root}
        path = (resources.get("metadata") or {}).get("path")
        if path:
            protected.add(path)
        db_url = (resources.get("nbgrader") or {}).get("db_url", "")
        if db_url.startswith("sqlite:///"):
            protected.add(os.path.dirname(db_url[len("sqlite:///"):]))
        self._box_protected = sorted(protected)
        student = (resources.get("nbgrader") or {}).get("student", "kernel")
        limits = sandbox.Limits(memory_bytes=self._memory_bytes,
                                file_size_bytes=int(self.file_size_limit or self._memory_bytes),
                                output_bytes=64 * 2**10, threads=self.threads or None)
        return sandbox.Sandbox(limits, protected=sorted(protected), name=re.sub(r"[^\w.-]", "_", student)[:40],
                               caps=caps)

    def create_kernel_manager(self):
        km = super().create_kernel_manager()
        if self._box is not None:
            km.sandbox = self._box
            km.connection_file = str(self._box.scratch / "kernel.json")
        return km

    async def async_start_new_kernel(self, **kwargs):
        from ..exercises import GRADING_ENV

        if self._box is not None:
            kwargs["cwd"] = str(self._box.scratch)
            kwargs["env"] = self._box.environment(kwargs.get("env"))
        if self.hidden_tests:  # the hidden tests run outside the kernel (see _judge), not in it
            kwargs["env"] = {**(kwargs.get("env") or os.environ), GRADING_ENV: "1"}
        import zmq

        self.km.context.setsockopt(zmq.MAXMSGSIZE, self.message_limit)  # every socket to this kernel
        return await super().async_start_new_kernel(**kwargs)

    async def async_start_new_kernel_client(self):
        """The kernel client, its shell channel polled in short steps (`poll_shell_in_steps`); each step also
        checks the CPU budgets: a cell over its CPU seconds is handled like nbclient's timeout (interrupted,
        CellTimeoutError)."""
        kc = await super().async_start_new_kernel_client()
        poll_shell_in_steps(kc, give_up=self._over_cpu_budget)
        return kc

    # nbclient's blocking versions wrap its own coroutines: wrap ours, or setup_kernel never calls them
    start_new_kernel = run_sync(async_start_new_kernel)
    start_new_kernel_client = run_sync(async_start_new_kernel_client)

    # -- the budgets
    def _cpu(self) -> float:
        return self._watchdog.usage.cpu_seconds if self._watchdog is not None else 0.0

    def _over_cpu_budget(self) -> bool:
        cpu = self._cpu()
        return cpu - self._cell_cpu0 >= self._cell_limit or cpu >= self._notebook_limit

    def _cell_timeout(self, cell) -> int:
        """nbclient's per-cell timeout: the clock's backstop (the CPU budgets end a cell sooner)."""
        import time

        left = self._wall_deadline - time.monotonic()
        return max(1, int(min(self._wall_factor * self._cell_limit, left)) + 1)

    def _start_watchdog(self) -> None:
        from . import sandbox

        pid = getattr(getattr(self.km, "provisioner", None), "pid", None)
        if pid is None or (self._watchdog is not None and self._watchdog.pid == pid):
            return
        # the guard's baseline, taken once the kernel has started: what starting it made the grader import (torch,
        # about 500 MiB, the first time) is not the kernel's output
        self._grader_memory = sandbox.own_memory()

        def grader_grows():  # messages the kernel sends faster than they are read pile up in this process
            if sandbox.own_memory() > self._grader_memory + self.grader_memory_limit:
                return "grader memory"
            return None

        if self._box is not None:  # the wrapper's tree: the kernel and everything it started
            self._watchdog = self._box.watch(pid, self.memory_poll, guard=grader_grows)
        else:  # no sandbox: the kernel itself and its children
            limits = sandbox.Limits(memory_bytes=self._memory_bytes, processes=None)
            self._watchdog = sandbox.Watchdog(pid, limits, self.memory_poll, include_root=True, guard=grader_grows)

    def _not_run(self, cell) -> None:
        if cell.cell_type == "code" and cell.metadata.get("nbgrader", {}).get("grade"):
            cell.outputs = [error_output("NotRun", f"this test cell was not run: {self._stopped}")]

    # -- output, as it arrives
    def process_message(self, msg, cell, cell_index):
        kind = msg.get("msg_type")
        if kind == "clear_output":
            self._cell_output = 0
        elif kind in ("stream", "display_data", "execute_result", "update_display_data", "error", "comm_open",
                      "comm_msg"):
            size = _size(msg.get("content"))
            self._cell_output += size
            self._notebook_output += size
            slack = 64 * 2**10  # the kernel drops its own excess first, with its note: this is the second line
            limit = None
            if self._cell_output > self.output_limit + slack:
                limit = f"{_mib(self.output_limit)} a cell"
            elif self._notebook_output > self.notebook_output_limit + slack:
                limit = f"{_mib(self.notebook_output_limit)} a notebook"
            if limit is not None:
                if kind == "error":  # an error keeps its name and message: it decides the cell's score
                    content = msg["content"]
                    content["evalue"] = str(content.get("evalue", ""))[:1000]
                    content["traceback"] = list(content.get("traceback", []))[-1:]
                    content["traceback"] = [line[:1000] for line in content["traceback"]]
                else:
                    if not self._cell_noted:
                        self._cell_noted = True
                        cell.outputs.append(nbformat.v4.new_output("stream", name="stdout",
                                                                   text=OUTPUT_NOTE.format(limit)))
                    return None
        return super().process_message(msg, cell, cell_index)

    def preprocess_cell(self, cell, resources, index):
        import time

        if self._stopped is None and cell.cell_type == "code" and cell.source.strip():
            if self._cpu() >= self._notebook_limit:
                self._stopped = (f"the notebook used up its {self._notebook_limit:g} CPU seconds for grading (a cell "
                                 "above ran too long)")
            elif time.monotonic() >= self._wall_deadline:
                self._stopped = (f"the notebook used up its {self._wall_factor * self._notebook_limit:g} s on the "
                                 "clock for grading (a cell above waited too long)")
        if self._stopped is not None:
            self._not_run(cell)
            return cell, self.resources
        self._start_watchdog()
        self._cell_output, self._cell_noted, self._cell_cpu0 = 0, False, self._cpu()
        source = cell.source
        if not (self.run_demos or _answer_test_or_setup(cell)):
            cell.source = _definitions(source)
            if not cell.source.strip():
                cell.source = source
                return cell, self.resources
        try:
            cell, resources = super().preprocess_cell(cell, resources, index)
        except DeadKernelError:
            dog = self._watchdog
            if dog is not None and dog.stopped == "memory":
                why = (f"it used {_gib(dog.over)} of memory, more than the {_gib(self._memory_bytes)} "
                       "allowed, and was stopped")
            elif dog is not None and dog.stopped == "grader memory":
                why = (f"its output grew the grading process by more than {_mib(self.grader_memory_limit)}, and "
                       "it was stopped")
            elif dog is not None and dog.stopped == "processes":
                why = f"it started more than {self._box.limits.processes} processes at once, and was stopped"
            else:
                why = "it crashed"
            self._stopped = f"the kernel died while running an earlier cell ({why})"
            cell.outputs = [error_output("KernelDied", f"the kernel died while running this cell: {why}. The cells "
                                                 "after it were not run.")]
            return cell, self.resources
        except CellTimeoutError as e:  # nbclient gave up waiting for the kernel's reply or output after a timeout
            if "IOPub" in str(e):
                why = (f"the kernel's output did not arrive within {self.iopub_timeout} s of its reply (a machine "
                       "too busy, or output still pouring out)")
                self._stopped = f"after an earlier cell, {why}"
            else:
                why = str(e).splitlines()[0] if str(e) else "timeout"
                self._stopped = "the kernel stopped answering after a cell ran too long"
            cell.outputs = [error_output("CellTimeoutError", why)]
            return cell, self.resources
        finally:
            cell.source = source
        if self.strip_score_outputs and cell.cell_type == "code" and cell.metadata.get("nbgrader", {}).get("grade"):
            kept = [o for o in cell.outputs if not _reads_as_score(o)]
            if len(kept) < len(cell.outputs):
                self.log.warning("ttlib: test cell %s had output nbgrader would read as its score; removed",
                                 cell.metadata["nbgrader"].get("grade_id"))
                cell.outputs = kept
        return cell, resources
