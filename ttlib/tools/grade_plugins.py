"""nbgrader plugins of the course, named in nbgrader_config.py: what autograding and feedback do differently.

    BoundedExecute     autograde's executor: a time bound per cell and per submission, a memory bound per kernel,
                       a dead kernel costs only the tests that had not run
    OverwriteCells     puts test cells back as released, and warns only about cells a student edited
    StudentFeedback    feedback holds the student's own results: no hidden tests, no errors of demo cells
"""

from __future__ import annotations

import os
import re

import nbformat
from nbclient.exceptions import CellTimeoutError, DeadKernelError
from nbconvert.preprocessors import Preprocessor as _Preprocessor
from nbgrader.preprocessors import Execute
from nbgrader.preprocessors import OverwriteCells as _OverwriteCells
from traitlets import Float, Integer


# ---- autograde: a bounded run per submission ---------------------------------------------------------------------
def _gib(n_bytes: float) -> str:
    return f"{n_bytes / 2**30:.2f} GiB"


def _error(ename: str, evalue: str):
    return nbformat.v4.new_output("error", ename=ename, evalue=evalue, traceback=[f"{ename}: {evalue}"])


def _env_number(name: str, default: float) -> float:
    value = os.environ.get(name)
    return float(value) if value not in (None, "") else default


class BoundedExecute(Execute):
    """nbgrader's `Execute`, with three bounds a submission cannot escape:

    - `timeout` (seconds, per cell, as in nbgrader) and `notebook_timeout` (seconds for the whole notebook, kernel
      start included): each cell gets at most what is left of the notebook's time, so a looping function that later
      cells call again, or a reply nbclient misses (jupyter/nbclient#312), cannot stretch a submission past it;
    - `memory_limit` (bytes): the kernel and its child processes together; a watchdog kills the kernel when their
      resident memory exceeds it;
    - a kernel that dies (killed for memory, or a crash) costs only the cells that had not run: the cells before
      keep their outputs and grades, every later test cell gets an error (0 points), and grading goes on.

    The environment variables TTLIB_GRADE_CELL_TIMEOUT, TTLIB_GRADE_NOTEBOOK_TIMEOUT and TTLIB_GRADE_MEMORY_GB
    override the configured values (handy for one run, and for the tests)."""

    notebook_timeout = Integer(600, help="seconds a whole submission may take (kernel start included)").tag(
        config=True)
    memory_limit = Float(6 * 2**30, help="bytes of resident memory the kernel (and its children) may use").tag(
        config=True)
    memory_poll = Float(0.05, help="seconds between two looks at the kernel's memory").tag(config=True)

    def preprocess(self, nb, resources=None, km=None):
        import threading
        import time

        self._cell_limit = int(_env_number("TTLIB_GRADE_CELL_TIMEOUT", self.timeout))
        self._notebook_limit = int(_env_number("TTLIB_GRADE_NOTEBOOK_TIMEOUT", self.notebook_timeout))
        self._memory_bytes = _env_number("TTLIB_GRADE_MEMORY_GB", self.memory_limit / 2**30) * 2**30
        self._deadline = time.monotonic() + self._notebook_limit
        self._stopped = None  # why the remaining cells are not run (a message), once that happens
        self._memory_killed = None  # the memory the watchdog saw when it killed the kernel
        self._watchdog_done = threading.Event()
        self.timeout_func = self._cell_timeout
        start = time.monotonic()
        try:
            return super().preprocess(nb, resources, km)
        finally:
            self._watchdog_done.set()
            student = ((resources or {}).get("nbgrader") or {}).get("student", "?")
            self.log.info("ttlib: %s ran in %.1f s (limits: %d s a cell, %d s in all, %s of memory)%s", student,
                          time.monotonic() - start, self._cell_limit, self._notebook_limit, _gib(self._memory_bytes),
                          f"; {self._stopped}" if self._stopped else "")

    async def async_start_new_kernel_client(self):
        """The kernel client, with its shell channel polled in short steps. A cell that displays widgets sends comm
        messages on the shell socket while nbclient waits on it for the cell's reply, and that wait can miss the
        reply and sleep until the cell's whole timeout (jupyter/nbclient#312): a correct submission would lose
        minutes, or its later tests to the notebook's time bound. Polling again every second finds the reply."""
        import time
        from queue import Empty

        kc = await super().async_start_new_kernel_client()
        get_msg = kc.shell_channel.get_msg

        async def get_msg_in_steps(timeout=None):
            deadline = None if timeout is None else time.monotonic() + timeout
            while True:
                step = 1.0 if deadline is None else max(0.0, min(1.0, deadline - time.monotonic()))
                try:
                    return await get_msg(timeout=step)
                except Empty:
                    if deadline is not None and time.monotonic() >= deadline:
                        raise

        kc.shell_channel.get_msg = get_msg_in_steps
        return kc

    def _cell_timeout(self, cell) -> int:
        import time

        return max(1, min(self._cell_limit, int(self._deadline - time.monotonic()) + 1))

    def _watch_memory(self, pid: int) -> None:
        import psutil

        try:
            kernel = psutil.Process(pid)
        except psutil.Error:
            return
        while not self._watchdog_done.wait(self.memory_poll):
            try:
                family = [kernel, *kernel.children(recursive=True)]
                used = 0
                for p in family:
                    try:
                        used += p.memory_info().rss
                    except psutil.Error:
                        pass
                if used > self._memory_bytes:
                    self._memory_killed = used
                    for p in reversed(family):
                        try:
                            p.kill()
                        except psutil.Error:
                            pass
                    return
            except psutil.Error:  # the kernel is gone
                return

    def _start_watchdog(self) -> None:
        import threading

        pid = getattr(getattr(self.km, "provisioner", None), "pid", None)
        if pid is None or getattr(self, "_watched", None) == pid:
            return
        self._watched = pid
        threading.Thread(target=self._watch_memory, args=(pid,), daemon=True).start()

    def _not_run(self, cell) -> None:
        if cell.cell_type == "code" and cell.metadata.get("nbgrader", {}).get("grade"):
            cell.outputs = [_error("NotRun", f"this test cell was not run: {self._stopped}")]

    def preprocess_cell(self, cell, resources, index):
        import time

        if self._stopped is None and time.monotonic() >= self._deadline and cell.cell_type == "code" \
                and cell.source.strip():
            self._stopped = (f"the notebook used up its {self._notebook_limit} s for grading (a cell above ran "
                             "too long)")
        if self._stopped is not None:
            self._not_run(cell)
            return cell, self.resources
        self._start_watchdog()
        try:
            return super().preprocess_cell(cell, resources, index)
        except DeadKernelError:
            if self._memory_killed is not None:
                why = (f"it used {_gib(self._memory_killed)} of memory, more than the {_gib(self._memory_bytes)} "
                       "allowed, and was stopped")
            else:
                why = "it crashed"
            self._stopped = f"the kernel died while running an earlier cell ({why})"
            cell.outputs = [_error("KernelDied", f"the kernel died while running this cell: {why}. The cells "
                                                 "after it were not run.")]
            return cell, self.resources
        except CellTimeoutError as e:  # nbclient gave up waiting for the kernel's output after a timeout
            self._stopped = "the kernel stopped answering after a cell ran too long"
            cell.outputs = [_error("CellTimeoutError", str(e).splitlines()[0] if str(e) else "timeout")]
            return cell, self.resources


