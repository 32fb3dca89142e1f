"""How many threads torch should use on a machine that other work shares.

PyTorch runs an operation on all physical cores at once, and the threads meet at a barrier after every parallel
region. When another program keeps one of those cores busy, every region waits for the thread that is not
getting its turn: on this course's 2-core machine with other work running, one plan of the course planner took
68 s with 2 threads and 6 s with 1 (same plan, same machine, one after the other). A learner's laptop with a browser
and a video call is such a machine.

`fit()` sets torch's thread count to the cores the other programs leave free (at least one), and leaves it alone
when the user chose one: OMP_NUM_THREADS in the environment, or `fit(threads)` with a number. The thread count is
the whole process's, so only what starts a process calls it: the `ttlib` command (once per command that computes),
a notebook's first cell, and the worker processes ttlib starts itself. Library functions leave it as they find it
(tests/test_structure.py checks).

`timed(fn)` measures what a speedup claim compares in a way load does not distort: CPU time on one thread.
"""

from __future__ import annotations

import os
import time

import torch

__all__ = ["fit", "free_cores", "timed"]

_state = {"default": None, "fixed": None, "me": None}


def _default_threads() -> int:
    if _state["default"] is None:
        _state["default"] = torch.get_num_threads()  # what torch chose for this machine (its physical cores)
    return _state["default"]


def free_cores(interval: float | None = 0.25) -> int:
    """The cores other processes leave free (at least 1), measured over `interval` seconds, or since the last
    measurement with `interval=None` (no waiting). Without psutil (it comes with JupyterLab and Colab), every core
    counts as free."""
    try:
        import psutil
    except ImportError:
        return os.cpu_count() or 1
    if _state["me"] is None:
        _state["me"], interval = psutil.Process(), interval or 0.25  # the first measurement needs an interval
        _state["me"].cpu_percent(None)
        psutil.cpu_percent(None)
    if interval:
        time.sleep(interval)
    busy = psutil.cpu_percent(None)  # the whole machine since the last call, in % of all its cores
    mine = _state["me"].cpu_percent(None)  # this process (all its threads), in % of one core
    cores = psutil.cpu_count() or 1
    others = max(0.0, busy * cores / 100 - mine / 100)  # in cores
    return max(1, cores - int(round(others)))


def fit(threads: int | None = None, interval: float | None = 0.25) -> int:
    """Set torch's threads: `threads` if given (and kept from then on), OMP_NUM_THREADS if set, else as many as
    the cores others leave free, up to torch's default. Returns the count."""
    if threads is not None:
        _state["fixed"] = int(threads)
    if _state["fixed"] is not None or os.environ.get("OMP_NUM_THREADS"):
        count = _state["fixed"] or torch.get_num_threads()
    else:
        count = min(_default_threads(), free_cores(interval))
    if count != torch.get_num_threads():
        torch.set_num_threads(count)
    return count


def timed(fn, device=None):
    """(seconds, fn()) measured so that other programs on the machine do not distort it: on the CPU, the CPU time of
    this thread with torch on one thread (time another process takes from this one is not counted; the speedups
    the notebooks assert compare such times); on a GPU, the wall-clock time between synchronisations."""
    if device is not None and torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)
        start = time.perf_counter()
        result = fn()
        torch.cuda.synchronize(device)
        return time.perf_counter() - start, result
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        start = time.thread_time()
        result = fn()
        return time.thread_time() - start, result
    finally:
        torch.set_num_threads(before)
