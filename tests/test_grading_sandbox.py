"""Grading strangers' code, contained: a class of notebook 02 (cheap) graded with real nbgrader, the commands of the
README's instructor guide run as written, in which some students attack the others, the gradebook and the grader.
All of it is graded beside a CPU hog: the grading and a busy process share one core (the machine's other cores stay
free for the rest of the suite).

Two runs, as when submissions come in over days:
1. `nbgrader autograde`, one at a time: "ada" (every exercise right), "bob" (one plausible bug) and "breaker" (a
   hook that makes each test cell show
   1000 as its result, which nbgrader reads as partial credit and refuses: "partial credit cannot be greater than
   maximum points"), graded with `--BoundedExecute.strip_score_outputs=False --BoundedExecute.hidden_tests=False`
   (the hidden tests' verdicts would drop those outputs too) so that nbgrader's bookkeeping fails
   for "breaker": it gets a clear 0 with the reason, an autograded notebook and feedback; ada and bob are graded
   normally. Then their feedback is generated.
2. `ttlib grade autograde --jobs 2`, two at a time, the attackers graded in one batch with their victims "fay"
   (every exercise right; graded beside the vandal) and "gus" (one plausible bug):
   - "eve", a vandal: rewrites and deletes the others' submitted/, autograded/ and feedback/ folders, rewrites
     gradebook.db, writes outside its folder, and leaves a `setsid` process and a double-forked one that sleep and
     then try it all again;
   - "hog": its last exercise starts a `setsid` child that allocates past the memory limit;
   - "flood": every exercise right, and its first one prints 320 MiB (and writes 64 MiB to its stdout file
     descriptor);
   - "scorer": blank, with the same hook as "breaker" but showing 2 (each test's maximum or less): nbgrader would
     give it points for failing tests;
   - the sleeper ("fell_asleep"): its bin_means sleeps forever and ignores SIGTERM and SIGINT (idle limits lowered:
     IDLE_* below). Students are graded in alphabetical order; its name puts it third, so that its idle time
     passes while the others are graded beside it, not alone at the end with the hog still running.
Checked afterwards: the right answers keep full marks under the hog (time is counted in CPU seconds); no file of
ada, bob or breaker changed (hashes before and after), nor fay's and gus's submissions, nor anyone's grades;
fay and gus get their points; nothing the submissions started is alive (every process is scanned for the marker
their command lines carry and for a sandbox's environment); the grading processes' memory stayed bounded while
"flood" printed (none grew by 200 MiB past its size once set up). Last, a run after the batch grades only a new
submission.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import nbformat
import pytest
from nbgrader.api import Gradebook
from test_grading import (
    CHEAP,
    REPO,
    answered,
    cell,
    collect,
    one_bug,
    points,
    read,
    solution_notebook,
    student_notebook,
)
from test_sandbox import marked

from tools.outputs import one_core_beside_a_hog
from ttlib.grading import assignments as grade
from ttlib.grading import processes, sandbox

MARK = "ttlib-sandbox-test-marker"  # in the command line of every process an attacker starts
CELL_CPU = 20  # CPU seconds a cell may use; a correct submission uses about 7 in all
NOTEBOOK_CPU = 35
IDLE_CELL, IDLE_NOTEBOOK, IDLE_EXERCISE = 6, 12, 4  # idle seconds (defaults 60, 120, 20): the sleeper's bounds;
# a correct submission spends well under a second idle, however busy the machine (waiting for a CPU is not idle)
JOBS = 2
MEMORY_GB = 2.0
SLEEPER = "fell_asleep"  # the sleeper: graded third, after eve and fay (see above)
FLOOD_MIB = 320
POINTS = points(CHEAP)  # {"02-uniform-test": 3, "02-quantile-test": 2, "02-decode-test": 2}
FULL = sum(POINTS.values())

ATTACK = r'''
import glob, os, pwd, shutil, sqlite3
MARK = "ttlib-sandbox-test-marker"
A = "02_trajectory_tokenizer"
done = []


def attempt(what, path, action):
    try:
        action()
        done.append(f"{what} {path}")
    except Exception as e:
        done.append(f"could not {what} {path}: {getattr(e, 'strerror', None) or e}")


def overwrite(path):
    with open(path, "w") as f:
        f.write("vandalized")


def zero(db):
    con = sqlite3.connect(db)
    con.execute("update grade set auto_score = 0")
    con.execute("update grade set manual_score = 7")
    con.commit()


roots = {os.environ.get("TTLIB_COURSE_DIR", "/nonexistent")}
pid = os.getpid()
while pid > 1:  # the grader's folder, found through the parents' current folders
    try:
        roots.add(os.path.join(os.readlink(f"/proc/{pid}/cwd"), "grading"))
        pid = int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        break
for root in sorted(roots):
    for sub in ("submitted", "autograded", "feedback"):
        known = {os.path.join(root, sub, name) for name in ("ada", "bob", "breaker")}  # a class list, say
        for victim in sorted(known | set(glob.glob(os.path.join(root, sub, "*")))):
            if os.path.basename(victim) == "eve":
                continue
            files = {os.path.join(victim, A, A + ext) for ext in (".ipynb", ".html")}
            for path in sorted(files | set(glob.glob(os.path.join(victim, "**", "*.*"), recursive=True))):
                attempt("rewrite", path, lambda: overwrite(path))
            attempt("delete", victim, lambda: shutil.rmtree(victim))
    db = os.path.join(root, "gradebook.db")
    if os.path.exists(db):
        attempt("write", db, lambda: zero(db))
for outside in ("/tmp/" + MARK, os.path.join(pwd.getpwuid(os.getuid()).pw_dir, MARK)):
    attempt("write", outside, lambda: overwrite(outside))
print("\n".join(done) or "found nothing to attack")
'''

VANDAL = f'''import os, subprocess, sys, time
ATTACK = {ATTACK!r}
exec(ATTACK)
# a process that outlives grading (setsid), and a double-forked one: both sleep, then attack again
later = "import time; time.sleep(3); exec(" + repr(ATTACK) + ")"
subprocess.Popen([sys.executable, "-c", later, "{MARK}"], start_new_session=True, stdin=subprocess.DEVNULL,
                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
double = "import os, sys; os.fork() and os._exit(0); os.setsid(); os.fork() and os._exit(0); " + later
subprocess.run([sys.executable, "-c", double, "{MARK}"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
               stderr=subprocess.DEVNULL)
print("left two processes behind")
'''

ESCAPING_HOG = f'''import subprocess, sys, time
hog = "import time; held = [b'x' * (100 << 20) for _ in range(60) if time.sleep(0.02) is None]; time.sleep(60)"
subprocess.Popen([sys.executable, "-c", hog, "{MARK}"], start_new_session=True)  # 6 GiB, outside the kernel's session
time.sleep(60)  # the kernel itself holds nothing
'''

SLEEPING_DECODE = '''import signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)


def bin_means(x, edges):  # the exercise's check calls it first
    while True:
        try:
            time.sleep(1)
        except BaseException:  # an interrupt, too
            pass


def decode(bins, means):
    return bin_means(None, None)
'''

FLOOD = f'''import os
for _ in range({FLOOD_MIB}):
    print("x" * (1 << 20))
os.write(1, b"y" * (64 << 20))  # past sys.stdout: the kernel's file descriptor
'''


def score_hook(value) -> str:
    """A hook that makes every later cell show `value` as its result first, which nbgrader reads as the score of a
    test cell."""
    return f'''ip = get_ipython()
ip.events.register("pre_run_cell", lambda *args: ip.displayhook({value}))
'''


def class_of_02():
    solutions = dict.fromkeys(["02-uniform", "02-quantile", "02-decode"])
    blank = student_notebook(CHEAP)
    first = answered(CHEAP, {"02-uniform": None})  # uniform solved, the rest left as released

    def with_code(nb, grade_id, code):
        nb = nbformat.from_dict(json.loads(json.dumps(nb)))
        cell(nb, grade_id).source = code + "\n" + cell(nb, grade_id).source
        return nb

    first_run = {"ada": answered(CHEAP, solutions),
                 "bob": one_bug(CHEAP, "02-uniform", 'side="right"', 'side="left"'),
                 "breaker": with_code(first, "02-quantile", score_hook(1000))}
    second_run = {"fay": answered(CHEAP, solutions),
                  "gus": one_bug(CHEAP, "02-quantile", "return np.maximum.accumulate(edges, axis=1)", "return edges"),
                  "eve": with_code(blank, "02-uniform", VANDAL),
                  "hog": answered(CHEAP, {**solutions, "02-decode": ESCAPING_HOG}),
                  "flood": with_code(answered(CHEAP, solutions), "02-uniform", FLOOD),
                  "scorer": with_code(blank, "02-uniform", score_hook(2)),
                  SLEEPER: answered(CHEAP, {**solutions, "02-decode": SLEEPING_DECODE})}
    return first_run, second_run


BUT_DECODE = POINTS["02-uniform-test"] + POINTS["02-quantile-test"]
EXPECTED = {"ada": FULL, "bob": FULL - POINTS["02-uniform-test"], "breaker": 0, "fay": FULL,
            "gus": FULL - POINTS["02-quantile-test"], "eve": 0, "hog": BUT_DECODE, "flood": FULL, "scorer": 0,
            SLEEPER: BUT_DECODE}


def _rss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            return int(re.search(r"VmRSS:\s+(\d+) kB", f.read()).group(1)) * 1024
    except (OSError, AttributeError):
        return 0


def command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return "?"


def run(*args, env, timeout=900):
    """One command of the instructor guide from the repository root; (output, memory) where memory is
    {"peak": the peak RSS of a grading process in bytes -- the command's own, or one of its pool's processes, which
    receive the kernels' output; "growth": the most any of them grew past its size once set up (see set_up); "table":
    pid -> (MiB once set up, peak MiB, command)}."""
    proc = subprocess.Popen([sys.executable, "-m", *args], cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    peak, settled, names = {}, {}, {}  # pid -> the largest RSS seen; its RSS once set up; its command line

    def set_up(pid: int) -> bool:
        """The command's own process: it has started its pool (a child running multiprocessing's spawn; not an
        earlier helper such as ldconfig). A pool process: it has started its first kernel, by when it has imported
        nbgrader and what the hidden tests import -- a kernel forked by its zygote (a child with the pool process's
        own command line, a fork of it, that has a child; not a helper's shell with its command), or one started
        afresh (a child running ttlib.grading.sandbox)."""
        children, own = processes.children_of(pid), command_line(pid)
        if pid == proc.pid:
            return any("multiprocessing.spawn" in command_line(child) for child in children)
        return any((command_line(child) == own and processes.children_of(child))
                   or "ttlib.grading.sandbox" in command_line(child) for child in children)

    def sample():
        while proc.poll() is None:
            for pid in [proc.pid, *processes.children_of(proc.pid)]:  # itself and its pool's processes
                rss = _rss(pid)
                peak[pid] = max(peak.get(pid, 0), rss)
                names[pid] = names.get(pid) or command_line(pid)[:60]
                if pid not in settled and rss and set_up(pid):
                    settled[pid] = rss
            time.sleep(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out, _ = proc.communicate(timeout=timeout)
    sampler.join()
    assert proc.returncode == 0, f"`{' '.join(args)}` failed:\n{out[-6000:]}"
    grew = {pid: peak[pid] - rss for pid, rss in settled.items()}
    return out, {"peak": max(peak.values(), default=0), "growth": max(grew.values(), default=0),
                 "table": {pid: (settled.get(pid, 0) >> 20, peak[pid] >> 20, names[pid]) for pid in peak}}


def hashes(root: Path, students) -> dict[str, str]:
    """sha256 of every file of these students (submitted/, autograded/, feedback/) and of the course's sources."""
    paths = [p for s in students for sub in ("submitted", "autograded", "feedback")
             for p in (root / sub / s).rglob("*")]
    paths += list((root / "source").rglob("*")) + list((root / "release").rglob("*"))
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(paths)
            if p.is_file()}