# ---- autograde's log: say "edited" only when a student edited a test cell ----------------------------------------
class OverwriteCells(_OverwriteCells):
    """nbgrader's OverwriteCells (puts every test cell back as the instructor wrote it, hidden tests included), with
    a log that means something. nbgrader compares each test cell with the instructor's version, which holds the
    hidden tests the student version lacks, so it warns "Attribute 'checksum' ... has changed!" for every test cell
    of every student. Here a test cell as released is put back quietly (debug level); one the student edited gets a
    warning that says so. `ttlib grade collect` and the `flagged` column of StudentTotals report the same cells."""

    def preprocess_cell(self, cell, resources, cell_index):
        self._as_released = cell.metadata.get("nbgrader", {}).get("checksum")  # what release wrote into it
        return super().preprocess_cell(cell, resources, cell_index)

    def report_change(self, name, attr, old, new) -> None:
        if attr != "checksum":
            return super().report_change(name, attr, old, new)
        if new == self._as_released:
            self.log.debug("test cell %s as released: hidden tests put back", name)
        else:
            self.log.warning("test cell %s was edited by the student: put back as released (see `ttlib grade "
                             "collect`)", name)


# ---- generate_feedback: what a student sees is theirs -------------------------------------------------------------
HIDDEN_TESTS = re.compile(r"^[ \t]*### BEGIN HIDDEN TESTS.*?^[ \t]*### END HIDDEN TESTS[^\n]*\n?", re.M | re.S)
ANSI = re.compile(r"\x1b\[[0-9;]*m")
CELL_FRAME = re.compile(r"Cell In\s*\[(\d+)\]")


class StudentFeedback(_Preprocessor):
    """generate_feedback's view of an autograded notebook, for the student:
    - test cells show what the student version showed: the hidden tests' source is left out, and so are the
      traceback lines of the test cell itself (they quote it); the message of a failure stays, and so do the lines
      of the student's own code it went through;
    - errors in cells that are neither an exercise nor a test (demos that ran during grading) are left out: they
      cost no points and need not be the student's doing."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.enabled = True  # nbconvert's preprocessors are off unless enabled; nbgrader's are on

    def preprocess(self, nb, resources):
        own = {c.get("execution_count") for c in nb.cells
               if c.cell_type == "code" and c.metadata.get("nbgrader", {}).get("solution")} - {None}
        for cell in nb.cells:
            if cell.cell_type != "code":
                continue
            meta = cell.metadata.get("nbgrader", {})
            if meta.get("grade"):
                cell.source = HIDDEN_TESTS.sub("# (hidden tests: not shown)\n", cell.source)
                for output in cell.outputs:
                    if output.output_type == "error":
                        output.traceback = self._own_frames(output.traceback, own)
            elif not meta.get("solution"):
                cell.outputs = [o for o in cell.outputs if o.output_type != "error"]
        return nb, resources

    @staticmethod
    def _own_frames(traceback: list[str], own: set[int]) -> list[str]:
        """The last line (the message) and the frames in the student's own exercise cells."""
        if not traceback:
            return traceback
        keep = []
        for entry in traceback[:-1]:
            frame = CELL_FRAME.search(ANSI.sub("", entry))
            if frame and int(frame.group(1)) in own:
                keep.append(entry)
        return keep + traceback[-1:]
