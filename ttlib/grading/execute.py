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
from dataclasses import dataclass

import nbformat
from nbclient.exceptions import CellTimeoutError, DeadKernelError
from nbclient.util import ensure_async, run_sync
from nbgrader.preprocessors import Execute
from traitlets import Bool, Float, Integer, List, Unicode

from ttlib.grading.kernels import SandboxedKernelManager
from ttlib.grading.nbrun import poll_shell_in_steps
from ttlib.grading.output import OutputCap, mib, reads_as_score

__all__ = ["BoundedExecute", "Budgets", "budgets", "error_output", "memory_limit"]


# ---- autograde: a bounded, contained run per submission ----------------------------------------------------------
def _gib(n_bytes: float) -> str:
    return f"{n_bytes / 2**30:.2f} GiB"


def error_output(ename: str, evalue: str):
    return nbformat.v4.new_output("error", ename=ename, evalue=evalue, traceback=[f"{ename}: {evalue}"])


def _env_number(name: str, default: float) -> float:
    value = os.environ.get(name)
    return float(value) if value not in (None, "") else default


_WARNED: set[str] = set()  # guarantees already reported missing in this grading run (one warning per run)


def _answer_test_or_setup(cell) -> bool:
    meta = cell.metadata.get("nbgrader", {})
    return bool(meta.get("solution") or meta.get("grade") or "setup" in cell.metadata.get("tags", []))


def _definitions(source: str) -> str:
    """The definitions of a demo cell (imports, functions, classes, constants) as source; '' when it has none or
    does not parse."""
    from ttlib.exercises.hidden import definitions

    module, _ = definitions(source)
    return ast.unparse(module) if module is not None and module.body else ""


@dataclass(frozen=True)
class Budgets:
    """A grading run's bounds: the configured values, or the environment's overrides (TTLIB_GRADE_...)."""
    cell_cpu: float  # CPU seconds a cell (CELL_TIMEOUT)
    notebook_cpu: float  # CPU seconds the whole kernel run (NOTEBOOK_TIMEOUT)
    exercise_cpu: float  # CPU seconds an exercise's hidden tests (EXERCISE_CPU)
    memory_bytes: float  # the kernel's tree, and the hidden tests' (MEMORY_GB)
    cell_idle: float  # idle seconds a cell (CELL_IDLE): on the clock, neither running nor waiting for a CPU
    notebook_idle: float  # idle seconds in all the kernel's cells (NOTEBOOK_IDLE)
    exercise_idle: float  # idle seconds an exercise's hidden tests, three times that to start (EXERCISE_IDLE)
    wall_factor: float  # the last backstop: the clock, this many times the CPU budgets (WALL_FACTOR)


def budgets(executor) -> Budgets:
    """The bounds a BoundedExecute (or one made from a configuration) grades with."""
    e = executor
    return Budgets(_env_number("TTLIB_GRADE_CELL_TIMEOUT", e.timeout),
                   _env_number("TTLIB_GRADE_NOTEBOOK_TIMEOUT", e.notebook_timeout),
                   _env_number("TTLIB_GRADE_EXERCISE_CPU", e.exercise_cpu),
                   _env_number("TTLIB_GRADE_MEMORY_GB", e.memory_limit / 2**30) * 2**30,
                   _env_number("TTLIB_GRADE_CELL_IDLE", e.cell_idle),
                   _env_number("TTLIB_GRADE_NOTEBOOK_IDLE", e.notebook_idle),
                   _env_number("TTLIB_GRADE_EXERCISE_IDLE", e.exercise_idle),
                   _env_number("TTLIB_GRADE_WALL_FACTOR", e.wall_factor))


def memory_limit(config) -> float:
    """Bytes of memory a submission may use under `config` (an nbgrader configuration) and the environment."""
    return budgets(BoundedExecute(config=config)).memory_bytes


