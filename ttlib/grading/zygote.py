"""A fork server for sandboxed Python runs: a process (the zygote) that imports once what the hidden tests import
-- PyTorch, ttlib and its exercises, matplotlib, IPython -- and then forks a fresh process for every run, so that a
submission's hidden tests start in a tenth of a second instead of importing for seconds.

Each run gets a process of its own that is used for that run only and then ends; the zygote never runs a line of a
submission, never reads a run's request (the forked child does), and holds nothing but the imported libraries. The
forked child is the sandbox's wrapper (ttlib.grading.wrapper, the same code, the same steps: a subreaper, its own
user, PID and mount namespaces, rlimits, Landlock, capped output); only at the very end, where the wrapper would
exec `python -m MODULE ...`, its confined process runs MODULE in place (`run_here`), as a fresh interpreter would
(sys.argv, sys.path, the environment, signal dispositions), with the libraries already imported. The PID
namespace's init, a copy of the zygote at first, execs a small supervisor at once, so that the tree's memory holds
no second copy of the libraries.

    z = zygote_for(python, env)          the zygote of this grading process (started the first time: seconds)
    pid = z.spawn(wrapper_args, env, cwd, stdout_fd, stderr_fd)    the wrapper, forked: its pid (watch its tree)
    status, cpu = z.wait(pid, timeout)   its wait status and CPU seconds (its own and every child it reaped)

The zygote ends when the grading process that started it ends (it reads end-of-file on its socket); a run still in
flight then is ended with it. ttlib.grading.sandbox.run(..., preload=True) uses this where the sandbox runs.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import threading

__all__ = ["ForkedProcess", "PRELOAD", "PRELOAD_TTLIB", "THREAD_VARS", "Zygote", "close_all", "fork_here", "pids",
           "preload_libraries", "run_here", "serve", "zygote_for"]

PRELOAD = ("numpy", "torch", "torch.nn.functional", "matplotlib.pyplot", "ipywidgets", "IPython.display",
           "IPython.core.inputtransformer2", "tqdm.auto", "gymnasium", "ipykernel.kernelapp",
           "matplotlib_inline.backend_inline")  # libraries the hidden tests, the graded notebooks' setup cells
# and the kernels import; an optional one that is missing is left to the runs
PRELOAD_TTLIB = ("ttlib.exercises.hidden", "ttlib.model.gpt", "ttlib.model.tokenizer", "ttlib.model.attention",
                 "ttlib.evaluation.rollout", "ttlib.planning.fast_decoder", "ttlib.evaluation.ray_evaluation",
                 "ttlib.course.threads", "ttlib.course.viz")  # the course's own: each must import
THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMEXPR_NUM_THREADS")
_PID, _DONE = struct.Struct("<i"), struct.Struct("<idd")  # the zygote's replies: a child's pid; its end


# ---- the grader's side -------------------------------------------------------------------------------------------
class Zygote:
    """A zygote of this process (`start`ed afresh, or `fork_here`): `spawn` forks a run, `wait` reaps it (one run at
    a time)."""

    def __init__(self, pid: int, sock: socket.socket, proc: subprocess.Popen | None = None):
        self.pid, self.sock, self.proc, self.lock = pid, sock, proc, threading.Lock()

    @classmethod
    def start(cls, python: str, env: dict[str, str], ready_timeout: float = 600.0) -> Zygote:
        """A zygote in a new process of `python` with `env` (it imports PRELOAD first: seconds)."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        code = f"from ttlib.grading.zygote import serve; serve({theirs.fileno()})"
        proc = subprocess.Popen([python, "-c", code], env=env, pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, start_new_session=True)
        theirs.close()
        z = cls(proc.pid, ours, proc)
        ours.settimeout(ready_timeout)
        try:
            ready = ours.recv(1)
        except OSError:
            ready = b""
        ours.settimeout(None)
        if ready != b"R":
            z.close()
            raise OSError("the grading zygote did not start (see its error above)")
        return z

    def alive(self) -> bool:
        if self.proc is not None:
            return self.proc.poll() is None
        try:
            return os.waitpid(self.pid, os.WNOHANG) == (0, 0)
        except ChildProcessError:
            return False

    def spawn(self, wrapper_args: list[str], env: dict[str, str], cwd: str, stdout_fd: int, stderr_fd: int) -> int:
        """Fork the wrapper that runs `wrapper_args` (ttlib.grading.wrapper's command line) with `env` in `cwd`, its
        stdout and stderr on these descriptors (this process keeps its copies). -> its pid."""
        self.lock.acquire()
        request, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            socket.send_fds(self.sock, [b"F"], [theirs.fileno(), stdout_fd, stderr_fd])
            theirs.close()
            pid = _PID.unpack(_recv_exact(self.sock, _PID.size))[0]
            request.sendall(json.dumps({"args": wrapper_args, "env": env, "cwd": cwd}).encode())
        except BaseException:
            self.lock.release()
            raise
        finally:
            request.close()
        return pid

    def wait(self, pid: int, timeout: float | None = None) -> tuple[int, float]:
        """(the wait status of the run `spawn` started, its CPU seconds: its own and its reaped children's). Past
        `timeout` seconds its tree is killed."""
        import time

        from ttlib.grading.processes import end_tree

        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            while True:
                ready, _, _ = select.select([self.sock], [], [], 0.5)
                if ready:
                    status, user, system = _DONE.unpack(_recv_exact(self.sock, _DONE.size))
                    return status, user + system
                if deadline is not None and time.monotonic() > deadline:
                    end_tree(pid)
                    deadline = None
        finally:
            self.lock.release()

    def poll(self, pid: int) -> tuple[int, float] | None:
        """`wait`'s answer if the run has ended, else None at once."""
        ready, _, _ = select.select([self.sock], [], [], 0)
        return self.wait(pid) if ready else None

    def close(self) -> None:
        import time

        self.sock.close()  # the zygote reads end-of-file and ends (with a run still in flight)
        deadline = time.monotonic() + 10
        while self.alive() and time.monotonic() < deadline:
            time.sleep(0.02)
        if self.alive():
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)


