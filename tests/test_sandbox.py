"""ttlib.grading.sandbox: what a sandboxed process cannot do, and what is counted and ended. Real processes, real
Landlock and namespaces (Linux); each test takes a second or so.

Most tests run three times: with the user + PID + mount namespaces this machine offers ("namespaces"), without them
(TTLIB_SANDBOX_DISABLE=namespaces: a system that forbids unprivileged user namespaces), where the wrapper alone,
a subreaper, must find and end every process, and with the namespaces in a process forked from the grader's zygote
("zygote": ttlib.grading.zygote, how the hidden tests start) instead of a fresh one.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from ttlib.grading import sandbox

MARK = "ttlib-sandbox-unit-marker"
pytestmark = pytest.mark.skipif(not sandbox.LINUX, reason="the sandbox is Linux's")


FORKED = {"preload": False}  # "zygote" mode: python() forks its process from the zygote


@pytest.fixture(params=["namespaces", "no namespaces", "zygote"])
def mode(request, monkeypatch):
    if request.param != "no namespaces":
        if not sandbox.capabilities().namespaces:
            pytest.fail("this machine forbids unprivileged user namespaces; run the tests where they work")
    else:
        monkeypatch.setenv("TTLIB_SANDBOX_DISABLE", "namespaces")
    monkeypatch.setitem(FORKED, "preload", request.param == "zygote")
    return request.param


def python(code: str, limits: sandbox.Limits | None = None, mark: str = MARK, **kw) -> sandbox.Result:
    """Run Python `code` in a sandbox; the marker is in its command line (and its children's, by convention). A
    test file of its own passes its own mark: files run side by side (pytest -n) must not see each other's. (In
    "zygote" mode the process itself is a fork of the zygote: its own command line is the zygote's.)"""
    kw.setdefault("preload", FORKED["preload"])
    return sandbox.run([sys.executable, "-c", textwrap.dedent(code), mark], limits or sandbox.Limits(), **kw)


def marked(mark: str = MARK, in_environment: re.Pattern | None = None) -> list[int]:
    """Live processes (not this one) carrying `mark` in their command line, or whose environment matches
    `in_environment` (a bytes pattern)."""
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read()
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
            environ = b""
            if in_environment:
                with open(f"/proc/{pid}/environ", "rb") as f:
                    environ = f.read()
        except OSError:
            continue
        if state != "Z" and (mark.encode() in cmdline or (in_environment and in_environment.search(environ))):
            out.append(int(pid))
    return out


def gone_soon(seconds=3.0, mark: str = MARK) -> list[int]:
    deadline = time.monotonic() + seconds
    while marked(mark) and time.monotonic() < deadline:
        time.sleep(0.05)
    return marked(mark)


# ---- files ----------------------------------------------------------------------------------------------------------
def test_this_machine_offers_landlock_and_a_subreaper():
    caps = sandbox.capabilities()
    assert caps.landlock_abi >= 1 and caps.subreaper, caps.report()
    assert caps.missing() == [] or caps.landlock_abi < 6 or not caps.namespaces


def test_writes_go_to_the_scratch_folder_only(mode, tmp_path):
    outside = tmp_path / "outside.txt"
    r = python(f"""
        import os
        open("mine.txt", "w").write("ok")  # the scratch folder: the current folder
        os.makedirs("deep/er", exist_ok=True); os.rename("mine.txt", "deep/er/moved.txt")
        print(open("deep/er/moved.txt").read(), os.environ["HOME"].startswith(os.getcwd()))
        for path in [{str(outside)!r}, "/tmp/{MARK}", os.path.expanduser("~root/{MARK}"), {sys.prefix!r} + "/x"]:
            try:
                open(path, "w").write("escaped")
                print("WROTE", path)
            except OSError as e:
                print("refused", e.errno)
        """)
    assert r.returncode == 0, r.stderr.decode()
    lines = r.stdout.decode().split()
    assert lines[:2] == ["ok", "True"] and "WROTE" not in lines and lines.count("refused") == 4, lines
    assert not outside.exists() and not Path(f"/tmp/{MARK}").exists()


def test_other_students_and_the_gradebook_are_out_of_reach(mode, tmp_path):
    """A course folder inside a folder that was asked to be readable stays unreadable when it is protected."""
    course = tmp_path / "course"
    other = course / "submitted" / "other" / "02" / "02.ipynb"
    other.parent.mkdir(parents=True)
    other.write_text('{"their": "work"}')
    gradebook = course / "gradebook.db"
    gradebook.write_bytes(b"SQLite format 3\0 scores")
    before = {p: p.read_bytes() for p in (other, gradebook)}
    stamps = {p: p.stat().st_mtime_ns for p in (other, gradebook)}
    r = python(f"""
        import os, shutil
        for path in [{str(other)!r}, {str(gradebook)!r}]:
            for how in ("r", "r+b", "a"):
                try:
                    open(path, how).close(); print("OPENED", how, path)
                except OSError as e:
                    print("refused", e.errno)
            try:
                os.unlink(path); print("DELETED", path)
            except OSError as e:
                print("refused", e.errno)
        for folder in [{str(course)!r}, {str(course / "submitted")!r}]:
            try:
                print("LISTED", os.listdir(folder))
            except OSError as e:
                print("refused", e.errno)
        try:
            shutil.rmtree({str(other.parent)!r}); print("DELETED tree")
        except OSError as e:
            print("refused", e.errno)
        """, readable=[str(tmp_path)], protected=[str(course)])
    text = r.stdout.decode()
    assert r.returncode == 0, r.stderr.decode()
    assert "OPENED" not in text and "DELETED" not in text and "LISTED" not in text, text
    assert text.count("refused") == 2 * 4 + 2 + 1, text
    assert {p: p.read_bytes() for p in before} == before
    assert {p: p.stat().st_mtime_ns for p in stamps} == stamps


def test_ttlib_its_assets_and_the_datasets_are_readable_not_the_repository(mode):
    repo = Path(sandbox.ttlib_paths()["package"]).parent
    # the datasets folder as Minari makes it: a run with its own MINARI_DATASETS_PATH may not have built one yet
    Path(sandbox.ttlib_paths()["datasets"]).mkdir(parents=True, exist_ok=True)
    r = python(f"""
        import os, ttlib, ttlib.grading.sandbox
        print(os.path.realpath(ttlib.__file__).startswith({str(repo / "ttlib")!r}))
        print(len(os.listdir(os.environ["TTLIB_ASSETS"])) > 0, os.path.isdir(os.environ["MINARI_DATASETS_PATH"]))
        for path in [{str(repo / "nbgrader_config.py")!r}, {str(repo / "notebooks")!r}, {str(repo)!r}]:
            try:
                (os.listdir if os.path.isdir(path) else open)(path); print("READ", path)
            except OSError as e:
                print("refused", e.errno)
        """, protected=[str(repo / "notebooks"), str(repo)])
    assert r.returncode == 0, r.stderr.decode()
    assert r.stdout.decode().splitlines() == ["True", "True True", *["refused 13"] * 3], r.stdout


@pytest.mark.parametrize("abi", range(1, 8))
def test_every_landlock_abi_keeps_files_out_of_reach(abi, tmp_path):
    caps = sandbox.capabilities()
    if abi > caps.landlock_abi:
        pytest.skip(f"this kernel offers Landlock ABI {caps.landlock_abi}")
    secret = tmp_path / "secret"
    secret.write_text("s")
    older = dataclasses.replace(caps, landlock_abi=abi)
    code = f"""
        import os
        open("mine", "w").write("ok")
        for path, how in [({str(secret)!r}, "r"), ({str(secret)!r}, "a"), ({str(tmp_path / "new")!r}, "w")]:
            try:
                open(path, how); print("ESCAPED", path)
            except OSError:
                print("refused")
        """
    with sandbox.Sandbox(caps=older) as box:
        done = subprocess.run(box.command([sys.executable, "-c", textwrap.dedent(code)]), env=box.environment(),
                              cwd=box.scratch, capture_output=True, text=True, timeout=60)
        assert f"--landlock {abi}" in " ".join(box.command(["x"]))
    assert done.stdout.split() == ["refused"] * 3, done.stdout + done.stderr
    assert secret.read_text() == "s" and not (tmp_path / "new").exists()


def test_a_file_over_the_size_limit_is_an_error_not_a_crash(mode):
    r = python("""
        f = open("big", "wb")
        f.write(b"x" * (1 << 20))
        try:
            f.write(b"x" * (2 << 20)); f.flush(); print("WROTE")
        except OSError as e:
            print("refused", e.errno)
        """, sandbox.Limits(file_size_bytes=2 << 20))
    assert r.returncode == 0, r.stderr.decode()
    assert r.stdout.decode().split() == ["refused", "27"]  # EFBIG


# ---- processes ------------------------------------------------------------------------------------------------------
SETSID_SLEEPER = f"""
    import os, subprocess, sys, time
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "{MARK}"], start_new_session=True)
    double = "import os, time; os.fork() and os._exit(0); os.setsid(); os.fork() and os._exit(0); time.sleep(60)"
    subprocess.run([sys.executable, "-c", double, "{MARK}"])
    stubborn = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"
    subprocess.Popen([sys.executable, "-c", stubborn, "{MARK}"], start_new_session=True)
    time.sleep(0.5)
    print("left three")
"""


def test_setsid_and_double_forked_processes_end_with_the_run(mode):
    assert marked() == []
    r = python(SETSID_SLEEPER, sandbox.Limits())
    assert r.stdout.decode().split() == ["left", "three"], r.stderr.decode()
    assert gone_soon() == [], "a process outlived its sandbox"
    assert r.wall_seconds < 20


def test_stopping_the_wrapper_ends_every_descendant(mode):
    """SIGTERM to the wrapper (what jupyter_client sends a kernel it shuts down): TERM, a grace, then KILL."""
    with sandbox.Sandbox(grace=0.5) as box:
        code = textwrap.dedent(SETSID_SLEEPER) + "\ntime.sleep(60)\n"
        proc = subprocess.Popen(box.command([sys.executable, "-c", code, MARK]), env=box.environment(),
                                cwd=box.scratch, stdout=subprocess.PIPE, start_new_session=True)
        assert proc.stdout.readline().split() == [b"left", b"three"]
        assert len(marked()) >= 4
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 128 + signal.SIGTERM
    assert gone_soon() == []


def test_the_tree_ends_when_the_grader_dies(mode, tmp_path):
    """The grader killed outright (SIGKILL): the wrapper notices (PR_SET_PDEATHSIG) and ends its tree."""
    grader = textwrap.dedent(f"""
        import subprocess, sys, time
        from ttlib.grading import sandbox
        box = sandbox.Sandbox()
        code = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; "
        code += "time.sleep(60)', '{MARK}'], start_new_session=True); print('up', flush=True); time.sleep(60)"
        proc = subprocess.Popen(box.command([sys.executable, "-c", code, "{MARK}"]), env=box.environment(),
                                cwd=box.scratch, stdout=subprocess.PIPE)
        print(proc.stdout.readline().decode().strip(), flush=True)
        time.sleep(60)
        """)
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    proc = subprocess.Popen([sys.executable, "-c", grader], stdout=subprocess.PIPE, env=env)
    assert proc.stdout.readline().strip() == b"up"
    assert len(marked()) >= 2
    proc.kill()
    proc.wait()
    assert gone_soon(5) == []


def test_a_run_forked_from_the_zygote_is_fresh_and_leaves_nothing_in_it():
    """The zygote's runs (how the hidden tests start): each a new process, forked with the libraries already
    imported, that sees nothing an earlier run did -- the zygote itself never runs a line of them."""
    from ttlib.grading import zygote

    code = f"""
        import os, sys
        import ttlib
        print("torch" in sys.modules, getattr(ttlib, "LEFT_BY_AN_EARLIER_RUN", "nothing"), os.getpid())
        ttlib.LEFT_BY_AN_EARLIER_RUN = "a secret"  # in this run's process only
        print("not preloaded:", *sorted(set({zygote.PRELOAD_TTLIB!r}) - set(sys.modules)), file=sys.stderr)
        """
    first, second = (python(code, preload=True) for _ in range(2))
    assert first.returncode == second.returncode == 0, second.stderr.decode()
    missing = [line for line in second.stderr.decode().splitlines() if line.startswith("not preloaded:")]
    assert missing == ["not preloaded:"], second.stderr.decode()  # the course's modules (a warning may print too)
    # torch in sys.modules: forked from the zygote, which imported it (`import ttlib` does not)
    assert first.stdout.split()[:2] == second.stdout.split()[:2] == [b"True", b"nothing"], second.stdout
    assert first.stdout.split()[2] == second.stdout.split()[2] == b"2"  # each its PID namespace's first process
    assert len(zygote.pids()) == 1 and zygote.pids() <= sandbox.own_children()


def test_the_zygote_and_its_runs_end_when_the_grader_dies(tmp_path):
    """The grader killed outright (SIGKILL): its zygote reads end-of-file, ends the run in flight, and ends."""
    grader = textwrap.dedent(f"""
        import sys, threading, time
        from ttlib.grading import sandbox, zygote
        code = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; "
        code += "time.sleep(60)', '{MARK}'], start_new_session=True); time.sleep(60)"
        threading.Thread(target=sandbox.run, args=([sys.executable, "-c", code],), kwargs={{"preload": True}},
                         daemon=True).start()
        while not zygote.pids():
            time.sleep(0.05)
        print(*zygote.pids(), flush=True)
        time.sleep(120)
        """)
    proc = subprocess.Popen([sys.executable, "-c", grader], stdout=subprocess.PIPE, env={**os.environ,
                                                                                       "TMPDIR": str(tmp_path)})
    zygote_pid = int(proc.stdout.readline())
    deadline = time.monotonic() + 60
    while not marked() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert marked(), "the run never started"
    proc.kill()
    proc.wait()
    assert gone_soon(5) == []
    stat, deadline = Path(f"/proc/{zygote_pid}/stat"), time.monotonic() + 5
    while stat.exists() and stat.read_text().rsplit(")", 1)[1].split()[0] not in "ZX" and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] in "ZX", "the zygote outlived its grader"


