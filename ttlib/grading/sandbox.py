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
                                       stdout, stderr); with preload=True a Python command is forked from
                                       ttlib.grading.zygote (libraries imported once) in the same sandbox
    tree_usage(pid) -> Usage           CPU seconds, resident memory and process count of pid's descendants
    end_tree(pid, grace)               SIGTERM (when grace > 0), then SIGKILL to every descendant, then pid
    adopt_orphans(), end_orphans(keep) the grader as a second line: a subreaper itself, ending after each
                                       submission every child it did not have before (orphans that escaped)

(A kernel's own output cap, `limit_kernel_output`, is in ttlib.grading.output.)

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

The pieces: ttlib.grading.linux (the Linux calls, and what this machine offers), ttlib.grading.processes (process
trees, limits, the watchdog), ttlib.grading.wrapper (the wrapper process); this module puts them together.

What it needs from the system: Linux; a child subreaper (Linux >= 3.4); Landlock enabled for file rules (Linux >=
5.13 with `landlock` in the kernel's LSM list); unprivileged user namespaces for the PID and mount namespaces (not
where kernel.unprivileged_userns_clone=0 or AppArmor restricts them, as Ubuntu 24.04 does by default). Processes
are found through /proc/PID/task/TID/children (CONFIG_PROC_CHILDREN), or by reading every /proc/PID/stat without it.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

from ttlib.grading.linux import LINUX, Capabilities, capabilities  # noqa: F401 (part of this module's interface)
from ttlib.grading.processes import (  # noqa: F401 (as above)
    Limits,
    Usage,
    Watchdog,
    adopt_orphans,
    descendants,
    end_orphans,
    end_tree,
    own_children,
    own_memory,
    started,
    tree_usage,
)

__all__ = ["Capabilities", "LINUX", "Limits", "Result", "SYSTEM_READ", "Sandbox", "Usage", "Watchdog", "adopt_orphans",
           "capabilities", "descendants", "end_orphans", "end_tree", "fork", "own_children", "own_memory", "run",
           "started", "tree_usage", "ttlib_paths", "zygote_for_run"]


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

    def __init__(self, limits: Limits | None = None, readable=(), protected=(), tcp_ports=None, name: str = "run",
                 caps: Capabilities | None = None, grace: float = 1.0):
        self.limits, self.tcp_ports, self.grace = limits or Limits(), tcp_ports, grace
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

    def watch(self, pid: int, poll: float = 0.05, guard=None, forked: bool = False) -> Watchdog:
        """`forked`: `pid` is a wrapper forked from the zygote (its init's memory, the zygote's until it execs, is
        not the command's)."""
        self.watchdog = Watchdog(pid, self.limits, poll, include_root=not self.caps.sandboxed, guard=guard,
                                 children_memory=not (forked and self.caps.namespaces))
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
    while chunk := stream.read1(65536):  # what has arrived: a watch reads it as the run goes
        if kept < limit:
            out.append(chunk[:limit - kept])
            kept += len(out[-1])
            if kept >= limit:
                out.append(b"\n[ttlib sandbox: output over the limit, the rest was dropped]\n")


def run(argv: list[str], limits: Limits | None = None, readable=(), protected=(), env: dict | None = None,
        files: dict[str, bytes] | None = None, tcp_ports=None, name: str = "run", watch=None,
        preload: bool = False) -> Result:
    """Run `argv` in a fresh sandbox (its own scratch folder, removed afterwards) under `limits`, its stdout and
    stderr captured, and return what happened. It starts in the scratch folder, where `files` ({relative path:
    bytes}) are written first; its stdin is /dev/null. `env` defaults to this process's environment (then moved
    into the scratch folder, see Sandbox.environment). `watch(watchdog, stdout_chunks)`, asked at each of the
    watchdog's looks, may end the run early by returning a reason (then `Result.stopped`). `preload`: argv is
    `python -m MODULE ...` or `python -c CODE ...`, and its process is forked from this grading process's zygote
    (ttlib.grading.zygote: the libraries already imported) rather than started afresh, in the same sandbox."""
    start = time.monotonic()
    limits = limits or Limits()
    with Sandbox(limits, readable, protected, tcp_ports, name) as box:
        for relative, data in (files or {}).items():
            path = box.scratch / relative
            if not _inside(str(path), str(box.scratch)):
                raise ValueError(f"run(files=...): {relative!r} is not a path inside the scratch folder")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        pid, streams, wait, forked = _start(box, argv, box.environment(env), preload)
        out, err = [], []
        try:
            dog = box.watch(pid, guard=None if watch is None else lambda: watch(box.watchdog, out), forked=forked)
            readers = [threading.Thread(target=_read_capped, args=(s, limits.output_bytes, o), daemon=True)
                       for s, o in zip(streams, (out, err), strict=True)]
            for r in readers:
                r.start()
        except BaseException:  # nothing may run unwatched: end it (and free the zygote for the next run)
            end_tree(pid)
            wait(None)
            raise
        returncode, reaped_cpu = wait(None if limits.wall_seconds is None else limits.wall_seconds + 30)
        dog.close()
        for r in readers:
            r.join(timeout=5)
        for stream in streams:
            stream.close()
        cpu = dog.usage.cpu_seconds
        if reaped_cpu is not None and box.caps.sandboxed:  # the wrapper reaped everything below it: exact, to the end
            cpu = max(cpu, reaped_cpu)
        return Result(returncode, dog.stopped, cpu, dog.peak_memory, time.monotonic() - start, b"".join(out),
                      b"".join(err))


def _start(box: Sandbox, argv: list[str], env: dict, preload: bool):
    """Start `argv` in `box` -> (the wrapper's pid, its stdout and stderr as streams, wait(timeout) -> (exit code,
    CPU seconds of the wrapper and every child it reaped, or None), whether it was forked from the zygote)."""
    import subprocess

    zygote = zygote_for_run(box, argv, env) if preload else None
    if zygote is None:
        proc = subprocess.Popen(box.command(argv), env=env, cwd=box.scratch, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)

        def wait(timeout):
            rusage = _wait(proc, timeout)
            return proc.returncode, None if rusage is None else rusage.ru_utime + rusage.ru_stime

        return proc.pid, (proc.stdout, proc.stderr), wait, False
    (out_r, out_w), (err_r, err_w) = os.pipe(), os.pipe()
    try:
        forked = fork(box, zygote, argv, env, out_w, err_w)
    finally:
        os.close(out_w)
        os.close(err_w)

    def wait_forked(timeout):
        return forked.wait(timeout), forked.cpu

    return forked.pid, (open(out_r, "rb"), open(err_r, "rb")), wait_forked, True


def zygote_for_run(box: Sandbox, argv: list[str], env: dict):
    """The zygote (ttlib.grading.zygote) to fork `argv` from in `box`, or None where it starts afresh: no sandbox
    here, not a `python -m MODULE` or `python -c CODE` command, or no zygote (it said why on stderr)."""
    if not (box.caps.sandboxed and len(argv) > 2 and argv[1] in ("-m", "-c")):
        return None
    from ttlib.grading import zygote as zygotes

    try:
        return zygotes.zygote_for(argv[0], env)
    except OSError:  # the run starts afresh, in the same sandbox
        return None


def fork(box: Sandbox, zygote, argv: list[str], env: dict, stdout_fd: int, stderr_fd: int):
    """Run `argv` in `box`, its wrapper forked from `zygote` (zygote_for_run's), in the scratch folder, its stdout
    and stderr on these descriptors -> its ttlib.grading.zygote.ForkedProcess."""
    from ttlib.grading.zygote import ForkedProcess

    wrapper = box.command(argv)[3:]  # (the command is `python -m ttlib.grading.sandbox WRAPPER... -- ARGV`)
    return ForkedProcess(zygote, zygote.spawn(wrapper, env, str(box.scratch), stdout_fd, stderr_fd))


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


if __name__ == "__main__":  # the wrapper: python -m ttlib.grading.sandbox --scratch DIR ... -- ARGV
    from ttlib.grading.wrapper import main

    sys.exit(main())