class ForkedProcess:
    """A run `spawn`ed by a zygote, as much of subprocess.Popen as jupyter_client's kernel provisioner uses: pid,
    poll, wait, send_signal, kill, terminate (`cpu`: its CPU seconds, once it has ended)."""

    stdin = stdout = stderr = None

    def __init__(self, zygote: Zygote, pid: int):
        self.zygote, self.pid, self.returncode, self.cpu = zygote, pid, None, None

    def _ended(self, done: tuple[int, float] | None) -> int | None:
        if done is not None:
            self.returncode, self.cpu = os.waitstatus_to_exitcode(done[0]), done[1]
        return self.returncode

    def poll(self) -> int | None:
        return self.returncode if self.returncode is not None else self._ended(self.zygote.poll(self.pid))

    def wait(self, timeout: float | None = None) -> int:
        """Its exit code; past `timeout` seconds its tree is killed first (the zygote is free again either way)."""
        return self.returncode if self.returncode is not None else self._ended(self.zygote.wait(self.pid, timeout))

    def send_signal(self, signum: int) -> None:
        if self.returncode is None:  # (not reaped yet, so the pid is still this run's)
            os.kill(self.pid, signum)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)


_ZYGOTES: dict[str, Zygote] = {}  # python -> its zygote
_STARTING = threading.Lock()


def zygote_for(python: str, env: dict[str, str]) -> Zygote:
    """This process's zygote for `python` (started the first time, and again if it died, with `env`'s thread
    settings); every variable of `env` is set in each run (`run_here` sets torch's threads from them too)."""
    with _STARTING:
        z = _ZYGOTES.get(python)
        if z is None or not z.alive():
            base = {k: v for k, v in os.environ.items() if k not in THREAD_VARS}
            z = _ZYGOTES[python] = Zygote.start(python, {**base, **{k: env[k] for k in THREAD_VARS if k in env}})
            _close_at_exit()
        return z


def fork_here() -> None:
    """Make this process's zygote a fork of this process, now, sharing the imports of PRELOAD with it instead of
    importing them twice -- how a pool process of `ttlib grade autograde` starts, while it has one thread and has
    seen no submission (the zygote never does)."""
    with _STARTING:
        if sys.executable in _ZYGOTES:
            return
        preload_libraries()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            try:  # the zygote: a session of its own, nothing of this process's open but its socket
                os.setsid()
                signal.signal(signal.SIGINT, signal.SIG_IGN)
                devnull = os.open(os.devnull, os.O_RDWR)
                os.dup2(devnull, 0)
                os.dup2(devnull, 1)
                keep = theirs.fileno()
                os.closerange(3, keep)
                os.closerange(keep + 1, 65536)
                _serve(theirs)
            finally:
                os._exit(1)
        theirs.close()
        _ZYGOTES[sys.executable] = Zygote(pid, ours)
        _close_at_exit()


def _close_at_exit() -> None:
    """close_all when this process exits: atexit, and multiprocessing's finalizers (a pool process ends without
    running atexit's)."""
    import atexit
    from multiprocessing import util

    if not getattr(_close_at_exit, "done", False):
        atexit.register(close_all)
        util.Finalize(None, close_all, exitpriority=0)
        _close_at_exit.done = True


def close_all() -> None:
    """End this process's zygotes (each reads end-of-file) and reap them: at this process's exit (registered with
    the first one), so that they end with it and their CPU time is counted in its children's."""
    for z in list(_ZYGOTES.values()):
        z.close()
    _ZYGOTES.clear()


def pids() -> set[int]:
    """The zygotes this process started (children of it that are no submission's)."""
    return {z.pid for z in _ZYGOTES.values()}


