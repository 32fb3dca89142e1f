"""Process trees: what they use (CPU seconds, memory, processes), ending them, and a thread that holds one to its
limits. The grader's side of the sandbox: it reads /proc, it never runs inside one.

    tree_usage(pid) -> Usage           CPU seconds, resident memory and process count of pid's descendants
    end_tree(pid, grace)               SIGTERM (when grace > 0), then SIGKILL to every descendant, then pid
    adopt_orphans(), end_orphans(keep) the grader as a second line: a subreaper itself, ending after each
                                       submission every child it did not have before (orphans that escaped)
    Limits(...)                        memory (bytes, over the whole tree), CPU seconds (the whole tree, reaped
                                       children included), wall seconds, file size, output, processes
    Watchdog(pid, limits)              a thread over the tree of `pid`: usage, peak memory, idle seconds; kills
                                       the whole tree past a limit and says which (.stopped)

Idle seconds are the clock's seconds in which no thread of the tree ran or waited for a CPU: what a process that
sleeps, or waits for something that never comes, spends -- and what a busy machine does not add to (time spent
waiting for a CPU is not idle). They are read from /proc/PID/task/TID/schedstat (CONFIG_SCHED_INFO, on in common
kernels); where that is missing, `IDLE_CLOCK` is False and nothing is counted idle.

Processes are found through /proc/PID/task/TID/children (CONFIG_PROC_CHILDREN), or by reading every
/proc/PID/stat without it; elsewhere than Linux, through psutil.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import threading
import time

from ttlib.grading.linux import IDLE_CLOCK, LINUX, PR_SET_CHILD_SUBREAPER, capabilities, prctl

__all__ = ["Limits", "Usage", "Watchdog", "adopt_orphans", "busy_threads", "children_of", "descendants", "end_orphans",
           "end_tree", "is_alive", "own_children", "own_memory", "signal_all", "started", "tree_usage"]


# ---- a process tree: what it uses, and ending it ------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Usage:
    cpu_seconds: float  # user + system time of every descendant, alive or reaped
    memory_bytes: int  # resident memory of the live descendants together
    processes: int  # live descendants


_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name (field 3, the state, first), or None if gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read().decode(errors="replace")
    except OSError:
        return None
    return text[text.rfind(")") + 2:].split()


def children_of(pid: int) -> list[int]:
    """The pids of `pid`'s direct children (every thread's), from /proc."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    out = []
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out += [int(c) for c in f.read().split()]
        except OSError:
            pass
    return out