def grades(root: Path, students) -> dict:
    with Gradebook(f"sqlite:///{root / 'gradebook.db'}") as gb:
        out = {}
        for student in students:
            submission = gb.find_submission(CHEAP, student)
            out[student] = {g.name: (g.auto_score, g.manual_score) for g in submission.notebooks[0].grades}
            out[student]["score"] = submission.score
        return out


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a running process (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    if not sandbox.capabilities().landlock_abi or not sandbox.capabilities().subreaper:
        pytest.fail(f"this test needs Linux with Landlock: {sandbox.capabilities().missing()}")
    start = time.monotonic()
    tmp = tmp_path_factory.mktemp("course")
    root = tmp / "grading"
    env = {**os.environ, "TTLIB_COURSE_DIR": str(root), "TTLIB_FAST": "1", "OMP_NUM_THREADS": "1",
           "TTLIB_GRADE_CELL_TIMEOUT": str(CELL_CPU), "TTLIB_GRADE_NOTEBOOK_TIMEOUT": str(NOTEBOOK_CPU),
           "TTLIB_GRADE_MEMORY_GB": str(MEMORY_GB), "TTLIB_GRADE_CELL_IDLE": str(IDLE_CELL),
           "TTLIB_GRADE_NOTEBOOK_IDLE": str(IDLE_NOTEBOOK), "TTLIB_GRADE_EXERCISE_IDLE": str(IDLE_EXERCISE),
           "TTLIB_GRADE_WALL_FACTOR": "20"}  # the clock's last backstop is not under test: no load may reach it
    # notebook 02 only: its source version and `nbgrader generate_assignment`, as `ttlib grade release` does
    source = root / "source" / CHEAP / f"{CHEAP}.ipynb"
    source.parent.mkdir(parents=True)
    nbformat.write(grade.source_version(solution_notebook(CHEAP), f"{CHEAP}.ipynb"), source)
    run("nbgrader", "generate_assignment", CHEAP, "--force", env=env)
    first, second = class_of_02()
    out = {"root": root, "logs": {}, "memory": {}, "env": env, "tmp": tmp}
    hogged_from = time.monotonic()
    with one_core_beside_a_hog() as hog:  # (the grading, two submissions at a time, and a hog on one core)
        try:
            for name, students, extra in (("first", first, ["--BoundedExecute.strip_score_outputs=False",
                                                             "--BoundedExecute.hidden_tests=False"]),
                                          ("second", second, [])):
                folder = tmp / name
                folder.mkdir()
                for student, nb in students.items():
                    nbformat.write(nb, folder / f"{student}.ipynb")
                collect(CHEAP, folder, env)
                if name == "first":
                    out["logs"][name], out["memory"][name] = run("nbgrader", "autograde", CHEAP, *extra, env=env)
                    run("nbgrader", "generate_feedback", CHEAP, env=env)
                    continue
                out["hashes before"] = hashes(root, first) | hashes(root, ["fay", "gus"])  # their submissions
                out["grades before"] = grades(root, first)
                out["stdout"], out["memory"][name] = run("ttlib", "grade", "autograde", CHEAP, "--jobs", str(JOBS),
                                                       env=env)
                out["logs"][name] = out["stdout"] + (root / f"autograde_{CHEAP}.log").read_text()
        finally:
            out["hogged"] = (time.monotonic() - hogged_from, _cpu_seconds(hog.pid))  # (wall, the hog's CPU s)
    time.sleep(4)  # what the vandal left behind would have woken up by now
    sandboxes = "|".join(re.escape(s) for s in [*first, *second])  # a sandbox's folder is named after its student
    out["alive"] = marked(MARK, re.compile(rf"TTLIB_SANDBOX=[^\0]*/ttsbx-({sandboxes})-".encode()))
    out["hashes after"] = {k: v for k, v in (hashes(root, first) | hashes(root, ["fay", "gus"])).items()
                           if k in out["hashes before"] or not k.startswith(("autograded/", "feedback/"))}
    out["grades after"] = grades(root, first)
    out["outside"] = [p for p in (Path("/tmp") / MARK, Path.home() / MARK) if p.exists()]
    out["seconds"] = time.monotonic() - start
    logs = "\n".join(out["logs"].values())
    out["ran"] = {s: (float(cpu), float(wall)) for s, cpu, wall in
                  re.findall(r"ttlib: (\S+) ran in ([0-9.]+) s of CPU time, ([0-9.]+) s on the clock", logs)}
    out["graded in"] = {s: float(seconds) for s, seconds in re.findall(r"---- (\S+) \(graded on \S+ in ([0-9.]+) s\)",
                                                                       logs)}
    return out


def score(graded, student) -> float:
    with Gradebook(f"sqlite:///{graded['root'] / 'gradebook.db'}") as gb:
        return gb.find_submission(CHEAP, student).score


def autograded(graded, student):
    return read(graded["root"] / "autograded" / student / CHEAP / f"{CHEAP}.ipynb")


def outputs(nb, grade_id) -> str:
    return json.dumps(cell(nb, grade_id).outputs)


def test_every_student_gets_the_expected_score(graded):
    got = {student: score(graded, student) for student in EXPECTED}
    wrong = {s: {g: outputs(autograded(graded, s), g)[:600] for g in POINTS} for s in got if got[s] != EXPECTED[s]}
    ran = re.findall(r"ttlib: \S+ ran in .*", "\n".join(graded["logs"].values()))
    assert got == EXPECTED, f"{wrong}\n" + "\n".join(ran)


def test_the_vandal_changed_nothing_of_the_others(graded):
    """The vandal was graded in the batch of fay and gus (JOBS at a time, in order of student: eve beside fay
    first), after ada, bob and breaker: nothing of theirs changed, and fay and gus got their points."""
    assert graded["hashes after"] == graded["hashes before"]
    assert len([k for k in graded["hashes before"] if k.startswith(("submitted/fay/", "submitted/gus/"))]) == 2
    assert graded["grades after"] == graded["grades before"]
    assert graded["outside"] == []
    said = outputs(autograded(graded, "eve"), "02-uniform")
    assert "could not rewrite" in said and "Permission denied" in said, said[:2000]
    assert "could not write" in said and "gradebook.db" in said
    assert re.search(r"^(rewrite|delete|write) ", said.replace("\\n", "\n"), re.M) is None, said[:2000]


def test_a_submission_that_only_sleeps_loses_only_what_it_never_finished(graded):
    """The sleeper's bin_means sleeps and ignores SIGTERM and interrupts: its kernel's cell is stopped after IDLE_CELL
    idle seconds (and waited for 10 s more), its hidden tests after IDLE_EXERCISE; the clock's last backstop (20
    times the CPU budgets) never came near. It keeps the two exercises it finished."""
    nb = autograded(graded, SLEEPER)
    verdict = outputs(nb, "02-decode-test")
    assert "HiddenTestFailed" in verdict and "doing nothing" in verdict, verdict[:1000]
    stopped = nb.metadata["ttlib"]["run"]["stopped"]
    assert any("idle" in s for s in stopped) and any("doing nothing" in s for s in stopped), stopped
    bound = IDLE_CELL + 10 + 3 * IDLE_EXERCISE + IDLE_EXERCISE + 150  # its idle budgets, and the rest on a busy box
    assert graded["graded in"][SLEEPER] < bound, graded["graded in"][SLEEPER]


def test_nothing_the_submissions_started_is_alive(graded):
    assert graded["alive"] == []
    assert "left two processes behind" in outputs(autograded(graded, "eve"), "02-uniform")


def test_an_escaping_memory_hog_is_counted_and_stopped(graded):
    nb = autograded(graded, "hog")
    died = [o for o in cell(nb, "02-decode").outputs if o.output_type == "error"]  # the cell that started it
    assert died and died[0].ename == "KernelDied" and "memory" in died[0].evalue, died
    verdict = [o for o in cell(nb, "02-decode-test").outputs if o.output_type == "error"]
    assert [o.ename for o in verdict] == ["HiddenTestFailed"] and "decode is not defined" in verdict[0].evalue
    assert graded["ran"]["hog"][1] < 60, "stopped by the memory limit, not by the clock (the cell sleeps 60 s)"


def test_an_output_flood_is_capped_and_the_grader_stays_small(graded):
    nb = autograded(graded, "flood")
    text = outputs(nb, "02-uniform")
    assert "output over the grading limit" in text
    assert len(json.dumps(nb)) < 8 * 2**20, "the flood's output is not kept"
    growth = graded["memory"]["second"]["growth"]
    assert growth < 200 * 2**20, (f"a grading process grew by {growth / 2**20:.0f} MiB while {FLOOD_MIB} MiB "
                                  f"were printed: {graded['memory']['second']['table']}")


def test_a_submission_that_breaks_nbgraders_bookkeeping_gets_zero_with_the_reason(graded):
    nb = autograded(graded, "breaker")  # the autograded notebook exists, and says why
    for grade_id in POINTS:
        assert "GradingFailed" in outputs(nb, grade_id) and "partial credit" in outputs(nb, grade_id)
    feedback = (graded["root"] / "feedback" / "breaker" / CHEAP / f"{CHEAP}.html").read_text()
    assert "GradingFailed" in feedback and "Score: 0" in feedback
    assert "could not record breaker's grades" in graded["logs"]["first"]


def test_a_submission_cannot_set_its_own_score(graded):
    nb = autograded(graded, "scorer")
    for grade_id in POINTS:
        assert "execute_result" not in outputs(nb, grade_id)
    assert "output nbgrader would read as its score; removed" in graded["logs"]["second"]


def test_correct_submissions_keep_full_marks_under_a_cpu_hog(graded):
    for student in ["ada", "flood"]:
        cpu, wall = graded["ran"][student]
        assert score(graded, student) == FULL
        assert cpu < NOTEBOOK_CPU / 1.5, "a correct submission uses well under its CPU budget"
    wall, hog_cpu = graded["hogged"]
    # the hog really ran beside the grading, on the one core they shared: at least a quarter of it all along (two
    # submissions graded at a time and the grader share the rest)
    assert hog_cpu > 0.25 * wall, f"the hog's CPU s: {hog_cpu:.0f} in {wall:.0f} s"


def test_the_class_table(graded):
    """student, score, CPU seconds, seconds on the clock (run with -s); and the test's own time."""
    print("\n| student | points | CPU s | wall s |\n|---|---|---|---|")
    for student in EXPECTED:
        cpu, wall = graded["ran"].get(student, (float("nan"), float("nan")))
        print(f"| {student} | {score(graded, student):g} / {FULL:g} | {cpu:.1f} | {wall:.1f} |")
    first, second = graded["memory"]["first"], graded["memory"]["second"]
    print(f"grader peak RSS: {first['peak'] / 2**20:.0f} MiB (first run), {second['peak'] / 2**20:.0f} MiB "
          f"(second, with the flood; its largest growth {second['growth'] / 2**20:.0f} MiB); "
          f"whole test {graded['seconds']:.0f} s")
    print("grading processes of the second run, pid: (MiB once set up, peak MiB, command):", second["table"])


def test_a_run_after_the_batch_grades_only_what_is_new(graded):
    """Every graded notebook records what it was graded from: the next run grades only a new submission."""
    env = graded["env"]
    folder = graded["tmp"] / "late"
    folder.mkdir()
    nbformat.write(answered(CHEAP, dict.fromkeys(["02-uniform", "02-quantile", "02-decode"])), folder / "erin.ipynb")
    collect(CHEAP, folder, env)
    out, _ = run("ttlib", "grade", "autograde", CHEAP, env=env)
    assert re.search(r"^erin +7/7 points", out, re.M), out[-3000:]
    assert f"graded 1 submission of {CHEAP}" in out and f"{len(EXPECTED)} up to date" in out, out[-2000:]
    assert score(graded, "erin") == FULL