def _recv_exact(sock, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise OSError("the grading zygote ended")
        data += chunk
    return data


# ---- the zygote ----------------------------------------------------------------------------------------------------
def serve(fd: int) -> None:
    """The life of a zygote started afresh: import PRELOAD, say ready, then `_serve`."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # an interrupt is for the grader; the grader ends us
    sock = socket.socket(fileno=fd)
    preload_libraries()
    sys.stdout.flush()
    sys.stderr.flush()
    sock.sendall(b"R")
    _serve(sock)


def _serve(sock) -> None:
    """Fork a run per request and report its end, until the grading process goes (end-of-file). Never returns."""
    while True:
        try:
            message, fds, _, _ = socket.recv_fds(sock, 1, 3)
        except OSError:
            break
        if not message or len(fds) != 3:
            break
        pid = os.fork()
        if pid == 0:
            _child(sock, *fds)
        for f in fds:
            os.close(f)
        sock.sendall(_PID.pack(pid))
        status, usage = _reap(sock, pid)
        if usage is None:
            break
        sock.sendall(_DONE.pack(status, usage.ru_utime, usage.ru_stime))
    os._exit(0)


def preload_libraries() -> None:
    """Import PRELOAD and PRELOAD_TTLIB, and do what the hidden tests do the first time and would otherwise pay for
    in every run: every exercise module imported, and torch's dispatch modes warmed up (they import torch._dynamo on
    first use)."""
    import gc
    import importlib

    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError:  # an optional library: the runs import it themselves, if they need it
            pass
    for name in PRELOAD_TTLIB:
        importlib.import_module(name)
    from ttlib.exercises import all_exercises, refuse

    all_exercises()
    refuse.warm_up_dispatch()
    gc.collect()
    gc.freeze()  # what is imported stays shared with the children: their collections do not copy it


def _reap(sock, pid: int):
    """Wait for the child `pid`: (wait status, resource usage); (0, None) when the grader went meanwhile (the
    child's whole tree is ended first)."""
    from ttlib.grading.processes import end_tree

    while True:
        done, status, usage = os.wait4(pid, os.WNOHANG)
        if done:
            return status, usage
        readable, _, _ = select.select([sock], [], [], 0.02)
        if readable and not sock.recv(1, socket.MSG_PEEK):  # the grading process ended
            end_tree(pid)
            os.wait4(pid, 0)
            return 0, None


def _child(sock, request_fd: int, stdout_fd: int, stderr_fd: int) -> None:
    """A run: read its request, take its descriptors and environment, and become its wrapper. Never returns."""
    code = 126
    try:
        os.setsid()
        sock.close()
        with os.fdopen(request_fd, "rb") as f:
            request = json.loads(f.read())
        devnull = os.open(os.devnull, os.O_RDONLY)
        for fd, target in ((devnull, 0), (stdout_fd, 1), (stderr_fd, 2)):
            os.dup2(fd, target)
            os.close(fd)
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request["cwd"])
        from ttlib.grading.wrapper import main

        code = main(request["args"], run_in_place=run_here)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 126
    except BaseException as e:  # noqa: BLE001 (said on the run's stderr; the run ends with 126)
        os.write(2, f"ttlib zygote: could not start the run: {type(e).__name__}: {e}\n".encode())
    finally:
        _exit(code)


# ---- the run, in place of exec ------------------------------------------------------------------------------------
def run_here(argv: list[str]) -> None:
    """In the sandbox's confined process, forked from the zygote: run `python -m MODULE ARGS...` or `python -c CODE
    ARGS...` (argv) in this process, as a fresh interpreter would, then exit with its status. Never returns."""
    import builtins
    import importlib
    import runpy
    import tempfile
    import traceback

    flag, target, rest = argv[1], argv[2], argv[3:]
    # a fresh interpreter's state: Python's own signal dispositions, sys.path from this run's PYTHONPATH (the
    # sandbox's), no cached temporary folder (TMPDIR is the scratch folder's), fresh random states
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    zygote_paths = [p for p in sys.path[1:] if p not in _ZYGOTE_PYTHONPATH]
    sys.path[:] = [os.getcwd() if flag == "-m" else "",
                   *[p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p], *zygote_paths]
    sys.path_importer_cache.clear()
    importlib.invalidate_caches()
    tempfile.tempdir = None
    _after_fork()
    code = 0
    try:
        if flag == "-m":
            sys.argv = [target, *rest]
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            sys.argv = ["-c", *rest]
            exec(compile(target, "<string>", "exec"), {"__name__": "__main__", "__builtins__": builtins})
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if not isinstance(e.code, (int, type(None))):
            print(e.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 (as Python does: the traceback on stderr, status 1)
        traceback.print_exc()
        code = 1
    _exit(code)


def _exit(code: int) -> None:
    """End this forked process now (the zygote's atexit handlers and objects are not its to run), output flushed."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


_ZYGOTE_PYTHONPATH = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]


def _after_fork() -> None:
    """Module state the zygote's imports computed from its own environment, computed again from this run's."""
    sys.dont_write_bytecode = bool(os.environ.get("PYTHONDONTWRITEBYTECODE"))  # (the sandbox sets it)
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()  # numpy's global generator: entropy of its own, as in a new process
    refuse = sys.modules.get("ttlib.exercises.refuse")
    if refuse is not None:
        refuse._LIBRARIES = refuse._library_roots()  # its library folders include PYTHONPATH's
    threads = os.environ.get("OMP_NUM_THREADS", "")
    if "torch" in sys.modules and threads.isdigit() and int(threads) > 0:
        sys.modules["torch"].set_num_threads(int(threads))  # what torch reads at its start, from this run