def test_the_grading_pool_and_its_fork_server_end_when_the_grader_dies(tmp_path):
    """`ttlib grade autograde`'s pool (layouts.pool_context: processes forked from a fork server that imported the
    libraries once), one of them running a sandboxed submission forked from its zygote: the grader killed outright
    (SIGKILL), every process it started ends -- the fork server, the pool, their zygotes, the submission's tree."""
    import psutil

    grader = textwrap.dedent(f"""
        import sys, time
        from concurrent.futures import ProcessPoolExecutor
        from ttlib.grading import sandbox
        from ttlib.grading.layouts import pool_context
        from ttlib.grading.worker import worker_started
        code = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; "
        code += "time.sleep(60)', '{MARK}'], start_new_session=True); time.sleep(60)"
        if __name__ == "__main__":
            pool = ProcessPoolExecutor(2, mp_context=pool_context(), initializer=worker_started)
            pool.submit(sandbox.run, [sys.executable, "-c", code], preload=True)
            print("up", flush=True)
            time.sleep(120)
        """)
    (tmp_path / "grader.py").write_text(grader)
    proc = subprocess.Popen([sys.executable, str(tmp_path / "grader.py")], stdout=subprocess.PIPE,
                            env={**os.environ, "TMPDIR": str(tmp_path)})
    assert proc.stdout.readline().strip() == b"up"
    deadline = time.monotonic() + 120
    while not marked() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert marked(), "the submission never started"
    started = psutil.Process(proc.pid).children(recursive=True)
    assert len(started) >= 5, started  # the fork server, two pool processes, a zygote, the submission's tree
    proc.kill()
    proc.wait()
    assert gone_soon(5) == []
    _, alive = psutil.wait_procs(started, timeout=10)
    assert [p for p in alive if p.status() != psutil.STATUS_ZOMBIE] == [], "a process outlived its grader"