class BoundedExecute(Execute):
    """nbgrader's `Execute`, with bounds a submission cannot escape, in a sandbox it cannot leave:

    - time, counted in CPU seconds of the kernel's whole process tree (so a correct submission is not cut short on
      a machine running other work): `timeout` per cell (as in nbgrader) and `notebook_timeout` for the whole
      notebook, kernel start included; each cell gets at most what is left of the notebook's time. A cell over
      its budget is interrupted; the next cells still run. A looping function that later cells call again, or a
      reply nbclient misses (jupyter/nbclient#312), cannot stretch a submission past these. A cell's last output is
      awaited `iopub_timeout` s on the clock after the kernel's reply (nbclient's 4 s, which nbgrader makes fatal,
      cost an honest submission on a busy machine all its points);
    - waiting, counted in idle seconds (ttlib.grading.processes: on the clock, no thread of the kernel's tree
      running or waiting for a CPU -- so a busy machine adds nothing): `cell_idle` a cell and `notebook_idle` in all
      its cells. A cell that sleeps is interrupted there and no later cell runs (the hidden tests, which decide the
      points, run anyway); a kernel that ignores the interrupt is given `interrupt_wait` seconds. Where Linux does
      not report idle time, the last backstop is the clock: `wall_factor` times the CPU budgets;
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

    The environment variables of `Budgets` override the configured values (handy for one run, and for the tests).
    The grading's own record -- CPU seconds, what stopped -- goes to the notebook's metadata (`ttlib.run`)."""

    notebook_timeout = Integer(600, help="CPU seconds a whole submission may use (kernel start included)").tag(
        config=True)
    wall_factor = Float(5.0, help="the clock's last backstop: a cell or notebook may take this many times its CPU "
                                  "seconds on the clock").tag(config=True)
    cell_idle = Float(60.0, help="idle seconds a cell may spend (neither running nor waiting for a CPU: it sleeps, "
                                 "or waits for what never comes); then it is interrupted and no later cell "
                                 "runs").tag(config=True)
    notebook_idle = Float(120.0, help="idle seconds all the kernel's cells together may spend").tag(config=True)
    exercise_idle = Float(20.0, help="idle seconds the hidden tests of one exercise may spend (three times that to "
                                     "start)").tag(config=True)
    interrupt_wait = Float(10.0, help="seconds on the clock a cell interrupted at a budget has to end before its "
                                      "kernel is given up").tag(config=True)
    protected_paths = List(Unicode(), help="more folders a submission's sandbox keeps out of reach (`ttlib grade "
                                           "autograde` adds the instructor's course folder)").tag(config=True)
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
    preload = Bool(True, help="fork each sandboxed kernel from a process that imported PyTorch, ttlib and IPython "
                              "once (ttlib.grading.zygote) rather than start it afresh").tag(config=True)
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
    challenge_cpu = Float(300.0, help="CPU seconds the challenge's agent file (notebook 10) may take to play its "
                                      "hidden episodes, and %BC's").tag(config=True)
    challenge_seed = Integer(0, help="the challenge's secret (its hidden episodes' seeds); 0: the course's own, made "
                                     "once in <course>/.ttlib/challenge-seed").tag(config=True)
    strip_score_outputs = Bool(True, help="remove from test cells the outputs nbgrader reads as partial credit (this "
                                          "course gives none: a submission could set its own score)").tag(config=True)

    def __init__(self, **kwargs):
        kwargs.setdefault("kernel_manager_class", SandboxedKernelManager)
        super().__init__(**kwargs)

    def preprocess(self, nb, resources=None, km=None):
        import time

        from ttlib.grading import sandbox, zygote

        b = self._budgets = budgets(self)
        self._start = time.monotonic()
        self._wall_deadline = self._start + b.wall_factor * b.notebook_cpu
        self._stopped = None  # why the remaining cells are not run (a message), once that happens
        self._stopping = None  # (kind, why) a cell is being stopped at a budget
        self._iopub_wait = self.iopub_timeout
        self._output = OutputCap(self.output_limit, self.notebook_output_limit)
        self._idle_before = 0.0  # idle seconds of the cells before this one
        self._cell_cpu0, self._cell_idle0 = 0.0, 0.0
        self._watchdog = None
        self._box_protected = []
        self._box = self._make_sandbox(resources or {}) if self.sandbox else None
        self.timeout_func = self._cell_timeout
        cap = (f"--IPKernelApp.exec_lines=__import__('ttlib.grading.output').grading.output.limit_kernel_output("
               f"{self.output_limit}, {self.notebook_output_limit})")  # the kernel drops its excess output itself
        self.extra_arguments = [*(a for a in self.extra_arguments if not a.startswith(cap[:40])), cap]
        sandbox.adopt_orphans()  # the second line: what escapes a sandbox comes to this process, and is ended below
        before = sandbox.own_children()
        student = ((resources or {}).get("nbgrader") or {}).get("student", "?")
        self._forked = None
        try:
            nb, resources = super().preprocess(nb, resources, km)
        finally:
            if self._watchdog is not None:
                self._watchdog.close()
            if self._box is not None:
                self._box.close()  # ends whatever is left of the kernel's tree, removes the scratch folder
            if self._forked is not None:
                self._forked.wait(30)  # reaped, and the zygote free for the hidden tests
            strays = sandbox.end_orphans(before | zygote.pids())  # (the zygote is ours, no submission's)
            if strays:
                self.log.warning("ttlib: %s left %d process(es) behind; they were ended", student, len(strays))
            self.log.info("ttlib: %s ran in %.1f s of CPU time, %.1f s on the clock, %.1f s idle in its cells (limits: "
                          "%g CPU s a cell, %g in all, %s of memory)%s", student, self._cpu(),
                          time.monotonic() - self._start, self._idle_before, b.cell_cpu, b.notebook_cpu,
                          _gib(b.memory_bytes), f"; {self._stopped}" if self._stopped else "")
        run = self._judge(nb, resources or {}, student)
        nb.metadata.setdefault("ttlib", {})["run"] = {
            "cpu": round(self._cpu(), 2), "seconds": round(time.monotonic() - self._start, 2),
            "hidden_cpu": round(run.cpu_seconds, 2) if run else 0.0, "hidden_seconds": round(run.seconds, 2) if run
            else 0.0, "stopped": [f"kernel: {self._stopped}"] * bool(self._stopped) + (run.notes if run else [])}
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

    def _judge(self, nb, resources, student: str):
        """The scan's flags, and the hidden tests' verdicts on the test cells (ttlib.grading.hidden_tests.judge)."""
        from ttlib.grading import challenge, hidden_tests, sandbox

        released, b = self._released(resources), self._budgets
        if released is None:
            nb.metadata.pop("ttlib", None)
            self.log.warning("ttlib: %s: no released notebook found; the kernel's run decides the scores", student)
            return None
        limits = sandbox.Limits(memory_bytes=b.memory_bytes, file_size_bytes=int(self.file_size_limit or
                                b.memory_bytes), output_bytes=16 * 2**20, threads=self.threads or None)
        run = hidden_tests.judge(nb, released, limits, self._box_protected, b.exercise_cpu,
                                 b.exercise_idle if sandbox.capabilities().idle_clock else None, self.hidden_tests)
        challenge.decide(nb, resources, self, limits,  # notebook 10's bands, by playing the agent handed in
                         _env_number("TTLIB_GRADE_CHALLENGE_CPU", self.challenge_cpu))
        flags = nb.metadata["ttlib"]["flags"]
        if flags:
            self.log.warning("ttlib: %s flagged for review: %s", student, "; ".join(flags))
        if run is not None:
            failed = [g for g, verdict in run.verdicts.items() if verdict is not None]
            self.log.info("ttlib: %s's hidden tests: %d of %d passed, %.1f s of CPU time, %.1f s on the clock%s",
                          student, len(run.verdicts) - len(failed), len(run.verdicts), run.cpu_seconds, run.seconds,
                          "".join(f"; {note}" for note in run.notes))
        return run

    def _make_sandbox(self, resources):
        """A sandbox for this submission's kernel; None (with one warning per run) where the system has none."""
        from nbgrader.coursedir import CourseDirectory

        from ttlib.grading import sandbox

        caps = sandbox.capabilities()
        for missing in caps.missing():
            if missing not in _WARNED:
                _WARNED.add(missing)
                self.log.warning("ttlib sandbox: %s (see `ttlib grade doctor`)", missing)
        if not caps.sandboxed:
            return None
        protected = {os.getcwd(), CourseDirectory(config=self.config).root, *self.protected_paths}
        path = (resources.get("metadata") or {}).get("path")
        if path:
            protected.add(path)
        db_url = (resources.get("nbgrader") or {}).get("db_url", "")
        if db_url.startswith("sqlite:///"):
            protected.add(os.path.dirname(db_url[len("sqlite:///"):]))
        self._box_protected = sorted(protected)
        student = (resources.get("nbgrader") or {}).get("student", "kernel")
        limits = sandbox.Limits(memory_bytes=self._budgets.memory_bytes,
                                file_size_bytes=int(self.file_size_limit or self._budgets.memory_bytes),
                                output_bytes=64 * 2**10, threads=self.threads or None)
        return sandbox.Sandbox(limits, protected=sorted(protected), name=re.sub(r"[^\w.-]", "_", student)[:40],
                               caps=caps)

    def create_kernel_manager(self):
        km = super().create_kernel_manager()
        if self._box is not None:
            km.sandbox, km.preload = self._box, self.preload
            km.connection_file = str(self._box.scratch / "kernel.json")
        return km

    async def async_start_new_kernel(self, **kwargs):
        from ttlib.exercises import GRADING_ENV

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
        checks the budgets: a cell over its CPU or idle seconds is handled like nbclient's timeout (interrupted)."""
        kc = await super().async_start_new_kernel_client()
        poll_shell_in_steps(kc, give_up=self._over_budget)
        return kc

    async def _async_handle_timeout(self, timeout, cell=None):
        """nbclient's timeout, here also a budget's end: interrupt the kernel, and give the cell an error saying why
        (a kernel that ignores the interrupt is waited for `interrupt_wait` seconds, not nbclient's output wait)."""
        kind, why = self._stopping or ("clock", f"it ran {timeout} s on the clock, the backstop")
        self._stopping = (kind, why)
        self.log.warning("ttlib: a cell was interrupted: %s", why)
        self.iopub_timeout = max(1, int(self.interrupt_wait))
        await ensure_async(self.km.interrupt_kernel())
        message = f"this cell was stopped: {why}"
        return {"content": {"status": "error", "ename": "CellTimeoutError", "evalue": message,
                            "traceback": [f"CellTimeoutError: {message}"]}}

    # nbclient's blocking versions wrap its own coroutines: wrap ours, or setup_kernel never calls them
    start_new_kernel = run_sync(async_start_new_kernel)
    start_new_kernel_client = run_sync(async_start_new_kernel_client)

    # -- the budgets
    def _cpu(self) -> float:
        return self._watchdog.usage.cpu_seconds if self._watchdog is not None else 0.0

    def _idle(self) -> float:
        return self._watchdog.idle if self._watchdog is not None else 0.0

    def _over_budget(self) -> bool:
        """Whether the running cell is over a budget (then `_stopping` says which, and why)."""
        b, cpu, idle = self._budgets, self._cpu(), self._idle() - self._cell_idle0
        ends = [("cpu", cpu - self._cell_cpu0 >= b.cell_cpu, f"it used its {b.cell_cpu:g} CPU seconds (does it "
                 "loop forever?)"),
                ("cpu", cpu >= b.notebook_cpu, f"the notebook used its {b.notebook_cpu:g} CPU seconds"),
                ("idle", idle >= b.cell_idle, f"it waited {b.cell_idle:g} s doing nothing (does it sleep, or wait "
                 "for something that never comes?)"),
                ("idle", self._idle_before + idle >= b.notebook_idle, f"the notebook's cells waited "
                 f"{b.notebook_idle:g} s in all doing nothing")]
        self._stopping = next(((kind, why) for kind, over, why in ends if over), None)
        return self._stopping is not None

    def _cell_timeout(self, cell) -> int:
        """nbclient's per-cell timeout: the clock's last backstop (the CPU and idle budgets end a cell sooner)."""
        import time

        left = self._wall_deadline - time.monotonic()
        return max(1, int(min(self._budgets.wall_factor * self._budgets.cell_cpu, left)) + 1)

    def _start_watchdog(self) -> None:
        from ttlib.grading import sandbox

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

        self._forked = getattr(self.km, "forked", None)
        if self._box is not None:  # the wrapper's tree: the kernel and everything it started
            self._watchdog = self._box.watch(pid, self.memory_poll, guard=grader_grows, forked=bool(self._forked))
        else:  # no sandbox: the kernel itself and its children
            limits = sandbox.Limits(memory_bytes=self._budgets.memory_bytes, processes=None)
            self._watchdog = sandbox.Watchdog(pid, limits, self.memory_poll, include_root=True, guard=grader_grows)

    def _not_run(self, cell) -> None:
        if cell.cell_type == "code" and cell.metadata.get("nbgrader", {}).get("grade"):
            cell.outputs = [error_output("NotRun", f"this test cell was not run: {self._stopped}")]

    # -- output, as it arrives
    def process_message(self, msg, cell, cell_index):
        if not self._output.admit(msg, cell):
            return None
        return super().process_message(msg, cell, cell_index)

    def _why_not_go_on(self) -> str | None:
        """Why no more cells run, once the whole notebook is over a budget."""
        import time

        b = self._budgets
        if self._cpu() >= b.notebook_cpu:
            return f"the notebook used up its {b.notebook_cpu:g} CPU seconds for grading (a cell above ran too long)"
        if self._idle_before >= b.notebook_idle:
            return f"the notebook's cells waited {b.notebook_idle:g} s in all doing nothing"
        if time.monotonic() >= self._wall_deadline:
            return (f"the notebook used up its {b.wall_factor * b.notebook_cpu:g} s on the clock for grading (a "
                    "cell above waited too long)")
        return None

    def preprocess_cell(self, cell, resources, index):
        if self._stopped is None and cell.cell_type == "code" and cell.source.strip():
            self._stopped = self._why_not_go_on()
        if self._stopped is not None:
            self._not_run(cell)
            return cell, self.resources
        self._start_watchdog()
        self._output.new_cell()
        self._cell_cpu0, self._cell_idle0 = self._cpu(), self._idle()
        self._stopping, self.iopub_timeout = None, self._iopub_wait
        source = cell.source
        if not (self.run_demos or _answer_test_or_setup(cell)):
            cell.source = _definitions(source)
            if not cell.source.strip():
                cell.source = source
                return cell, self.resources
        try:
            cell, resources = super().preprocess_cell(cell, resources, index)
        except DeadKernelError:
            self._stopped = f"the kernel died while running an earlier cell ({self._why_dead()})"
            cell.outputs = [error_output("KernelDied", f"the kernel died while running this cell: "
                                                       f"{self._why_dead()}. The cells after it were not run.")]
            return cell, self.resources
        except CellTimeoutError as e:  # nbclient gave up waiting for the kernel's output (after a timeout)
            why, self._stopped = self._why_no_output(e)
            cell.outputs = [error_output("CellTimeoutError", why)]
            return cell, self.resources
        finally:
            cell.source = source
            self._idle_before += self._idle() - self._cell_idle0
        if self._stopping is not None and self._stopping[0] != "cpu":  # it waited: so would the next cells
            self._stopped = f"an earlier cell was stopped: {self._stopping[1]}"
        if self.strip_score_outputs and cell.cell_type == "code" and cell.metadata.get("nbgrader", {}).get("grade"):
            kept = [o for o in cell.outputs if not reads_as_score(o)]
            if len(kept) < len(cell.outputs):
                self.log.warning("ttlib: test cell %s had output nbgrader would read as its score; removed",
                                 cell.metadata["nbgrader"].get("grade_id"))
                cell.outputs = kept
        return cell, resources

    def _why_dead(self) -> str:
        dog = self._watchdog
        if dog is not None and dog.stopped == "memory":
            return f"it used {_gib(dog.over)} of memory, more than the {_gib(self._budgets.memory_bytes)} allowed, " \
                   "and was stopped"
        if dog is not None and dog.stopped == "grader memory":
            return f"its output grew the grading process by more than {mib(self.grader_memory_limit)}, and it " \
                   "was stopped"
        if dog is not None and dog.stopped == "processes":
            return f"it started more than {self._box.limits.processes} processes at once, and was stopped"
        return "it crashed"

    def _why_no_output(self, error) -> tuple[str, str]:
        """(the cell's error message, why no later cell runs) when nbclient stopped waiting for a cell."""
        if self._stopping is not None:  # interrupted at a budget, and still busy after `interrupt_wait` s
            why = f"{self._stopping[1]}; it did not stop when interrupted"
            return why, f"an earlier cell was stopped: {why}"
        if "IOPub" in str(error):
            why = (f"the kernel's output did not arrive within {self.iopub_timeout} s of its reply (a machine too "
                   "busy, or output still pouring out)")
            return why, f"after an earlier cell, {why}"
        why = str(error).splitlines()[0] if str(error) else "timeout"
        return why, "the kernel stopped answering after a cell ran too long"