_HAS_CHILDREN_FILE = LINUX and os.path.exists(f"/proc/{os.getpid()}/task/{os.getpid()}/children")


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (children first), zombies included."""
    if not LINUX:
        import psutil

        try:
            return [p.pid for p in psutil.Process(pid).children(recursive=True)]
        except psutil.Error:
            return []
    if _HAS_CHILDREN_FILE:
        out, todo = [], children_of(pid)
        while todo:
            out += todo
            todo = [c for p in todo for c in children_of(p)]
        return out
    parents: dict[int, list[int]] = {}  # no /proc/PID/task/TID/children (CONFIG_PROC_CHILDREN): read every stat
    for name in os.listdir("/proc"):
        if name.isdigit() and (fields := _stat(int(name))) is not None:
            parents.setdefault(int(fields[1]), []).append(int(name))
    out, todo = [], parents.get(pid, [])
    while todo:
        out += todo
        todo = [c for p in todo for c in parents.get(p, [])]
    return out


def tree_usage(pid: int, include_root: bool = False, children_memory: bool = True) -> Usage | None:
    """CPU time, memory and process count of everything below `pid` (and of `pid` itself with `include_root`; not
    by default: `pid` is the wrapper): the live descendants' own and reaped-children times, plus the times of the
    children `pid` reaped (the wrapper, a subreaper, reaps orphans: their time stays counted). Without
    `children_memory`, the memory of `pid`'s own children is left out (a wrapper forked from the zygote: its one
    child is the PID namespace's init, a copy of the zygote until it execs a small supervisor). None when `pid` is
    gone."""
    if not LINUX:
        import psutil

        try:
            root = psutil.Process(pid)
            times = root.cpu_times()
            cpu = 0.0 if include_root else times.children_user + times.children_system
            rss, n = 0, 0
            for p in [root] * include_root + root.children(recursive=True):
                try:
                    t = p.cpu_times()
                    cpu += t.user + t.system + t.children_user + t.children_system
                    rss += p.memory_info().rss
                    n += 1
                except psutil.Error:
                    pass
            return Usage(cpu, rss, n)
        except psutil.Error:
            return None
    root = _stat(pid)  # read the root's reaped-children times first: a child reaped meanwhile is missed once, never
    if root is None:  # counted twice
        return None
    ticks = 0 if include_root else int(root[13]) + int(root[14])  # with include_root: counted below
    pages, n = 0, 0
    for child in [pid] * include_root + descendants(pid):
        fields = _stat(child)
        if fields is None:
            continue
        ticks += sum(int(x) for x in fields[11:15])  # utime stime cutime cstime
        if fields[0] not in "ZX":
            pages += int(fields[21]) if children_memory or int(fields[1]) != pid else 0
            n += 1
    return Usage(ticks / _TICK, pages * _PAGE, n)


def busy_threads(pids) -> dict[int, float]:
    """{thread id: seconds it ran or waited for a CPU since it started} of every thread of `pids` (schedstat's first
    two fields)."""
    out = {}
    for pid in pids:
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                    ran, waited = f.read().split()[:2]
                out[int(tid)] = (int(ran) + int(waited)) / 1e9
            except (OSError, ValueError):
                pass
    return out


def is_alive(pid: int) -> bool:
    """Is `pid` running (a zombie is not)?"""
    fields = _stat(pid) if LINUX else None
    if LINUX:
        return fields is not None and fields[0] not in "ZX"
    try:
        os.kill(pid, 0)
        return True
    except OSError:
        return False


def signal_all(pids, sig) -> None:
    """Send `sig` to every pid that is still there."""
    for p in pids:
        try:
            os.kill(p, sig)
        except OSError:
            pass


def started(pid: int) -> int | None:
    """When `pid` started (clock ticks after boot): with its pid, it names one process, even after pid reuse."""
    fields = _stat(pid) if LINUX else None
    return int(fields[19]) if fields else None


def end_tree(pid: int, grace: float = 0.0, start: int | None = None) -> None:
    """End every process below `pid`, then `pid` itself: SIGTERM first when `grace` > 0 (and up to `grace` seconds
    for them to go), then SIGKILL, again until none is left (a process forking meanwhile is caught next round).
    With `start` (see started()), nothing is done when `pid` is now another process. The caller reaps `pid` if it
    is its child."""
    if start is not None and started(pid) != start:
        return
    if grace > 0:
        signal_all([pid, *descendants(pid)], signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and (is_alive(pid) or any(is_alive(p) for p in descendants(pid))):
            time.sleep(0.02)
    for _ in range(200):
        alive = [p for p in descendants(pid) if is_alive(p)]
        if not alive:
            break
        signal_all(alive, signal.SIGKILL)
        time.sleep(0.005)
    signal_all([pid], signal.SIGKILL)


def adopt_orphans() -> bool:
    """Make this process a child subreaper: a process that a child of ours leaves behind (setsid, double fork)
    becomes our child instead of init's, where end_orphans finds it. False where Linux does not offer it."""
    if not capabilities().subreaper:
        return False
    try:
        prctl(PR_SET_CHILD_SUBREAPER, 1)
        return True
    except OSError:
        return False


def end_orphans(keep: set[int]) -> list[int]:
    """SIGKILL every child of this process (and its descendants) whose pid is not in `keep` (the children it had
    before), reap them, and return their pids: what a sandbox left behind when its wrapper was killed first."""
    if not LINUX:
        return []
    me = os.getpid()
    strays = [p for p in children_of(me) if p not in keep]
    for p in strays:
        end_tree(p)
    for p in strays:
        for _ in range(100):
            try:
                if os.waitpid(p, os.WNOHANG)[0]:
                    break
            except ChildProcessError:
                break
            time.sleep(0.01)
    return strays


def own_memory() -> int:
    """Resident memory of this process, in bytes."""
    if LINUX:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * _PAGE
    import psutil

    return psutil.Process().memory_info().rss