def test_the_grader_ends_orphans_that_reach_it():
    """The second line: a grader that is a subreaper ends, after a submission, every child it did not have."""
    code = textwrap.dedent(f"""
        import subprocess, sys, time
        from ttlib.grading import sandbox
        assert sandbox.adopt_orphans()
        before = sandbox.own_children()
        double = "import os, time; os.fork() and os._exit(0); os.setsid(); time.sleep(60)"
        subprocess.run([sys.executable, "-c", double, "{MARK}"])  # unsandboxed: its sleeper comes to us
        time.sleep(0.3)
        strays = sandbox.end_orphans(before)
        print(len(strays), sandbox.own_children() == before)
        """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["1", "True"], done.stdout + done.stderr
    assert marked() == []


def test_memory_is_counted_over_the_tree_setsid_children_included(mode):
    # a process forked from the zygote holds the libraries it preloaded from the start: the limit is above that
    base = python("import time; time.sleep(1)").peak_memory_bytes if mode == "zygote" else 0
    r = python(f"""
        import subprocess, sys, time
        hog = "import time; held = [b'x' * (32 << 20) for _ in range(16)]; time.sleep(60)"
        subprocess.Popen([sys.executable, "-c", hog, "{MARK}"], start_new_session=True)
        time.sleep(60)
        """, sandbox.Limits(memory_bytes=base + 300 * 2**20))
    assert r.stopped == "memory" and r.peak_memory_bytes > base + 300 * 2**20, r
    assert r.wall_seconds < 30
    assert gone_soon() == []


def test_cpu_time_is_counted_over_the_tree_reaped_children_included(mode):
    burn = "import time\\nt = time.process_time()\\nwhile time.process_time() - t < 0.5: pass"
    r = python(f"""
        import os, subprocess, sys, time
        burn = "{burn}"
        subprocess.run([sys.executable, "-c", burn])  # a child, reaped by its parent
        orphan = "import os; os.setsid(); os.fork() or exec(" + repr(burn) + ")"  # its child outlives it
        subprocess.run([sys.executable, "-c", orphan])
        exec(burn)  # the command itself
        time.sleep(1)  # the orphan (reaped by the wrapper or the namespace's init) finishes
        """)
    assert r.returncode == 0, r.stderr.decode()
    assert r.cpu_seconds >= 1.4, r.cpu_seconds  # three times 0.5 s of CPU, less the clock's ticks


def test_a_cpu_limit_ends_the_tree(mode):
    r = python("while True: pass", sandbox.Limits(cpu_seconds=1.0))
    assert r.stopped == "cpu time" and 1.0 <= r.cpu_seconds < 3.0, r


def test_output_is_capped(mode):
    r = python("import os, sys\nsys.stdout.write('x' * (4 << 20))\nsys.stdout.flush()\nos.write(2, b'y' * (4 << 20))",
               sandbox.Limits(output_bytes=64 << 10))
    assert r.returncode == 0
    for stream in (r.stdout, r.stderr):
        assert 64 << 10 <= len(stream) < (64 << 10) + 200 and b"output over the limit" in stream


def test_the_sandbox_cannot_signal_the_grader(mode):
    caps = sandbox.capabilities()
    if caps.landlock_abi < 6 and mode == "no namespaces":
        pytest.skip("signals are scoped from Landlock ABI 6")
    got = []
    old = signal.signal(signal.SIGUSR1, lambda *a: got.append(1))
    try:
        r = python(f"""
            import os, signal
            try:
                os.kill({os.getpid()}, signal.SIGUSR1); print("SENT")
            except OSError as e:
                print("refused", e.errno)
            """)
        time.sleep(0.2)
    finally:
        signal.signal(signal.SIGUSR1, old)
    assert r.stdout.decode().split()[0] == "refused" and got == [], r.stdout


def test_tcp_can_be_limited_to_given_ports():
    if sandbox.capabilities().landlock_abi < 4:
        pytest.skip("TCP rules need Landlock ABI 4")
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    code = f"""
        import socket
        try:
            socket.create_connection(("127.0.0.1", {port}), timeout=5); print("connected")
        except OSError as e:
            print("refused", e.errno)
        """
    try:
        assert python(code, tcp_ports=()).stdout.split()[0] == b"refused"
        assert python(code, tcp_ports=(port,)).stdout.split() == [b"connected"]
    finally:
        server.close()


# ---- where a guarantee is missing -----------------------------------------------------------------------------------
def test_without_landlock_the_report_says_files_are_not_protected(monkeypatch, tmp_path):
    monkeypatch.setenv("TTLIB_SANDBOX_DISABLE", "landlock")
    caps = sandbox.capabilities()
    assert caps.landlock_abi == 0 and caps.sandboxed
    assert any("files are NOT protected" in m for m in caps.missing())
    outside = tmp_path / "outside.txt"
    r = python(textwrap.dedent(SETSID_SLEEPER) + f"\nopen({str(outside)!r}, 'w').write('x')\n")
    assert outside.exists(), "the warning is true: without Landlock a submission writes where it likes"
    assert r.stdout.decode().split() == ["left", "three"]
    assert gone_soon() == [], "the subreaper still ends what it started"


def test_without_any_sandbox_the_command_runs_as_is_and_is_still_measured(monkeypatch):
    monkeypatch.setenv("TTLIB_SANDBOX_DISABLE", "all")
    caps = sandbox.capabilities()
    assert not caps.sandboxed and "no sandbox" in caps.missing()[0]
    with sandbox.Sandbox() as box:
        assert box.command(["python", "x"]) == ["python", "x"]
    r = python("held = b'x' * (200 << 20)\nimport time; time.sleep(0.5)", sandbox.Limits(memory_bytes=100 * 2**20))
    assert r.stopped == "memory"


def test_grading_warns_once_per_run_about_what_does_not_hold(monkeypatch, caplog):
    from ttlib.grading.execute import _WARNED, BoundedExecute, budgets

    monkeypatch.setenv("TTLIB_SANDBOX_DISABLE", "landlock,namespaces")
    monkeypatch.setattr("ttlib.grading.execute._WARNED", set())
    executor = BoundedExecute()
    executor._budgets = budgets(executor)  # what preprocess() sets before a kernel starts
    caplog.set_level(logging.WARNING)
    executor.log = logging.getLogger("grading")
    for _ in range(3):
        executor._make_sandbox({}).close()
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 2 and "files are NOT protected" in warnings[0] and "namespace" in warnings[1], warnings
    assert _WARNED == set(), "the real run's record is untouched"


def test_the_doctor_says_what_holds(capsys):
    from ttlib.cli import main as cli

    assert cli.main(["grade", "doctor"]) == 0
    out = capsys.readouterr().out
    assert f"Landlock ABI {sandbox.capabilities().landlock_abi}" in out and "holds:" in out


def test_grading_waits_for_a_slow_kernels_output_and_says_so_when_it_never_comes():
    """nbclient waits 4 s on the clock for a cell's last output once the kernel has answered, and nbgrader makes
    that wait an error that stops the notebook: on a busy machine an honest submission lost every point to it.
    Grading waits `iopub_timeout` (120 s); when even that runs out, the notebook says which wait ran out."""
    import nbformat

    from ttlib.grading.execute import BoundedExecute

    flood = "for i in range(3000):\n    print(i, flush=True)"  # 3000 messages: the last arrives after the reply
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(flood), nbformat.v4.new_code_cell(flood)])
    nb.cells[1].metadata["nbgrader"] = {"grade": True, "grade_id": "t", "points": 1}
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    assert BoundedExecute().iopub_timeout >= 60
    out, _ = BoundedExecute(hidden_tests=False).preprocess(nbformat.from_dict(nb), {})
    assert "".join(o.get("text", o.get("ename", "")) for o in out.cells[1].outputs).endswith("2999\n")
    out, _ = BoundedExecute(hidden_tests=False, iopub_timeout=0).preprocess(nbformat.from_dict(nb), {})
    [error] = out.cells[1].outputs  # its own wait ran out, or the answer's did and it was not run
    assert error.ename in ("CellTimeoutError", "NotRun") and "output did not arrive within 0 s" in error.evalue, error


