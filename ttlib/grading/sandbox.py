"""Run code you do not trust (a student's Jupyter kernel, a test runner) in a space of its own, with what Linux
gives an ordinary user: no root, no daemon, no container.

    python -m ttlib.grading.sandbox --scratch DIR [--read PATH]... [options] -- ARGV...
    python -m ttlib.grading.sandbox --doctor          what holds on this machine (also `ttlib grade doctor`)

The wrapper process (the first line) makes itself a child subreaper, so every descendant stays in its tree however
it was started (`setsid`, a double fork); it starts ARGV in the scratch folder with stdin from /dev/null and its
stdout and stderr through pipes it forwards, capped; and when ARGV ends, or the wrapper is asked to stop (SIGTERM,
or its parent dies), it ends every descendant: SIGTERM, a grace period, then SIGKILL. Before ARGV starts:
- rlimits: files at most --file-size bytes (RLIMIT_FSIZE), no core dumps;
- Landlock (Linux >= 5.13; ABI 1 to 7, Linux 5.13 to 6.15): ARGV and everything it starts may write only beneath
  the scratch folder and /dev/shm (and to /dev/null, /dev/zero, ...) and read only beneath --read paths; with ABI
  >= 4 (Linux 6.7) TCP can be limited to given ports (--tcp-ports), with ABI >= 6 (Linux 6.12) it cannot signal
  processes outside the sandbox nor reach abstract Unix sockets outside it. Landlock binds root too, and whatever
  is started inside inherits it. A step that fails ends the run (exit 126): ARGV never runs less confined than
  asked;
- namespaces (--namespaces, where unprivileged user namespaces are allowed): a user, PID and mount namespace of
  its own. The sandbox's first process is the PID namespace's init: when it ends, the kernel ends every process in
  the namespace, so nothing outlives the run even if the wrapper is killed; /proc shows only the sandbox's own
  processes, and /dev/shm is a private tmpfs.

The Python side, for the process that starts a sandbox (a grader):

    capabilities() -> Capabilities     what this machine offers: Landlock ABI, subreaper, user namespaces;
                                       .missing() lists, in words, the guarantees that do not hold here
    Limits(...)                        memory (bytes, over the whole tree), CPU seconds (the whole tree, reaped
                                       children included), wall seconds, file size, output, processes
    box = Sandbox(limits, readable=[...], protected=[...])   a scratch folder of its own, made now
        box.command(argv) -> argv      the wrapper's command line that runs argv inside (argv itself where Linux's
                                       sandboxing is not available: macOS, Windows)
        box.environment(env) -> env    HOME, TMPDIR, IPYTHONDIR, MPLCONFIGDIR, JUPYTER_*, XDG_* in the scratch
                                       folder; ttlib and its assets, the Minari datasets reachable read-only
        box.watch(pid) -> Watchdog     a thread over the tree of `pid`: usage (CPU s, memory, processes), peak
                                       memory; kills the whole tree past a limit and says which (.stopped)
        box.close()                    ends whatever is left and removes the scratch folder
    run(argv, limits, ...) -> Result   all of the above for a plain command (e.g. `python -m pkg.runner`): its
                                       stdout and stderr captured (at most limits.output_bytes each), and
                                       Result(returncode, stopped, cpu_seconds, peak_memory_bytes, wall_seconds,
                                       stdout, stderr)
    tree_usage(pid) -> Usage           CPU seconds, resident memory and process count of pid's descendants
    end_tree(pid, grace)               SIGTERM (when grace > 0), then SIGKILL to every descendant, then pid
    adopt_orphans(), end_orphans(keep) the grader as a second line: a subreaper itself, ending after each
                                       submission every child it did not have before (orphans that escaped)

A second kind of sandboxed process, a test runner that is not a kernel:

    result = run([sys.executable, "-m", "ttlib.exercises.hidden", "answer.py"],
                 Limits(memory_bytes=2 * 2**30, cpu_seconds=60, wall_seconds=300, output_bytes=2**20),
                 files={"answer.py": source.encode()}, protected=[course_root, repo_root])
    result.returncode  # its exit status; 128 + N when signal N ended it (the wrapper passes that on)
    result.stopped     # None, or the limit that ended it: "memory", "cpu time", "wall time", "processes"
    result.stdout      # bytes, at most output_bytes (then a note); stderr the same

`env` defaults to this process's environment, moved into the scratch folder by Sandbox.environment (PYTHONPATH
kept, with a read-only copy of the way to ttlib first); `files` are written into the scratch folder, where it starts.

A sandboxed process cannot: write outside its scratch folder and /dev/shm (private to it with namespaces, shared
without); read what is not listed readable (other students' files, the gradebook, the course's sources); signal or
trace the grader (ABI >= 6, or namespaces); leave a process behind. It can: use the CPU, memory and scratch disk up
to the limits (the scratch folder's total size is not limited, only each file's); reach the network unless
--tcp-ports limits TCP; see the names (not the contents) of files in folders it may read.

What it needs from the system: Linux; a child subreaper (Linux >= 3.4); Landlock enabled for file rules (Linux >=
5.13 with `landlock` in the kernel's LSM list); unprivileged user namespaces for the PID and mount namespaces (not
where kernel.unprivileged_userns_clone=0 or AppArmor restricts them, as Ubuntu 24.04 does by default). Processes
are found through /proc/PID/task/TID/children (CONFIG_PROC_CHILDREN), or by reading every /proc/PID/stat without it.
"""

