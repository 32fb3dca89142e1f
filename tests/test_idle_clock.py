"""Idle seconds: how the grader tells a submission that only sleeps from one that waits for a CPU on a busy machine
(ttlib.grading.processes), and what the clock's backstops do with them (ttlib.grading.execute). Real processes and a
real kernel; about half a minute in all."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from test_sandbox import gone_soon, mode, python  # noqa: F401 (mode: the fixture that runs a test twice)

from ttlib.grading import sandbox

pytestmark = pytest.mark.skipif(not sandbox.LINUX, reason="the sandbox is Linux's")
MARK = "ttlib-idle-clock-marker"  # not test_sandbox's: that file, run beside this one, looks for its own


def test_idle_seconds_count_a_sleeper_not_a_process_waiting_for_a_cpu():
    """Idle seconds (the clock's backstops count them) are time in which no thread of a tree ran or waited for a
    CPU: a process that sleeps is idle all along; one that computes beside more busy processes than the machine has
    cores -- it waits for a CPU much of the time -- is not."""
    if not sandbox.capabilities().idle_clock:
        pytest.fail("this test needs /proc/PID/task/TID/schedstat (CONFIG_SCHED_INFO)")
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2 * (os.cpu_count() or 2))]
    try:
        sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(4)"])
        busy = "import time; t = time.time()\nwhile time.time() - t < 4: pass"
        worker = subprocess.Popen([sys.executable, "-c", busy])
        dogs = [sandbox.Watchdog(p.pid, sandbox.Limits(), include_root=True) for p in (sleeper, worker)]
        start = time.monotonic()
        for p in (sleeper, worker):
            p.wait()
        wall = time.monotonic() - start
        for dog in dogs:
            dog.close()
        cpu = dogs[1].usage.cpu_seconds
    finally:
        for h in hogs:
            h.kill()
            h.wait()
    assert dogs[0].idle > 0.7 * wall, (dogs[0].idle, wall)
    assert dogs[1].idle < 0.15 * wall and cpu < 0.8 * wall, (dogs[1].idle, cpu, wall)  # it waited, it was not idle


@pytest.mark.usefixtures("mode")
def test_an_idle_limit_ends_a_sleeper():
    r = python("import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nwhile True: time.sleep(0.1)",
               sandbox.Limits(idle_seconds=2.0), mark=MARK)
    assert r.stopped == "idle" and r.wall_seconds < 20, r
    assert gone_soon(mark=MARK) == []


def test_a_cell_that_only_sleeps_is_stopped_at_its_idle_seconds_and_no_later_cell_runs():
    """A cell that sleeps and ignores interrupts holds the grader `cell_idle` seconds, then `interrupt_wait` more:
    the notebook goes no further (the hidden tests decide the points either way), and the cell says why."""
    import nbformat

    from ttlib.grading.execute import BoundedExecute

    sleeps = "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True:\n    time.sleep(0.2)"
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 1"), nbformat.v4.new_code_cell(sleeps),
                                         nbformat.v4.new_code_cell("print(x)")])
    for i in (1, 2):
        nb.cells[i].metadata["nbgrader"] = {"grade": True, "grade_id": f"t{i}", "points": 1}
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    start = time.monotonic()
    out, _ = BoundedExecute(hidden_tests=False, cell_idle=3, interrupt_wait=2).preprocess(nb, {})
    seconds = time.monotonic() - start
    assert [o.ename for o in out.cells[1].outputs if o.output_type == "error"] == ["CellTimeoutError"]
    assert "doing nothing" in out.cells[1].outputs[-1].evalue and "did not stop" in out.cells[1].outputs[-1].evalue
    assert [o.ename for o in out.cells[2].outputs] == ["NotRun"], out.cells[2].outputs
    assert out.metadata["ttlib"]["run"]["stopped"] and seconds < 60, (out.metadata["ttlib"], seconds)