def test_what_the_grader_imports_is_not_taken_for_a_kernels_output():
    """The guard against a kernel's output piling up in the grading process counts what the grader grows by. The
    grader's own first import of ttlib.exercises (torch, about 500 MiB) once fell in the first submission of a run
    and killed its kernel as a flood: an honest student got 0. Here, in a fresh process and with a guard of 150
    MiB, the first notebook runs whole."""
    script = textwrap.dedent('''
        import json, sys
        import nbformat
        from ttlib.grading.execute import BoundedExecute
        assert "torch" not in sys.modules, "the grader has not imported torch yet"
        nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 1"),
                                             nbformat.v4.new_code_cell("import time; time.sleep(1); print(x)")])
        nb.cells[1].metadata["nbgrader"] = {"grade": True, "grade_id": "t", "points": 1}
        nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
        out, _ = BoundedExecute(hidden_tests=False, grader_memory_limit=150 * 2**20).preprocess(nb, {})
        print(json.dumps(out.cells[1].outputs))
    ''')
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    outputs = json.loads(result.stdout.strip().splitlines()[-1])
    assert [o.get("text") for o in outputs] == ["1\n"], outputs



@pytest.mark.parametrize("preload", [True, False], ids=["forked kernel", "fresh kernel"])
def test_a_grading_kernel_is_forked_fresh_and_confined_and_can_be_interrupted(preload, tmp_path):
    """Grading forks each kernel from the zygote (`BoundedExecute.preload`, the default: PyTorch and ttlib already
    imported, a second instead of seconds to start) or starts it afresh: either way it is a process of its own that
    sees nothing an earlier kernel did, writes only its scratch folder, and stops a looping cell when interrupted
    at its CPU budget, the next cells still running."""
    import nbformat

    from ttlib.grading import zygote
    from ttlib.grading.execute import BoundedExecute

    outside = tmp_path / "outside.txt"
    cells = ["import sys, ttlib\nprint('torch' in sys.modules, getattr(ttlib, 'LEFT_BEHIND', 'nothing'))\n"
             "ttlib.LEFT_BEHIND = 'a secret'\nimport torch  # as every graded notebook's setup does",
             f"try:\n    open({str(outside)!r}, 'w').write('x')\nexcept OSError as e:\n    print(type(e).__name__)",
             "while True:\n    pass",
             "print('after the loop')"]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    for i, c in enumerate(nb.cells):
        c.metadata["nbgrader"] = {"grade": True, "grade_id": f"t{i}", "points": 1}
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    budget = 2 if preload else 6  # CPU s a cell: the loop's, and room for a fresh kernel's `import torch` (about 3) on
    # a busy machine (a forked kernel has it imported already)
    runs = [BoundedExecute(hidden_tests=False, preload=preload, timeout=budget).preprocess(nbformat.from_dict(nb),
                                                                                          {})[0] for _ in range(2)]
    for out in runs:
        text = ["".join(o.get("text", o.get("evalue", "")) for o in c.outputs) for c in out.cells]
        assert text[0].split() == [str(preload), "nothing"], text  # torch imported already only when forked
        assert text[1].strip() == "PermissionError" and not outside.exists(), text
        assert f"used its {budget} CPU seconds" in text[2] and text[3] == "after the loop\n", text
    cpu = [out.metadata["ttlib"]["run"]["cpu"] - budget for out in runs]  # CPU s of each kernel but its loop's
    print(f"preload={preload}: a kernel's CPU seconds but the loop's: {cpu}")
    if preload:  # started with the libraries imported: a fresh kernel spends 4 or more CPU s importing them
        assert max(cpu) < 2.5 and zygote.pids(), cpu