from __future__ import annotations

import argparse
import ctypes
import dataclasses
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

LINUX = sys.platform.startswith("linux")

# ---- Linux interfaces, through ctypes (no dependency, no root) -----------------------------------------------------
PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
PR_SET_NO_NEW_PRIVS = 38
SYS_LANDLOCK_CREATE_RULESET, SYS_LANDLOCK_ADD_RULE, SYS_LANDLOCK_RESTRICT_SELF = 444, 445, 446  # every arch
LANDLOCK_CREATE_RULESET_VERSION = 1
LANDLOCK_RULE_PATH_BENEATH, LANDLOCK_RULE_NET_PORT = 1, 2
CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWPID = 0x00020000, 0x10000000, 0x20000000
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REC, MS_PRIVATE = 2, 4, 8, 16384, 1 << 18

# Landlock's filesystem rights (bit i), and the ABI that added each
FS_EXECUTE, FS_WRITE_FILE, FS_READ_FILE, FS_READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
FS_REFER, FS_TRUNCATE, FS_IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15
NET_BIND_TCP, NET_CONNECT_TCP = 1 << 0, 1 << 1
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1 << 0, 1 << 1
FILE_RIGHTS = FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | FS_TRUNCATE | FS_IOCTL_DEV  # the ones a file rule may hold
READ_RIGHTS = FS_EXECUTE | FS_READ_FILE | FS_READ_DIR

_libc = ctypes.CDLL(None, use_errno=True) if LINUX else None


def _fs_rights(abi: int) -> int:
    """Every filesystem right Landlock ABI `abi` knows (the ruleset handles them all: what is not granted is denied)."""
    rights = (1 << 13) - 1  # ABI 1: execute .. make_sym
    if abi >= 2:
        rights |= FS_REFER
    if abi >= 3:
        rights |= FS_TRUNCATE
    if abi >= 5:
        rights |= FS_IOCTL_DEV
    return rights


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


class _NetPortAttr(ctypes.Structure):
    _fields_ = [("allowed_access", ctypes.c_uint64), ("port", ctypes.c_uint64)]


def _check(result: int, what: str) -> int:
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return result


def _prctl(option: int, value: int) -> None:
    _check(_libc.prctl(option, ctypes.c_ulong(value), 0, 0, 0), f"prctl({option})")


def _disabled() -> set[str]:
    """Guarantees forced off with TTLIB_SANDBOX_DISABLE (comma separated: landlock, namespaces, subreaper, all), to
    see how grading degrades on a machine without them."""
    return {w.strip() for w in os.environ.get("TTLIB_SANDBOX_DISABLE", "").split(",") if w.strip()}


def landlock_abi() -> int:
    """The Landlock ABI version this kernel offers: 0 where there is none (Linux < 5.13, or not enabled)."""
    if not LINUX or {"landlock", "all"} & _disabled():
        return 0
    abi = _libc.syscall(SYS_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0),
                        ctypes.c_uint32(LANDLOCK_CREATE_RULESET_VERSION))
    return max(0, abi)


def _probe_namespaces() -> int:
    """Exit status 0 when an unprivileged user + PID + mount namespace can be made and used here (the wrapper's own
    steps), run in a fresh process by capabilities()."""
    try:
        _enter_user_namespace()
        inner = os.fork()
        if inner == 0:
            try:
                _private_mounts(shm_bytes=1 << 20)
                os._exit(0)
            except BaseException:
                os._exit(1)
        return os.waitpid(inner, 0)[1] >> 8
    except BaseException:
        return 1


