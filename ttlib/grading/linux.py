"""The Linux interfaces the sandbox is built from, through ctypes (no dependency, no root), and what this machine
offers of them. One piece: the constants, structures and calls of prctl, Landlock, user namespaces and mounts, then
the probes that say which of them work here (`capabilities()`, also `ttlib grade doctor`).

    capabilities() -> Capabilities     Landlock ABI, subreaper, user namespaces; .missing() lists, in words, the
                                       guarantees that do not hold here; .report() for people
    landlock_abi()                     0 where there is none
    enter_user_namespace(), private_mounts(shm_bytes), landlock(abi, read, write, write_files, tcp_ports)
                                       the steps the wrapper (ttlib.grading.wrapper) takes before it runs a command

TTLIB_SANDBOX_DISABLE (comma separated: landlock, namespaces, subreaper, all) forces guarantees off, to see how
grading degrades on a machine without them.
"""

from __future__ import annotations

import ctypes
import dataclasses
import os
import sys

__all__ = ["CLONE_NEWNS", "CLONE_NEWPID", "CLONE_NEWUSER", "Capabilities", "FILE_RIGHTS", "FS_EXECUTE", "FS_IOCTL_DEV",
           "FS_READ_DIR", "FS_READ_FILE", "FS_REFER", "FS_TRUNCATE", "FS_WRITE_FILE", "IDLE_CLOCK",
           "LANDLOCK_CREATE_RULESET_VERSION", "LANDLOCK_RULE_NET_PORT", "LANDLOCK_RULE_PATH_BENEATH", "LINUX",
           "MS_NODEV", "MS_NOEXEC", "MS_NOSUID", "MS_PRIVATE", "MS_REC", "NET_BIND_TCP", "NET_CONNECT_TCP",
           "PR_SET_CHILD_SUBREAPER", "PR_SET_NO_NEW_PRIVS", "PR_SET_PDEATHSIG", "READ_RIGHTS",
           "SCOPE_ABSTRACT_UNIX_SOCKET", "SCOPE_SIGNAL", "SYS_LANDLOCK_ADD_RULE", "SYS_LANDLOCK_CREATE_RULESET",
           "SYS_LANDLOCK_RESTRICT_SELF", "capabilities", "check", "enter_user_namespace", "landlock", "landlock_abi",
           "prctl", "private_mounts"]

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
# schedstat: how long each thread ran and waited for a CPU (ttlib.grading.processes counts idle time with it)
IDLE_CLOCK = LINUX and os.path.exists(f"/proc/{os.getpid()}/task/{os.getpid()}/schedstat")


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


def check(result: int, what: str) -> int:
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return result


def prctl(option: int, value: int) -> None:
    check(_libc.prctl(option, ctypes.c_ulong(value), 0, 0, 0), f"prctl({option})")


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
        enter_user_namespace()
        inner = os.fork()
        if inner == 0:
            try:
                private_mounts(shm_bytes=1 << 20)
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

    probe = "import sys; from ttlib.grading.linux import _probe_namespaces; sys.exit(_probe_namespaces())"
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
    idle_clock: bool = False  # /proc/PID/task/TID/schedstat: time spent waiting for a CPU is told from idle time

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
        if self.idle_clock:
            out.append("a submission that only sleeps or waits is stopped after minutes: its clock backstops count "
                       "idle seconds, never the time it waits for a CPU, so a busy machine costs an honest one nothing")
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
        if not self.idle_clock:
            out.append("no /proc/PID/task/TID/schedstat (CONFIG_SCHED_INFO): idle time cannot be told from time "
                       "spent waiting for a CPU, so a submission that only sleeps holds its grading job until the "
                       "clock backstops of 5 times its CPU budgets")
        return out

    def report(self) -> str:
        lines = [f"ttlib sandbox on {self.platform} {self.kernel}: Landlock ABI {self.landlock_abi or 'none'}, "
                 f"subreaper {'yes' if self.subreaper else 'no'}, user namespaces "
                 f"{'yes' if self.namespaces else 'no'}, idle clock {'yes' if self.idle_clock else 'no'}"]
        lines += [f"  holds: {h}" for h in self.holds()]
        lines += [f"  DOES NOT HOLD: {m}" for m in self.missing()]
        return "\n".join(lines)


_CAPABILITIES: dict[str, Capabilities] = {}


def capabilities() -> Capabilities:
    """What this machine offers (probed once per process and per TTLIB_SANDBOX_DISABLE)."""
    key = os.environ.get("TTLIB_SANDBOX_DISABLE", "")
    if key not in _CAPABILITIES:
        _CAPABILITIES[key] = Capabilities(sys.platform, os.uname().release if hasattr(os, "uname") else "",
                                          landlock_abi(), _subreaper_works(), _namespaces_work(), IDLE_CLOCK)
    return _CAPABILITIES[key]


# ---- the wrapper's steps, before it runs the command ----------------------------------------------------------------
def enter_user_namespace() -> None:
    """A user namespace (this process keeps its uid and gid, mapped to themselves) and a PID namespace for the
    children to come. Must be called while single-threaded."""
    uid, gid = os.getuid(), os.getgid()
    check(_libc.unshare(CLONE_NEWUSER | CLONE_NEWPID), "unshare")
    with open("/proc/self/setgroups", "w") as f:
        f.write("deny")
    with open("/proc/self/uid_map", "w") as f:
        f.write(f"{uid} {uid} 1")
    with open("/proc/self/gid_map", "w") as f:
        f.write(f"{gid} {gid} 1")


def _mount(source, target, fstype, flags, data=None) -> None:
    def enc(s):
        return s.encode() if isinstance(s, str) else s

    check(_libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)), f"mount {target}")


def private_mounts(shm_bytes: int) -> None:
    """In a mount namespace of its own (the PID namespace's init calls this): /proc of this PID namespace only, and
    a private /dev/shm of at most shm_bytes."""
    check(_libc.unshare(CLONE_NEWNS), "unshare(mount)")
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    if os.path.isdir("/dev/shm"):
        _mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, f"size={shm_bytes},mode=1777")


def landlock(abi: int, read: list[str], write: list[str], write_files: list[str], tcp_ports) -> None:
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
    ruleset = check(_libc.syscall(SYS_LANDLOCK_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size),
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
                    check(_libc.syscall(SYS_LANDLOCK_ADD_RULE, ruleset, LANDLOCK_RULE_PATH_BENEATH,
                                         ctypes.byref(rule), ctypes.c_uint32(0)), f"landlock_add_rule {path}")
                finally:
                    os.close(fd)
        if attr.handled_access_net:
            for port in tcp_ports:
                rule = _NetPortAttr(NET_BIND_TCP | NET_CONNECT_TCP, int(port))
                check(_libc.syscall(SYS_LANDLOCK_ADD_RULE, ruleset, LANDLOCK_RULE_NET_PORT, ctypes.byref(rule),
                                     ctypes.c_uint32(0)), f"landlock_add_rule port {port}")
        prctl(PR_SET_NO_NEW_PRIVS, 1)
        check(_libc.syscall(SYS_LANDLOCK_RESTRICT_SELF, ruleset, ctypes.c_uint32(0)), "landlock_restrict_self")
    finally:
        os.close(ruleset)