def own_children() -> set[int]:
    return set(children_of(os.getpid())) if LINUX else set()


# ---- limits, and the thread that holds a tree to them --------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Limits:
    memory_bytes: float | None = 6 * 2**30  # resident memory of the whole tree; past it the tree is killed
    cpu_seconds: float | None = None  # CPU time of the whole tree (reaped children included); None: no limit
    wall_seconds: float | None = None  # seconds on the clock; None: no limit
    idle_seconds: float | None = None  # idle seconds of the tree (sleeping, blocked; see the docstring); None: none
    file_size_bytes: int = 2**30  # the largest file a process may write (RLIMIT_FSIZE)
    output_bytes: int = 2**20  # stdout and stderr each: what the wrapper forwards (run() keeps)
    processes: int | None = 1024  # live processes in the tree; past it the tree is killed (a fork bomb)
    threads: int | None = 1  # OMP/MKL/torch threads inside (CPU time is then about the time on the clock)


@dataclasses.dataclass
class Watchdog:
    """A thread that looks at the tree below `pid` every `poll` seconds: `usage` is the latest look, `peak_memory`
    the most memory seen, `idle` the idle seconds so far (see the module's docstring; updated every `idle_every`
    seconds); past a limit it kills the whole tree and `stopped` says which limit ("memory", "cpu time", "wall time",
    "idle", "processes")."""

    pid: int
    limits: Limits
    poll: float = 0.05
    include_root: bool = False  # count `pid` itself (when it is the command, not the wrapper)
    guard: object = None  # a function called at each look: a reason (str) to end the tree now, or None
    usage: Usage = Usage(0.0, 0, 0)
    peak_memory: int = 0
    stopped: str | None = None
    over: float = 0.0  # the value that crossed the limit
    idle: float = 0.0  # idle seconds of the tree so far
    idle_every: float = 0.5
    children_memory: bool = True  # count the memory of `pid`'s own children (see tree_usage)

    def __post_init__(self):
        self.started = started(self.pid)  # who `pid` is: end_tree leaves a later process with that pid alone
        self._done = threading.Event()
        self._start = time.monotonic()
        self._busy: dict[int, float] = {}  # thread id -> its busy seconds at the last look
        self._idle_look = self._start
        self._thread = threading.Thread(target=self._watch, name=f"sandbox-watchdog-{self.pid}", daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        limits = self.limits
        while not self._done.is_set():
            usage = tree_usage(self.pid, self.include_root, self.children_memory)
            if usage is None:
                return
            self.usage = dataclasses.replace(usage, cpu_seconds=max(usage.cpu_seconds, self.usage.cpu_seconds))
            self.peak_memory = max(self.peak_memory, usage.memory_bytes)
            if IDLE_CLOCK and time.monotonic() - self._idle_look >= self.idle_every:
                self._look_idle()
            checks = [("memory", usage.memory_bytes, limits.memory_bytes),
                      ("cpu time", self.usage.cpu_seconds, limits.cpu_seconds),
                      ("wall time", time.monotonic() - self._start, limits.wall_seconds),
                      ("idle", self.idle, limits.idle_seconds),
                      ("processes", usage.processes, limits.processes)]
            for name, value, limit in checks:
                if limit is not None and value > limit:
                    self.stopped, self.over = name, value
                    end_tree(self.pid, start=self.started)
                    return
            reason = self.guard() if self.guard is not None else None
            if reason:
                self.stopped = reason
                end_tree(self.pid, start=self.started)
                return
            self._done.wait(self.poll)

    def _look_idle(self) -> None:
        """Add the seconds since the last look in which the tree's threads together ran or waited for a CPU less
        than the clock did (a thread that ended since keeps what it had; a new one counts from its start)."""
        now = time.monotonic()
        busy = busy_threads([self.pid] * self.include_root + descendants(self.pid))
        added = sum(seconds - self._busy.get(tid, 0.0) if seconds >= self._busy.get(tid, 0.0) else seconds
                    for tid, seconds in busy.items())  # (a smaller value: a new thread with the same id)
        self.idle += max(0.0, (now - self._idle_look) - added)
        self._busy.update(busy)
        self._idle_look = now

    def close(self) -> None:
        self._done.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