def _namespaces_work() -> bool:
    """Whether unprivileged user namespaces work here (some distributions forbid or restrict them): tried for
    real, in a child process."""
    if not LINUX or {"namespaces", "all"} & _disabled():
        return False
    import subprocess

    probe = "import sys; from ttlib.grading.sandbox import _probe_namespaces; sys.exit(_probe_namespaces())"
    try:
        return subprocess.run([sys.executable, "-c", probe], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def _subreaper_works() -> bool:
    return LINUX and not {"subreaper", "all"} & _disabled()


# ---- what this machine offers -------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Capabilities:
    platform: str  # sys.platform
    kernel: str  # os.uname().release
    landlock_abi: int  # 0: no Landlock (files are not protected)
    subreaper: bool  # prctl(PR_SET_CHILD_SUBREAPER): descendants started with setsid stay in the tree
    namespaces: bool  # unprivileged user + PID + mount namespaces work

    @property
    def sandboxed(self) -> bool:
        """Whether the wrapper runs at all (Linux); elsewhere only the grader's limits hold."""
        return self.subreaper

    def holds(self) -> list[str]:
        """The guarantees that hold here, in words."""
        out = []
        if self.subreaper:
            out.append("every process a submission starts (setsid and double forks included) stays in its tree: "
                       "counted for memory and CPU time, and ended when the run ends")
        if self.landlock_abi:
            out.append(f"Landlock ABI {self.landlock_abi}: a submission writes only its scratch folder and reads "
                       "only the Python installation, ttlib and the datasets, not other students' files, the "
                       "gradebook or the course's sources")
            if self.landlock_abi >= 6:
                out.append("it cannot signal processes outside its sandbox (the grader) nor reach abstract Unix "
                           "sockets outside it")
        if self.namespaces:
            out.append("a PID namespace of its own: when its first process ends, the kernel ends every other one; "
                       "/proc shows only its own processes and /dev/shm is private")
        if self.sandboxed:
            out.append("files it writes are capped in size; no core dumps; stdin is /dev/null and its output is "
                       "capped")
        return out

    def missing(self) -> list[str]:
        """The guarantees that do not hold here, in words (empty when everything holds)."""
        out = []
        if not self.sandboxed:
            out.append(f"no sandbox on {self.platform} (Linux only): a submission runs with your rights, can read "
                       "and write every file you can, and processes it starts with setsid can outlive grading; only "
                       "the time and memory limits of its kernel apply")
            return out
        if not self.landlock_abi:
            out.append(f"no Landlock (Linux {self.kernel}; it needs Linux >= 5.13 with Landlock enabled, e.g. "
                       "lsm=landlock,... on the kernel command line): files are NOT protected, a submission can read "
                       "and write every file you can (other students' files, the gradebook)")
        elif self.landlock_abi < 6:
            out.append(f"Landlock ABI {self.landlock_abi} < 6: a submission can still send signals to your other "
                       "processes (Linux >= 6.12 scopes them)")
        if not self.namespaces:
            out.append("no unprivileged user namespaces: the sandbox has no PID namespace of its own, so ending "
                       "its processes relies on the wrapper and the grader finding them (still every one they can "
                       "see); /dev/shm is shared with your other processes")
        return out

    def report(self) -> str:
        lines = [f"ttlib sandbox on {self.platform} {self.kernel}: Landlock ABI {self.landlock_abi or 'none'}, "
                 f"subreaper {'yes' if self.subreaper else 'no'}, user namespaces "
                 f"{'yes' if self.namespaces else 'no'}"]
        lines += [f"  holds: {h}" for h in self.holds()]
        lines += [f"  DOES NOT HOLD: {m}" for m in self.missing()]
        return "\n".join(lines)


_CAPABILITIES: dict[str, Capabilities] = {}


def capabilities() -> Capabilities:
    """What this machine offers (probed once per process and per TTLIB_SANDBOX_DISABLE)."""
    key = os.environ.get("TTLIB_SANDBOX_DISABLE", "")
    if key not in _CAPABILITIES:
        _CAPABILITIES[key] = Capabilities(sys.platform, os.uname().release if hasattr(os, "uname") else "",
                                          landlock_abi(), _subreaper_works(), _namespaces_work())
    return _CAPABILITIES[key]


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


def _children_of(pid: int) -> list[int]:
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
        out, todo = [], _children_of(pid)
        while todo:
            out += todo
            todo = [c for p in todo for c in _children_of(p)]
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


def tree_usage(pid: int, include_root: bool = False) -> Usage | None:
    """CPU time, memory and process count of everything below `pid` (and of `pid` itself with `include_root`; not
    by default: `pid` is the wrapper): the live descendants' own and reaped-children times, plus the times of the
    children `pid` reaped (the wrapper, a subreaper, reaps orphans: their time stays counted). None when `pid` is
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
            pages += int(fields[21])
            n += 1
    return Usage(ticks / _TICK, pages * _PAGE, n)


def _alive(pid: int) -> bool:
    fields = _stat(pid) if LINUX else None
    if LINUX:
        return fields is not None and fields[0] not in "ZX"
    try:
        os.kill(pid, 0)
        return True
    except OSError:
        return False


def _signal(pids, sig) -> None:
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
        _signal([pid, *descendants(pid)], signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and (_alive(pid) or any(_alive(p) for p in descendants(pid))):
            time.sleep(0.02)
    for _ in range(200):
        alive = [p for p in descendants(pid) if _alive(p)]
        if not alive:
            break
        _signal(alive, signal.SIGKILL)
        time.sleep(0.005)
    _signal([pid], signal.SIGKILL)


def adopt_orphans() -> bool:
    """Make this process a child subreaper: a process that a child of ours leaves behind (setsid, double fork)
    becomes our child instead of init's, where end_orphans finds it. False where Linux does not offer it."""
    if not capabilities().subreaper:
        return False
    try:
        _prctl(PR_SET_CHILD_SUBREAPER, 1)
        return True
    except OSError:
        return False


def end_orphans(keep: set[int]) -> list[int]:
    """SIGKILL every child of this process (and its descendants) whose pid is not in `keep` (the children it had
    before), reap them, and return their pids: what a sandbox left behind when its wrapper was killed first."""
    if not LINUX:
        return []
    me = os.getpid()
    strays = [p for p in _children_of(me) if p not in keep]
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
    return set(_children_of(os.getpid())) if LINUX else set()


# ---- limits, and the thread that holds a tree to them --------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Limits:
    memory_bytes: float | None = 6 * 2**30  # resident memory of the whole tree; past it the tree is killed
    cpu_seconds: float | None = None  # CPU time of the whole tree (reaped children included); None: no limit
    wall_seconds: float | None = None  # seconds on the clock; None: no limit
    file_size_bytes: int = 2**30  # the largest file a process may write (RLIMIT_FSIZE)
    output_bytes: int = 2**20  # stdout and stderr each: what the wrapper forwards (run() keeps)
    processes: int | None = 1024  # live processes in the tree; past it the tree is killed (a fork bomb)
    threads: int | None = 1  # OMP/MKL/torch threads inside (CPU time is then about the time on the clock)


@dataclasses.dataclass
class Watchdog:
    """A thread that looks at the tree below `pid` every `poll` seconds: `usage` is the latest look, `peak_memory`
    the most memory seen; past a limit it kills the whole tree and `stopped` says which limit ("memory", "cpu
    time", "wall time", "processes")."""

    pid: int
    limits: Limits
    poll: float = 0.05
    include_root: bool = False  # count `pid` itself (when it is the command, not the wrapper)
    guard: object = None  # a function called at each look: a reason (str) to end the tree now, or None
    usage: Usage = Usage(0.0, 0, 0)
    peak_memory: int = 0
    stopped: str | None = None
    over: float = 0.0  # the value that crossed the limit

    def __post_init__(self):
        self.started = started(self.pid)  # who `pid` is: end_tree leaves a later process with that pid alone
        self._done = threading.Event()
        self._start = time.monotonic()
        self._thread = threading.Thread(target=self._watch, name=f"sandbox-watchdog-{self.pid}", daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        limits = self.limits
        while not self._done.is_set():
            usage = tree_usage(self.pid, self.include_root)
            if usage is None:
                return
            self.usage = dataclasses.replace(usage, cpu_seconds=max(usage.cpu_seconds, self.usage.cpu_seconds))
            self.peak_memory = max(self.peak_memory, usage.memory_bytes)
            checks = [("memory", usage.memory_bytes, limits.memory_bytes),
                      ("cpu time", self.usage.cpu_seconds, limits.cpu_seconds),
                      ("wall time", time.monotonic() - self._start, limits.wall_seconds),
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

    def close(self) -> None:
        self._done.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=5)


# ---- a sandbox: its folders, its command line, its environment -----------------------------------------------------
def _python_paths() -> list[str]:
    """The Python installation: prefixes (a venv and its base), the standard library and site-packages."""
    import site
    import sysconfig

    paths = {sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix,
             os.path.dirname(os.path.realpath(sys.executable))}
    paths.update(p for p in sysconfig.get_paths().values() if p)
    paths.update(site.getsitepackages() if hasattr(site, "getsitepackages") else [])
    if site.ENABLE_USER_SITE and site.getusersitepackages():
        paths.add(site.getusersitepackages())
    return sorted(paths)


SYSTEM_READ = ["/usr", "/lib", "/lib32", "/lib64", "/libx32", "/bin", "/sbin", "/etc", "/opt", "/proc", "/sys",
               "/dev", "/run/systemd/resolve"]
SYSTEM_WRITE_FILES = ["/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom"]


def ttlib_paths() -> dict[str, str]:
    """Where this ttlib, its shipped checkpoints (assets/) and the Minari datasets are."""
    import ttlib

    package = os.path.dirname(os.path.realpath(ttlib.__file__))
    assets = os.environ.get("TTLIB_ASSETS") or os.path.join(os.path.dirname(package), "assets")
    datasets = os.environ.get("MINARI_DATASETS_PATH") or os.path.join(os.path.expanduser("~"), ".minari", "datasets")
    return {"package": package, "assets": os.path.realpath(assets), "datasets": os.path.realpath(datasets)}


def _inside(path: str, folder: str) -> bool:
    path, folder = os.path.realpath(path), os.path.realpath(folder)
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


class Sandbox:
    """A scratch folder and the rules of one sandboxed run; see the module's docstring. `readable`: more paths to
    read (beside the system's, Python's, ttlib's and the datasets); `protected`: paths that must stay out of reach
    (the course folder, the solutions): a readable path that holds one of them is left out, so a Python found
    through the repository root still finds ttlib (linked from a read-only folder of the sandbox's own)."""

    def __init__(self, limits: Limits = Limits(), readable=(), protected=(), tcp_ports=None, name: str = "run",
                 caps: Capabilities | None = None, grace: float = 1.0):
        self.limits, self.tcp_ports, self.grace = limits, tcp_ports, grace
        self.caps = caps or capabilities()
        self.root = Path(tempfile.mkdtemp(prefix=f"ttsbx-{name}-"))
        self.scratch = self.root / "scratch"  # the one folder it may write
        self.site = self.root / "site"  # read-only to it: ttlib, linked here when its parent must stay unreadable
        self.scratch.mkdir()
        self.site.mkdir()
        self.paths = ttlib_paths()
        protected = [os.path.realpath(p) for p in protected]
        self.readable, self.left_out = [], []
        for path in [*SYSTEM_READ, *_python_paths(), self.paths["assets"], self.paths["datasets"], *readable]:
            if not os.path.exists(path):
                continue
            if any(_inside(p, path) for p in protected) or _inside(path, str(self.scratch)):
                self.left_out.append(path)
            else:
                self.readable.append(os.path.realpath(path))
        package = self.paths["package"]
        self.readable.append(package)
        if any(_inside(p, os.path.dirname(package)) for p in protected) or \
                not any(_inside(os.path.dirname(package), r) for r in self.readable):
            os.symlink(package, self.site / "ttlib")
        self.readable.append(str(self.site))
        self.watchdog: Watchdog | None = None

    def environment(self, base: dict | None = None) -> dict[str, str]:
        """`base` (default: this process's environment) with every per-user folder in the scratch folder."""
        env = dict(os.environ if base is None else base)
        s = self.scratch
        folders = {"HOME": "home", "TMPDIR": "tmp", "IPYTHONDIR": "ipython", "MPLCONFIGDIR": "matplotlib",
                   "JUPYTER_RUNTIME_DIR": "jupyter/runtime", "JUPYTER_DATA_DIR": "jupyter/data",
                   "JUPYTER_CONFIG_DIR": "jupyter/config", "XDG_CACHE_HOME": "cache", "XDG_CONFIG_HOME": "config",
                   "XDG_DATA_HOME": "data", "XDG_RUNTIME_DIR": "runtime", "TORCH_HOME": "cache/torch"}
        for var, sub in folders.items():
            (s / sub).mkdir(parents=True, exist_ok=True)
            env[var] = str(s / sub)
        env["TMP"] = env["TEMP"] = env["TMPDIR"]
        env["PWD"] = str(s)
        env.pop("OLDPWD", None)
        env["PYTHONPATH"] = os.pathsep.join([str(self.site), *[p for p in env.get("PYTHONPATH", "").split(
            os.pathsep) if p]])
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        env["MINARI_DATASETS_PATH"] = self.paths["datasets"]
        env["TTLIB_ASSETS"] = self.paths["assets"]
        env["TTLIB_SANDBOX"] = str(self.root)  # marks the processes of a sandbox (for people and tests)
        if self.limits.threads:
            for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMEXPR_NUM_THREADS"):
                env[var] = str(self.limits.threads)
        _warm_matplotlib_cache(s / "matplotlib")
        return env

    def command(self, argv: list[str]) -> list[str]:
        """The command line that runs `argv` inside this sandbox (`argv` itself where there is no sandbox)."""
        if not self.caps.sandboxed:
            return list(argv)
        cmd = [sys.executable, "-m", "ttlib.grading.sandbox", "--scratch", str(self.scratch),
               "--file-size", str(int(self.limits.file_size_bytes)), "--output", str(int(self.limits.output_bytes)),
               "--grace", str(self.grace), "--landlock", str(self.caps.landlock_abi)]
        for path in self.readable:
            cmd += ["--read", path]
        if self.caps.namespaces:
            cmd += ["--namespaces", "--shm-size", str(int(self.limits.memory_bytes or 2**30))]
        if self.tcp_ports is not None:
            cmd += ["--tcp-ports", ",".join(str(p) for p in self.tcp_ports)]
        return [*cmd, "--", *argv]

    def watch(self, pid: int, poll: float = 0.05, guard=None) -> Watchdog:
        self.watchdog = Watchdog(pid, self.limits, poll, include_root=not self.caps.sandboxed, guard=guard)
        return self.watchdog

    def close(self) -> None:
        """End whatever is still running below the watched process, and remove the scratch folder."""
        if self.watchdog is not None:
            self.watchdog.close()
            end_tree(self.watchdog.pid, self.grace, self.watchdog.started)
        _remove(self.root)

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _remove(folder: Path) -> None:
    def writable_again(func, path, _):
        try:
            os.chmod(os.path.dirname(path), 0o700)
            os.chmod(path, 0o700)
            func(path)
        except OSError:
            pass

    shutil.rmtree(folder, onerror=writable_again)
    if folder.exists():
        shutil.rmtree(folder, ignore_errors=True)


def _warm_matplotlib_cache(folder: Path) -> None:
    """Copy matplotlib's font list from this user's cache, so each sandbox does not rebuild it (seconds)."""
    cache = os.environ.get("MPLCONFIGDIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "matplotlib")
    try:
        for name in os.listdir(cache):
            if name.startswith("fontlist") and name.endswith(".json"):
                shutil.copyfile(os.path.join(cache, name), folder / name)
    except OSError:
        pass


# ---- run a plain command -------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Result:
    returncode: int  # the command's exit status (negative: killed by that signal)
    stopped: str | None  # the limit that ended it ("memory", "cpu time", "wall time", "processes"), or None
    cpu_seconds: float  # CPU time of its whole tree
    peak_memory_bytes: int  # the most resident memory its tree held at once (sampled)
    wall_seconds: float
    stdout: bytes  # at most limits.output_bytes, then a note
    stderr: bytes


def _read_capped(stream, limit: int, out: list[bytes]) -> None:
    kept = 0
    while chunk := stream.read(65536):
        if kept < limit:
            out.append(chunk[:limit - kept])
            kept += len(out[-1])
            if kept >= limit:
                out.append(b"\n[ttlib sandbox: output over the limit, the rest was dropped]\n")


def run(argv: list[str], limits: Limits = Limits(), readable=(), protected=(), env: dict | None = None,
        files: dict[str, bytes] | None = None, tcp_ports=None, name: str = "run") -> Result:
    """Run `argv` in a fresh sandbox (its own scratch folder, removed afterwards) under `limits`, its stdout and
    stderr captured, and return what happened. It starts in the scratch folder, where `files` ({relative path:
    bytes}) are written first; its stdin is /dev/null. `env` defaults to this process's environment (then moved
    into the scratch folder, see Sandbox.environment)."""
    import subprocess

    start = time.monotonic()
    with Sandbox(limits, readable, protected, tcp_ports, name) as box:
        for relative, data in (files or {}).items():
            path = box.scratch / relative
            if not _inside(str(path), str(box.scratch)):
                raise ValueError(f"run(files=...): {relative!r} is not a path inside the scratch folder")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        proc = subprocess.Popen(box.command(argv), env=box.environment(env), cwd=box.scratch,
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True)
        dog = box.watch(proc.pid)
        out, err = [], []
        readers = [threading.Thread(target=_read_capped, args=(s, limits.output_bytes, o), daemon=True)
                   for s, o in ((proc.stdout, out), (proc.stderr, err))]
        for r in readers:
            r.start()
        rusage = _wait(proc, None if limits.wall_seconds is None else limits.wall_seconds + 30)
        dog.close()
        for r in readers:
            r.join(timeout=5)
        cpu = dog.usage.cpu_seconds
        if rusage is not None and box.caps.sandboxed:  # the wrapper reaped everything below it: exact, to the end
            cpu = max(cpu, rusage.ru_utime + rusage.ru_stime)
        return Result(proc.returncode, dog.stopped, cpu, dog.peak_memory, time.monotonic() - start,
                      b"".join(out), b"".join(err))


def _wait(proc, timeout: float | None):
    """Reap `proc` with wait4, for its resource usage: its own and every descendant it waited for (the wrapper
    waits for every one). Past `timeout` (a wrapper that does not end), its tree is killed."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        pid, status, rusage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            proc.returncode = os.waitstatus_to_exitcode(status) if hasattr(os, "waitstatus_to_exitcode") else (
                -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status))
            return rusage
        if deadline is not None and time.monotonic() > deadline:
            end_tree(proc.pid)
            deadline = None
        time.sleep(0.01)


# ---- inside a Jupyter kernel -----------------------------------------------------------------------------------------
KERNEL_OUTPUT_NOTE = "\n[ttlib: output over the grading limit ({}): the rest was dropped]\n"


def limit_kernel_output(per_cell: int, per_kernel: int) -> None:
    """Run inside an IPython kernel when it starts (BoundedExecute passes it as an exec_line): the stream messages
    its stdout and stderr send (print, and what the kernel reads back from its file descriptors 1 and 2) carry at
    most `per_cell` characters for each cell and `per_kernel` in all, the excess dropped with one note, so printing
    gigabytes sends only small messages. A submission can undo this; the grader caps again what it receives, and
    stops a kernel whose output grows the grading process."""
    session = getattr(sys.stdout, "session", None)
    if session is None:  # not an ipykernel stream
        return
    state = {"cell": None, "in_cell": 0, "in_all": 0, "noted": False}
    lock = threading.Lock()
    send = session.send

    def send_capped(stream, msg_or_type, *args, **kwargs):
        content = msg_or_type.get("content") if isinstance(msg_or_type, dict) else None
        if isinstance(msg_or_type, dict) and msg_or_type.get("msg_type") == "stream" and content:
            text = content.get("text", "")
            with lock:
                cell = (msg_or_type.get("parent_header") or {}).get("msg_id")
                if cell != state["cell"]:
                    state.update(cell=cell, in_cell=0, noted=False)
                left_cell, left_all = per_cell - state["in_cell"], per_kernel - state["in_all"]
                part = text[:max(0, min(left_cell, left_all))]
                if len(part) < len(text):
                    if not state["noted"]:
                        which = f"{per_cell / 2**20:g} MiB a cell" if left_cell <= left_all else \
                            f"{per_kernel / 2**20:g} MiB in all"
                        part += KERNEL_OUTPUT_NOTE.format(which)
                        state["noted"] = True
                    if not part:
                        return None
                    content["text"] = part
                state["in_cell"] += len(part)
                state["in_all"] += len(part)
        return send(stream, msg_or_type, *args, **kwargs)

    session.send = send_capped


# ---- inside: what the wrapper does before it runs the command ------------------------------------------------------
def _enter_user_namespace() -> None:
    """A user namespace (this process keeps its uid and gid, mapped to themselves) and a PID namespace for the
    children to come. Must be called while single-threaded."""
    uid, gid = os.getuid(), os.getgid()
    _check(_libc.unshare(CLONE_NEWUSER | CLONE_NEWPID), "unshare")
    with open("/proc/self/setgroups", "w") as f:
        f.write("deny")
    with open("/proc/self/uid_map", "w") as f:
        f.write(f"{uid} {uid} 1")
    with open("/proc/self/gid_map", "w") as f:
        f.write(f"{gid} {gid} 1")


def _mount(source, target, fstype, flags, data=None) -> None:
    def enc(s):
        return s.encode() if isinstance(s, str) else s

    _check(_libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)), f"mount {target}")


def _private_mounts(shm_bytes: int) -> None:
    """In a mount namespace of its own (the PID namespace's init calls this): /proc of this PID namespace only, and
    a private /dev/shm of at most shm_bytes."""
    _check(_libc.unshare(CLONE_NEWNS), "unshare(mount)")
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    if os.path.isdir("/dev/shm"):
        _mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, f"size={shm_bytes},mode=1777")


def _landlock(abi: int, read: list[str], write: list[str], write_files: list[str], tcp_ports) -> None:
    """Restrict this process (and everything it starts) to reading `read`, writing `write` (folders) and
    `write_files`; with ABI >= 4 and `tcp_ports` not None, TCP only to those ports; with ABI >= 6, no signals to
    processes outside the sandbox and no abstract Unix sockets outside it."""
    fs = _fs_rights(abi)
    attr = _RulesetAttr(fs, 0, 0)
    size = 8
    if abi >= 4 and tcp_ports is not None:
        attr.handled_access_net = NET_BIND_TCP | NET_CONNECT_TCP
        size = 16
    if abi >= 6:
        attr.scoped = SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL
        size = 24
    ruleset = _check(_libc.syscall(SYS_LANDLOCK_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size),
                                   ctypes.c_uint32(0)), "landlock_create_ruleset")
    try:
        for paths, rights in ((read, READ_RIGHTS), (write, fs), (write_files, READ_RIGHTS | FILE_RIGHTS & fs)):
            for path in paths:
                try:
                    fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
                except OSError:
                    continue
                try:
                    allowed = rights & fs if os.path.isdir(path) else rights & fs & FILE_RIGHTS
                    rule = _PathBeneathAttr(allowed, fd)
                    _check(_libc.syscall(SYS_LANDLOCK_ADD_RULE, ruleset, LANDLOCK_RULE_PATH_BENEATH,
                                         ctypes.byref(rule), ctypes.c_uint32(0)), f"landlock_add_rule {path}")
                finally:
                    os.close(fd)
        if attr.handled_access_net:
            for port in tcp_ports:
                rule = _NetPortAttr(NET_BIND_TCP | NET_CONNECT_TCP, int(port))
                _check(_libc.syscall(SYS_LANDLOCK_ADD_RULE, ruleset, LANDLOCK_RULE_NET_PORT, ctypes.byref(rule),
                                     ctypes.c_uint32(0)), f"landlock_add_rule port {port}")
        _prctl(PR_SET_NO_NEW_PRIVS, 1)
        _check(_libc.syscall(SYS_LANDLOCK_RESTRICT_SELF, ruleset, ctypes.c_uint32(0)), "landlock_restrict_self")
    finally:
        os.close(ruleset)


def _become(args, out_w: int, err_w: int) -> None:
    """In the child, never returning: limits, folders, Landlock, then exec the command. Any failure ends the child
    (exit 126) without running the command unconfined."""
    try:
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(out_w, 1)
        os.dup2(err_w, 2)
        for fd in (devnull, out_w, err_w):
            if fd > 2:
                os.close(fd)
        os.closerange(3, 65536)
        import resource

        resource.setrlimit(resource.RLIMIT_FSIZE, (args.file_size, args.file_size))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a file over the size limit: an error (EFBIG), not a kill
        os.chdir(args.scratch)
        if args.landlock:
            write_files = [p for p in SYSTEM_WRITE_FILES if os.path.exists(p)]
            write = [args.scratch, "/dev/shm"]  # private with --namespaces; else shared (semaphores need it)
            tcp = None if args.tcp_ports is None else [int(p) for p in args.tcp_ports.split(",") if p]
            _landlock(args.landlock, [*args.read, *write_files], write, write_files, tcp)
        # a Jupyter kernel quits when its parent is no longer JPY_PARENT_PID (the grader, outside): its parent is
        # this wrapper now, or the PID namespace's init (pid 1, which it then leaves alone)
        if "JPY_PARENT_PID" in os.environ:
            os.environ["JPY_PARENT_PID"] = str(os.getppid())
        os.execvp(args.argv[0], args.argv)
    except BaseException as e:
        os.write(2, f"ttlib sandbox: could not start {args.argv[:1]}: {type(e).__name__}: {e}\n".encode())
    os._exit(126)


class _Pump:
    """Copies the command's stdout and stderr pipes to ours, at most `limit` bytes each, then one note; it keeps
    reading past that so the writer never blocks. (The wrapper has no threads: after unshare(CLONE_NEWPID) a
    process cannot start any.)"""

    def __init__(self, pipes: dict[int, int], limit: int):
        self.pipes, self.limit, self.sent = dict(pipes), limit, dict.fromkeys(pipes, 0)

    def step(self, timeout: float) -> None:
        import select

        if not self.pipes:
            time.sleep(timeout)
            return
        ready, _, _ = select.select(list(self.pipes), [], [], timeout)
        for fd in ready:
            chunk = os.read(fd, 65536)
            if not chunk:
                os.close(fd)
                del self.pipes[fd]
                continue
            sent = self.sent[fd]
            if sent < self.limit:
                part = chunk[:self.limit - sent]
                self.sent[fd] += len(part)
                try:
                    os.write(self.pipes[fd], part)
                    if self.sent[fd] >= self.limit:
                        os.write(self.pipes[fd], b"\n[ttlib sandbox: output over the limit, the rest was dropped]\n")
                except OSError:
                    pass

    def drain(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while self.pipes and time.monotonic() < deadline:
            self.step(0.05)


class _Stop(Exception):
    pass


def _raise_stop(*_):
    raise _Stop


def _end_all(root_pid: int, grace: float, in_namespace: bool, pump: _Pump | None = None) -> None:
    """End everything below this process: SIGTERM, up to `grace` seconds, then SIGKILL. In a PID namespace's init,
    kill(-1) reaches every other process of the namespace; otherwise walk the tree (this process is a subreaper:
    nothing started below it can leave it)."""
    def alive_below():
        return [p for p in descendants(root_pid) if _alive(p)]

    def reap() -> bool:  # False once no child is left
        try:
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
            return True
        except ChildProcessError:
            return False

    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 2.0)):
        if wait <= 0:
            continue
        if in_namespace:
            try:
                os.kill(-1, sig)
            except OSError:
                pass
        else:
            _signal(alive_below(), sig)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if not reap() or not (in_namespace or alive_below()):
                break
            if not in_namespace and sig == signal.SIGKILL:
                _signal(alive_below(), sig)  # whatever forked meanwhile
            pump.step(0.02) if pump else time.sleep(0.02)
    reap()


def _exit_code(status: int) -> int:
    """A wait status as an exit code: the command's own, or 128 + N when signal N ended it."""
    return os.WEXITSTATUS(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)


def _supervise(main_pid: int, grace: float, in_namespace: bool) -> int:
    """The PID namespace's init: reap children (orphans included) until the main one ends or we are asked to stop,
    then end everything left. Returns the exit code to pass on."""
    code = 128 + signal.SIGTERM
    try:
        while True:
            pid, status = os.waitpid(-1, 0)
            if pid == main_pid:
                code = _exit_code(status)
                break
    except (ChildProcessError, _Stop):
        pass
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _end_all(os.getpid(), grace, in_namespace)
    return code


def _wrapper(args) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # an interrupt is for the command (same process group), not us
    signal.signal(signal.SIGTERM, _raise_stop)
    signal.signal(signal.SIGHUP, _raise_stop)
    parent = os.getppid()
    _prctl(PR_SET_PDEATHSIG, signal.SIGTERM)  # our parent (the grader) dies: end everything
    if os.getppid() != parent:
        return 128 + signal.SIGTERM
    _prctl(PR_SET_CHILD_SUBREAPER, 1)
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    if args.namespaces:
        _enter_user_namespace()
    me = os.getpid()
    first = os.fork()
    if first == 0:
        if not args.namespaces:
            _become(args, out_w, err_w)
        # the PID namespace's init: its own /proc and /dev/shm, then the command as its child
        try:
            _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # the wrapper dies: the namespace goes with it
            _private_mounts(args.shm_size)
            main = os.fork()
            if main == 0:
                _become(args, out_w, err_w)
            for fd in (out_r, out_w, err_r, err_w):
                os.close(fd)
            os._exit(_supervise(main, args.grace, in_namespace=True))
        except BaseException as e:
            os.write(2, f"ttlib sandbox: namespace set-up failed: {type(e).__name__}: {e}\n".encode())
            os._exit(126)
    os.close(out_w)
    os.close(err_w)
    pump = _Pump({out_r: 1, err_r: 2}, args.output)
    code = None
    try:
        while code is None:
            pump.step(0.1)
            try:  # reap: the first child, and orphans that came to us
                while True:
                    pid, status = os.waitpid(-1, os.WNOHANG)
                    if pid == 0:
                        break
                    if pid == first:
                        code = _exit_code(status)
            except ChildProcessError:
                code = 1 if code is None else code
    except _Stop:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        code = 128 + signal.SIGTERM
        if args.namespaces:  # its init ends the namespace's processes, or dies with all of them
            _signal([first], signal.SIGTERM)
            deadline = time.monotonic() + args.grace + 2.5
            while _alive(first) and time.monotonic() < deadline:
                pump.step(0.02)
            _signal([first], signal.SIGKILL)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _end_all(me, 0.0 if args.namespaces else args.grace, False, pump)
    pump.drain(1.0)
    return code


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m ttlib.grading.sandbox",
                                description="Run a command in a sandbox of its own (see the module's docstring).")
    p.add_argument("--doctor", action="store_true", help="say what this machine offers, and stop")
    p.add_argument("--scratch", help="the folder the command runs in and may write")
    p.add_argument("--read", action="append", default=[], help="a path it may read (and execute)")
    p.add_argument("--file-size", type=int, default=2**30, help="the largest file it may write, in bytes")
    p.add_argument("--output", type=int, default=2**20, help="bytes of its stdout and of its stderr passed on")
    p.add_argument("--grace", type=float, default=1.0, help="seconds between SIGTERM and SIGKILL when it ends")
    p.add_argument("--landlock", type=int, default=None, help="the Landlock ABI to use (0: none; default: the best)")
    p.add_argument("--namespaces", action="store_true", help="user, PID and mount namespaces of its own")
    p.add_argument("--shm-size", type=int, default=2**30, help="bytes of its private /dev/shm (with --namespaces)")
    p.add_argument("--tcp-ports", default=None, help="comma-separated TCP ports it may bind or connect to (Landlock "
                                                    "ABI >= 4; empty: none); default: TCP not limited")
    p.add_argument("argv", nargs=argparse.REMAINDER, help="-- then the command")
    return p


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    if args.doctor:
        print(capabilities().report())
        return 0
    if args.argv[:1] == ["--"]:
        args.argv = args.argv[1:]
    if not args.argv or not args.scratch:
        _parser().error("needs --scratch DIR and -- COMMAND")
    if not LINUX:
        print("ttlib sandbox: Linux only", file=sys.stderr)
        return 2
    if args.landlock is None:
        args.landlock = landlock_abi()
    args.scratch = os.path.realpath(args.scratch)
    return _wrapper(args)


if __name__ == "__main__":
    sys.exit(main())
