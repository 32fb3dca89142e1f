"""The sandbox's wrapper: the process `python -m ttlib.grading.sandbox --scratch DIR ... -- ARGV` runs (see
ttlib.grading.sandbox for what it guarantees). It makes itself a child subreaper, optionally enters user, PID and
mount namespaces (the first process inside is the PID namespace's init), starts ARGV confined (`_become`: rlimits,
Landlock, stdin from /dev/null, stdout and stderr through pipes it forwards, capped), and when ARGV ends or it is
asked to stop, ends every descendant: SIGTERM, a grace period, then SIGKILL. It starts no threads (after
unshare(CLONE_NEWPID) a process cannot).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time

from ttlib.grading.linux import (
    LINUX,
    PR_SET_CHILD_SUBREAPER,
    PR_SET_PDEATHSIG,
    capabilities,
    enter_user_namespace,
    landlock,
    landlock_abi,
    prctl,
    private_mounts,
)
from ttlib.grading.processes import descendants, is_alive, signal_all

__all__ = ["SUPERVISOR", "SYSTEM_WRITE_FILES", "main", "supervise"]

SYSTEM_WRITE_FILES = ["/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom"]

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
            landlock(args.landlock, [*args.read, *write_files], write, write_files, tcp)
        # a Jupyter kernel quits when its parent is no longer JPY_PARENT_PID (the grader, outside): its parent is
        # this wrapper now, or the PID namespace's init (pid 1, which it then leaves alone)
        if "JPY_PARENT_PID" in os.environ:
            os.environ["JPY_PARENT_PID"] = str(os.getppid())
        if args.run_in_place is not None:  # forked from the zygote: the command runs here, already imported
            args.run_in_place(args.argv)
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
        return [p for p in descendants(root_pid) if is_alive(p)]

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
            signal_all(alive_below(), sig)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if not reap() or not (in_namespace or alive_below()):
                break
            if not in_namespace and sig == signal.SIGKILL:
                signal_all(alive_below(), sig)  # whatever forked meanwhile
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


_TTLIB_PARENT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SUPERVISOR = (f"import sys; sys.path.insert(0, {_TTLIB_PARENT!r}); from ttlib.grading.wrapper import supervise; "
              "supervise(int(sys.argv[1]), float(sys.argv[2]))")


def supervise(main_pid: int, grace: float) -> None:
    """The PID namespace's init exec'd afresh (a run forked from the zygote): `_supervise`, with the wrapper's
    handlers (exec reset them)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _raise_stop)
    signal.signal(signal.SIGHUP, _raise_stop)
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    os._exit(_supervise(main_pid, grace, in_namespace=True))


def _wrapper(args) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # an interrupt is for the command (same process group), not us
    signal.signal(signal.SIGTERM, _raise_stop)
    signal.signal(signal.SIGHUP, _raise_stop)
    parent = os.getppid()
    prctl(PR_SET_PDEATHSIG, signal.SIGTERM)  # our parent (the grader) dies: end everything
    if os.getppid() != parent:
        return 128 + signal.SIGTERM
    prctl(PR_SET_CHILD_SUBREAPER, 1)
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    if args.namespaces:
        enter_user_namespace()
    me = os.getpid()
    first = os.fork()
    if first == 0:
        if not args.namespaces:
            _become(args, out_w, err_w)
        # the PID namespace's init: its own /proc and /dev/shm, then the command as its child
        try:
            prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # the wrapper dies: the namespace goes with it
            private_mounts(args.shm_size)
            main = os.fork()
            if main == 0:
                _become(args, out_w, err_w)
            for fd in (out_r, out_w, err_r, err_w):
                os.close(fd)
            if args.run_in_place is not None:  # a copy of the zygote: a small supervisor instead (the memory)
                os.execv(sys.executable, [sys.executable, "-c", SUPERVISOR, str(main), str(args.grace)])
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
            signal_all([first], signal.SIGTERM)
            deadline = time.monotonic() + args.grace + 2.5
            while is_alive(first) and time.monotonic() < deadline:
                pump.step(0.02)
            signal_all([first], signal.SIGKILL)
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


def main(argv=None, run_in_place=None) -> int:
    """The wrapper's command line (`argv`). `run_in_place(command)`: what runs the command instead of exec, in its
    confined process (ttlib.grading.zygote's children: the command's libraries are already imported)."""
    args = _parser().parse_args(argv)
    args.run_in_place = run_in_place
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
