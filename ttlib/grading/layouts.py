"""Where a run of `ttlib grade autograde` grades its submissions (ttlib.grading.autograde): in a pool of processes on
this machine, forked from a fork server that imported the libraries once (`pool_context`, ttlib.grading.pool_preload),
or in tasks on a Ray cluster's workers. Either way each submission is graded by ttlib.grading.worker.grade_one, and
one lost with its process is started again, up to MAX_ATTEMPTS times.

    for submission, graded in on_this_machine(todo, jobs=4): ...      graded: a Graded, or the exception
    for submission, graded in on_ray(todo, "10.0.0.5:6379", memory_bytes, jobs=None): ...
"""

from __future__ import annotations

import functools
import os
from typing import TYPE_CHECKING

from ttlib.grading.worker import grade_one, worker_started

if TYPE_CHECKING:
    from ttlib.grading.autograde import Submission

__all__ = ["CRASH_ENV", "MAX_ATTEMPTS", "WORKER_BYTES", "default_jobs", "on_ray", "on_this_machine", "pool_context"]

MAX_ATTEMPTS = 3  # times a submission is started when its worker is lost
WORKER_BYTES = 2**30  # what a grading process holds beside its submission's kernel (nbgrader, torch, the judge)
CRASH_ENV = "TTLIB_GRADE_CRASH"  # tests: "student:seconds:marker" loses that student's first worker mid-grading


def default_jobs(memory_bytes: float) -> int:
    """What this machine holds now: its free cores (cores less the load), and its available memory at
    `memory_bytes` a submission (beside a grading process's own)."""
    import psutil

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    free = int(cores - os.getloadavg()[0] + 0.5) if hasattr(os, "getloadavg") else cores
    by_memory = int(psutil.virtual_memory().available // (memory_bytes + WORKER_BYTES))
    return max(1, min(free, by_memory))


def _crash_for(student: str):
    """The test hook of CRASH_ENV, for this student: (seconds, marker) or None."""
    spec = os.environ.get(CRASH_ENV, "")
    who, _, rest = spec.partition(":")
    seconds, _, marker = rest.partition(":")
    return (float(seconds), marker) if spec and who == student else None


def _start_in_pool(pool, s: Submission):
    """The submission started in the pool: its future. When the pool cannot start a process (the fork server it
    forks them from is gone, killed), a future that failed as a lost process's does, so the run treats it alike."""
    from concurrent.futures import Future
    from concurrent.futures.process import BrokenProcessPool

    try:
        return pool.submit(grade_one, s.shared, s.student, s.files, _crash_for(s.student))
    except (EOFError, OSError) as e:
        failed = Future()
        failed.set_exception(BrokenProcessPool(f"the pool could not start a process: {e!r}"))
        return failed


def _start_on_ray(task, refs: dict, s: Submission):
    return task.remote(refs[id(s.shared)], s.student, s.files, _crash_for(s.student))


def _fill(queue, pending: dict, n: int, start, attempts: dict | None = None) -> None:
    """Start submissions from `queue` until `n` are in flight (`pending`: {future: submission})."""
    while queue and len(pending) < n:
        s = queue.popleft()
        if attempts is not None:
            attempts[id(s)] += 1
        pending[start(s)] = s


def pool_context():
    """How this machine's pool processes start: forked from a fork server that has imported what grading needs
    once (ttlib.grading.pool_preload), where the platform has one; started afresh elsewhere. Never forked from this
    process, which may run threads. (A fork server keeps the environment this process had when it started.)"""
    import multiprocessing

    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["ttlib.grading.pool_preload"])
    return context


def on_this_machine(todo: list[Submission], jobs: int):
    """Grade `todo` in a pool of `jobs` processes, `jobs` at a time; yields (submission, Graded or the exception) as
    each ends. A process lost mid-grading breaks the pool, and so does a fork server lost (no process can start):
    the submissions in flight, or starting, start again in a new one, up to MAX_ATTEMPTS times each."""
    from collections import deque
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
    from concurrent.futures.process import BrokenProcessPool

    attempts = {id(s): 0 for s in todo}
    queue = deque(todo)
    while queue:
        pool = ProcessPoolExecutor(min(jobs, len(queue)), mp_context=pool_context(), initializer=worker_started)
        pending, lost = {}, []
        start = functools.partial(_start_in_pool, pool)
        try:
            _fill(queue, pending, jobs, start, attempts)
            while pending and not lost:
                done, _ = wait(pending, return_when=FIRST_COMPLETED)
                results = []
                for future in done:
                    s = pending.pop(future)
                    try:
                        results.append((s, future.result()))
                    except BrokenProcessPool:
                        lost.append(s)
                    except Exception as e:  # noqa: BLE001 (a bug in grading: this submission fails, others go on)
                        results.append((s, e))
                if not lost:
                    _fill(queue, pending, jobs, start, attempts)  # before the results are booked: none waits
                yield from results
        finally:
            pool.shutdown(wait=False, cancel_futures=True)
        lost += list(pending.values())  # in flight when the pool broke
        for s in sorted(lost, key=lambda s: (s.assignment, s.student), reverse=True):
            if attempts[id(s)] < MAX_ATTEMPTS:
                queue.appendleft(s)
            else:
                yield s, RuntimeError(f"its grading process was lost, or could not start, {MAX_ATTEMPTS} times")


def on_ray(todo: list[Submission], address: str, memory_bytes: float, jobs: int | None):
    """Grade `todo` in tasks on a Ray cluster's workers (a CPU and the submission's memory each); yields
    (submission, Graded or the exception) as each ends. Ray starts a task again when its worker is lost."""
    from collections import deque

    from ttlib.evaluation.ray_cluster import DistributedError, connect

    ray, started = connect(address, ship_code=False)
    try:
        need = memory_bytes + WORKER_BYTES
        biggest = max((n["Resources"].get("memory", 0.0) for n in ray.nodes() if n.get("Alive")), default=0.0)
        if biggest < need:
            raise DistributedError(f"no node of the Ray cluster at {address} offers the {need / 2**30:.1f} GiB of "
                                   f"memory a submission may use (the largest offers {biggest / 2**30:.1f} GiB): lower "
                                   "BoundedExecute.memory_limit, or add larger nodes")
        task = ray.remote(grade_one).options(num_cpus=1, memory=int(need), max_retries=MAX_ATTEMPTS - 1)
        refs = {}  # one copy of each assignment's shared part in the object store
        for s in todo:
            refs.setdefault(id(s.shared), ray.put(s.shared))
        window = jobs or max(2, 2 * int(ray.cluster_resources().get("CPU", 1)))
        queue, pending = deque(todo), {}
        start = functools.partial(_start_on_ray, task, refs)
        _fill(queue, pending, window, start)
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            for ref in ready:
                s = pending.pop(ref)
                try:
                    result = ray.get(ref)
                except Exception as e:  # noqa: BLE001 (a task that failed for good: this submission only)
                    result = e
                _fill(queue, pending, window, start)  # before the result is booked: no worker waits for it
                yield s, result
    finally:
        if started:
            ray.shutdown()
