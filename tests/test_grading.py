"""Instructors grade the exercises with nbgrader: a real course folder, a real sqlite gradebook, and the commands of
the README's instructor guide, run as written (`ttlib grade ...`, `nbgrader ...`) from the repository root.

One class is graded once (the `graded` fixture), JOBS submissions at a time (`ttlib grade autograde --jobs`, three
runs: notebook 02 with its short limits, the two slowest notebooks beside a CPU hog, the rest), and each test reads
its results; `test_the_same_verdicts_whatever_the_layout` grades a small class of notebook 02 (a student per kind of
verdict) again, one at a time and on a local Ray cluster of two workers, losing a worker each time, and finds the
verdicts of the whole class's run cell by cell.

Every submission is made from the student version by filling its exercise cells: with the solution notebook's
answers, or with some replaced by answers from tests/wrong_answers/ (tests/test_exercises.py runs every one of those
against its exercise's test cell; here nbgrader grades a few, to show the scores are the ones predicted). The class,
with the points each student should get for each exercise (`EXPECTED`, checked cell by cell in the gradebook):
- "solutions" hands in every graded notebook with the solution notebook's answers;
- "unmodified" hands in the student versions exactly as released, of notebooks 00-03 only (grading a blank notebook
  runs it to the end like any other, so the later, slower notebooks would double the test's time to show the same
  thing; their blank versions are checked without running below: every exercise a stub, every test cell checksummed);
- "bug" hands in every other graded notebook with one plausible bug in its last exercise: it loses that exercise only;
- "delegator" hands in notebooks 01, 02 and 04 with every exercise handed to the reference it rebuilds (ttlib's
  function, PyTorch's attention, nn.MultiheadAttention): it earns nothing;
- "rebinder" leaves notebook 01's first exercise unsolved and rebinds ttlib.course.checks to do nothing: it loses that
  one only (the hidden tests run the submission's definitions alone, in a process of their own), and is flagged;
- on notebook 01 (cheap) four students each make one mistake that used to cost two exercises (the multi-head test
  ran the student's own attention and mask) or that only the multi-head test can see; "warns" is right but its
  attention warns on every call (to stderr): full marks; three students who cheat (`CHEATERS`: a copy of the
  reference's code, an answer from another process, and "ipython_hook", a blank notebook whose first exercise cell
  wraps every later cell in try/except, which scores 0): each loses the exercise it cheated on, and totals.csv flags
  it (tests/test_cheats.py runs every way of cheating in tests/wrong_answers/cheats.py through the same hidden tests
  and scan);
- on notebook 02 (cheap, its three exercises independent) students hand in a partly correct notebook, one whose
  exercise raises, one whose decode loops forever (and later cells call it again), one with an edited and one with
  a deleted test cell, an encode that is wrong only on bin edges, quantile edges without their monotonicity fix, and
  a decode that hogs memory. Notebook 02 is graded with short limits (CELL_TIMEOUT a cell, NOTEBOOK_TIMEOUT for the
  whole notebook, EXERCISE_CPU for an exercise's hidden tests, MEMORY_GB for its kernel and its hidden tests), so the
  loop and the hog cost seconds.
Notebooks 03 and 05 (the slowest to grade) are graded beside a busy process, on one core they share
(`one_core_beside_a_hog`): the budgets count CPU seconds, so correct submissions keep full marks. (tests/
test_grading_sandbox.py grades with `nbgrader autograde` itself too, one at a time, as nbgrader users do.)
`test_the_class_table` prints the table: student, notebook, expected, got, CPU seconds of the kernel and of the
hidden tests.
"""

from __future__ import annotations

import contextlib
import csv
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from commands import in_process  # tests/ is on sys.path
from nbgrader.api import Gradebook
from nbgrader.utils import compute_checksum
from test_exercises import ANSWER_FILES, load_answers, load_module, wrong_source

from tools.outputs import one_core_beside_a_hog
from ttlib.cli import main as cli
from ttlib.course import challenge
from ttlib.grading import assignments as grade
from ttlib.grading import sandbox

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = REPO / "notebooks"
STUDENT = NOTEBOOKS / "student"
GRADED = [p.stem for p in grade.graded_notebooks(NOTEBOOKS)]
BY_CODE = [a for a in GRADED if a != challenge.NOTEBOOK]  # the challenge is graded by return: tests/test_challenge.py
ATTENTION = "01_attention"
CHEAP = "02_trajectory_tokenizer"  # the notebook the special cases are graded on
BEAM = "05_beam_search"
FORKED = sandbox.capabilities().sandboxed  # kernels and hidden tests fork from a zygote (ttlib.grading.zygote)
# CHEAP's budgets, tight so that the loop costs seconds, and with room for a correct submission on a slow machine:
CELL_TIMEOUT = 5 if FORKED else 10  # CPU seconds per cell; CHEAP's slowest cell (the imports) takes about 0.5 in a
# forked kernel, 5 in one started afresh
NOTEBOOK_TIMEOUT = 8 if FORKED else 20  # CPU seconds for a whole submission; a correct one takes about 0.3 (6 afresh)
MEMORY_GB = 2.0  # the memory limit of CHEAP's kernels and hidden tests; a correct one uses well under 1 GiB
EXERCISE_CPU = 5 if FORKED else 8  # CPU seconds for each exercise's hidden tests; a correct one uses about 0.1 (1-3
# afresh); "hog" must reach MEMORY_GB well within it, on a slow machine too
HOGGED = ["03_trajectory_gpt", BEAM]  # graded beside a CPU hog
# Every other notebook is graded with these CPU-second limits (demos run only their definitions when grading).
FAST_CELL_TIMEOUT = 100
FAST_NOTEBOOK_TIMEOUT = 400
UNMODIFIED = GRADED[:4]  # the notebooks "unmodified" hands in (see above)
JOBS = 2  # submissions graded at a time


def read(path):
    return nbformat.read(path, as_version=4)


def nbgrader_meta(cell) -> dict:
    return cell.metadata.get("nbgrader", {})


def solution_notebook(assignment):
    return read(NOTEBOOKS / f"{assignment}.ipynb")


def student_notebook(assignment):
    return read(STUDENT / f"{assignment}.ipynb")


def points(assignment) -> dict[str, float]:
    return grade.points(solution_notebook(assignment))


def solution_sources(assignment) -> dict[str, str]:
    return {nbgrader_meta(c)["grade_id"]: c.source for c in solution_notebook(assignment).cells
            if nbgrader_meta(c).get("solution")}


def answered(assignment, answers: dict[str, str | None] | None = None):
    """The student version with exercises filled in: `answers` maps a solution cell's grade_id to its new source
    (None: the solution notebook's answer); without `answers`, every exercise gets the solution's answer."""
    nb = student_notebook(assignment)
    solutions = solution_sources(assignment)
    answers = answers if answers is not None else dict.fromkeys(solutions)
    for cell in nb.cells:
        grade_id = nbgrader_meta(cell).get("grade_id")
        if grade_id in answers:
            source = answers[grade_id] if answers[grade_id] is not None else solutions[grade_id]
            cell.source = "\n".join(line for line in source.splitlines() if "### " not in line)  # no markers
    return nb


def one_bug(assignment, grade_id, old, new):
    """Every exercise solved, one of them with `old` replaced by `new` in the solution's answer (once)."""
    source = solution_sources(assignment)[grade_id]
    assert source.count(old) == 1, f"{assignment} {grade_id}: {old!r} should occur once"
    answers = dict.fromkeys(solution_sources(assignment))
    answers[grade_id] = source.replace(old, new)
    return answered(assignment, answers)


def cell(nb, grade_id):
    return next(c for c in nb.cells if nbgrader_meta(c).get("grade_id") == grade_id)


WRONG_QUANTILES = '''def quantile_edges(x, n_bins):
    # equal-width edges: uniform bins, not quantiles (wrong)
    return np.linspace(x.min(axis=0), x.max(axis=0), n_bins + 1).T
'''
RAISING_QUANTILES = '''def quantile_edges(x, n_bins):
    return np.quantile(x, n_bins, axis=0).T  # raises ValueError: quantiles must be in [0, 1]
'''
LOOPING_DECODE = '''def bin_means(x, edges):
    means = []
    while len(means) < edges.size:  # never grows: loops forever (and later cells call it again)
        means + [0.0]
    return np.array(means)


def decode(bins, means):
    return means[np.arange(means.shape[0]), bins]
'''
HOGGING_DECODE = '''def bin_means(x, edges):
    means = []
    while len(means) >= 0:  # always true: appends a list of 80 MB a round, forever (about 0.6 CPU s a GiB; numpy's
        means.append([0.0] * 10_000_000)  # big arrays can cost ten times that while the kernel makes huge pages)
    return np.array(means)


def decode(bins, means):
    return means[np.arange(means.shape[0]), bins]
'''

# Wrong answers come from tests/wrong_answers/ (tests/test_exercises.py runs each against its exercise's test cell);
# here nbgrader grades a few of them, to show that the scores are what those runs predict.
WRONG = {path.stem: load_answers(path) for path in ANSWER_FILES}
REFUSED = "refuses to run"  # what a delegating answer's failure says
DELEGATED = [ATTENTION, CHEAP, "04_kv_cache"]  # the notebooks "delegator" hands in, every exercise delegated
REBOUND = "unsolved, with the checking helpers rebound to do nothing"  # "rebinder"'s notebook 01 answer
CHEATS = load_module(Path(__file__).parent / "wrong_answers" / "cheats.py").CHEATS
# Every way of cheating in tests/wrong_answers/cheats.py loses its exercise in the hidden tests and is flagged by the
# scan: tests/test_cheats.py runs each of them so. Here a student per path through the grader, on notebook 01's
# first exercise: a copy of the reference's code, an answer computed in another process (from inside the sandbox),
# and a hook in the kernel (scores 0: it wraps every later cell).
CHEATERS = ["code_object", "other_process", "ipython_hook"]
assert set(CHEATERS) <= set(CHEATS), CHEATERS
# notebook 01: mistakes in exercises 1 and 2 that used to zero exercise 3 as well, and one in exercise 3 itself
ATTENTION_BUGS = {
    "no_scale": ("01-sdpa", "no 1/sqrt(d) scaling"),
    "softmax_axis": ("01-sdpa", "softmax over the queries, not the keys"),
    "mask_off_by_one": ("01-mask", "the value rule off by one (hides the reward token)"),
    "heads_unmerged": ("01-multi-head", "heads merged without moving the head axis back"),
}


def wrong_answer(assignment, grade_id, why) -> str:
    """The source of the wrong answer to `grade_id` that tests/wrong_answers/ describes as `why`."""
    answer = next(a[2] for a in WRONG[assignment] if a[0] == grade_id and a[1] == why)
    return wrong_source(solution_sources(assignment)[grade_id], answer)


def delegating(assignment):
    """Every exercise answered by handing the work to the reference it rebuilds."""
    answers = {}
    for grade_id, why, _, *says in WRONG[assignment]:
        if says == [REFUSED] and grade_id not in answers:
            answers[grade_id] = wrong_answer(assignment, grade_id, why)
    assert set(answers) == set(solution_sources(assignment)), f"{assignment}: an exercise has no delegating answer"
    return answered(assignment, answers)


def last_bug(assignment) -> tuple[str, str]:
    """(grade_id, source): a plausible bug in the notebook's last exercise (no later test can use it)."""
    grade_id = list(solution_sources(assignment))[-1]
    why = next(a[1] for a in WRONG[assignment] if a[0] == grade_id and isinstance(a[2], tuple)
               and a[3] != REFUSED)  # a plausible slip (a small edit of the solution), not a delegation
    return grade_id, wrong_answer(assignment, grade_id, why)


# "bug" hands in every notebook that has no students of its own with one bug in its last exercise
BUGGY = [a for a in BY_CODE if a not in (ATTENTION, CHEAP)]


def cheap_submissions():
    """Notebook 02 as its special students hand it in (exercises: 02-uniform, 02-quantile, 02-decode)."""
    partial = answered(CHEAP, {"02-uniform": None, "02-quantile": WRONG_QUANTILES})  # decode left undone
    raises = answered(CHEAP, {"02-uniform": None, "02-quantile": RAISING_QUANTILES, "02-decode": None})
    loops = answered(CHEAP, {"02-uniform": None, "02-quantile": None, "02-decode": LOOPING_DECODE})
    hog = answered(CHEAP, {"02-uniform": None, "02-quantile": None, "02-decode": HOGGING_DECODE})
    edited = answered(CHEAP, {"02-quantile": None, "02-decode": None})  # uniform left undone, its test "fixed":
    cell(edited, "02-uniform-test").source = 'print("Exercise 1 passed: your uniform tokenizer is ttlib\'s.")'
    deleted = answered(CHEAP, {"02-uniform": None, "02-quantile": None})  # decode left undone, its test deleted
    deleted.cells.remove(cell(deleted, "02-decode-test"))
    encode_left = one_bug(CHEAP, "02-uniform", 'side="right"', 'side="left"')  # wrong only on an edge
    unsorted_edges = one_bug(CHEAP, "02-quantile", "return np.maximum.accumulate(edges, axis=1)", "return edges")
    return {"partial": partial, "raises": raises, "loops": loops, "hog": hog, "edited": edited, "deleted": deleted,
            "encode_left": encode_left, "unsorted_edges": unsorted_edges}


SPECIAL = [
    "partial", "raises", "loops", "hog", "edited", "deleted", "encode_left", "unsorted_edges"]


def expected_points() -> dict[str, dict[str, dict[str, float]]]:
    """{student: {assignment: {test cell: points}}}: what each student should get for each exercise."""
    full = {a: points(a) for a in BY_CODE}
    zero = {a: dict.fromkeys(p, 0.0) for a, p in full.items()}

    def losing(assignment, *lost):
        return {**full[assignment], **dict.fromkeys(lost, 0.0)}

    expected = {"solutions": full, "unmodified": {a: zero[a] for a in UNMODIFIED}}
    expected["bug"] = {a: losing(a, f"{last_bug(a)[0]}-test") for a in BUGGY}
    for student, (grade_id, _) in ATTENTION_BUGS.items():
        expected[student] = {ATTENTION: losing(ATTENTION, f"{grade_id}-test")}
    expected["delegator"] = {a: zero[a] for a in DELEGATED}
    # rebinding the checks to do nothing gains nothing and costs nothing else: the hidden tests never run it
    expected["rebinder"] = {ATTENTION: losing(ATTENTION, "01-sdpa-test")}
    expected["warns"] = {ATTENTION: full[ATTENTION]}
    for student in CHEATERS:
        expected[student] = {ATTENTION: zero[ATTENTION] if student == "ipython_hook" else
                             losing(ATTENTION, "01-sdpa-test")}
    lost = {"partial": ["02-quantile-test", "02-decode-test"], "raises": ["02-quantile-test"],
            "loops": ["02-decode-test"], "hog": ["02-decode-test"], "edited": ["02-uniform-test"],
            "deleted": ["02-decode-test"], "encode_left": ["02-uniform-test"], "unsorted_edges": ["02-quantile-test"]}
    for student in SPECIAL:
        expected[student] = {CHEAP: losing(CHEAP, *lost[student])}
    return expected


EXPECTED = expected_points()


def expected_scores() -> dict[str, dict[str, float]]:
    """{student: {assignment: score}} for every graded notebook (0 where the student handed nothing in)."""
    return {student: {a: sum(by_assignment.get(a, {}).values()) for a in GRADED}
            for student, by_assignment in EXPECTED.items()}


def run(*args, env, timeout=1800, may_fail=False, fresh=True) -> str:
    """One command of the instructor guide, run from the repository root; its output (stdout and stderr). A `ttlib`
    command run again with other arguments may run through its main function in this process (fresh=False: the
    same command without a new process's 2-3 CPU seconds of imports; tests/commands.py)."""
    if fresh or args[0] != "ttlib":
        done = subprocess.run([sys.executable, "-m", *args], cwd=REPO, env=env, capture_output=True, text=True,
                              timeout=timeout)
    else:
        done = in_process(*args[1:], env=env, cwd=REPO)
    output = f"exit status {done.returncode}\n{done.stdout}{done.stderr}"
    assert may_fail or done.returncode == 0, f"`{' '.join(args)}` failed:\n{output[-4000:]}"
    return output


def collect(assignment, folder: Path, env, fresh=False) -> str:
    """`ttlib grade collect assignment folder`: in this process unless `fresh` (the graded fixture runs its first
    collect as a command of its own)."""
    return run("ttlib", "grade", "collect", assignment, str(folder), env=env, fresh=fresh)


def submissions(assignment) -> dict[str, nbformat.NotebookNode]:
    """{student: notebook} handed in for one assignment."""
    handed_in = {"solutions": answered(assignment)}
    if assignment in UNMODIFIED:
        handed_in["unmodified"] = student_notebook(assignment)
    if assignment in BUGGY:
        grade_id, source = last_bug(assignment)
        handed_in["bug"] = answered(assignment, {**dict.fromkeys(solution_sources(assignment)), grade_id: source})
    if assignment in DELEGATED:
        handed_in["delegator"] = delegating(assignment)
    if assignment == ATTENTION:
        handed_in.update({student: answered(ATTENTION, {**dict.fromkeys(solution_sources(ATTENTION)),
                                                        grade_id: wrong_answer(ATTENTION, grade_id, why)})
                          for student, (grade_id, why) in ATTENTION_BUGS.items()})
        handed_in["rebinder"] = answered(ATTENTION, {**dict.fromkeys(solution_sources(ATTENTION)),
                                                     "01-sdpa": wrong_answer(ATTENTION, "01-sdpa", REBOUND)})
        right = solution_sources(ATTENTION)["01-sdpa"]
        handed_in["warns"] = answered(ATTENTION, {**dict.fromkeys(solution_sources(ATTENTION)), "01-sdpa": (
            "import warnings\n\n" + right.replace("    return weights @ v",
                                                  '    warnings.warn("float32 attention")\n    return weights @ v'))})
        for student in CHEATERS:
            base = {} if student == "ipython_hook" else dict.fromkeys(solution_sources(ATTENTION))
            handed_in[student] = answered(ATTENTION, {**base, "01-sdpa": CHEATS[student][1]})
    if assignment == CHEAP:
        handed_in.update(cheap_submissions())
    return handed_in


def limits(assignment) -> dict[str, str]:
    """The grading limits of an assignment, through the environment variables BoundedExecute reads."""
    if assignment == CHEAP:
        return {"TTLIB_GRADE_CELL_TIMEOUT": str(CELL_TIMEOUT), "TTLIB_GRADE_NOTEBOOK_TIMEOUT": str(NOTEBOOK_TIMEOUT),
                "TTLIB_GRADE_MEMORY_GB": str(MEMORY_GB), "TTLIB_GRADE_EXERCISE_CPU": str(EXERCISE_CPU)}
    return {"TTLIB_GRADE_CELL_TIMEOUT": str(FAST_CELL_TIMEOUT),
            "TTLIB_GRADE_NOTEBOOK_TIMEOUT": str(FAST_NOTEBOOK_TIMEOUT)}


RAN_IN = re.compile(r"ttlib: (\S+) ran in ([0-9.]+) s")
HIDDEN_IN = re.compile(r"ttlib: (\S+)'s hidden tests: .*?, ([0-9.]+) s of CPU time")


def autograde(assignments, env, root: Path) -> tuple[str, dict[str, str]]:
    """`ttlib grade autograde` of `assignments`, JOBS at a time -> (its output: a line a submission, {assignment:
    its whole log})."""
    out = run("ttlib", "grade", "autograde", *assignments, "--jobs", str(JOBS), env=env)
    return out, {a: (root / f"autograde_{a}.log").read_text() for a in assignments}


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """A class graded end to end: release, collect, autograde, feedback, export. Returns what the tests read."""
    tmp = tmp_path_factory.mktemp("course")
    # one thread per kernel, as tests/conftest.py sets for pytest-xdist workers
    env = {**os.environ, "TTLIB_COURSE_DIR": str(tmp / "grading"), "TTLIB_FAST": "1", "OMP_NUM_THREADS": "1"}
    from ttlib.data import trajectories as data  # the course dataset, built before the short time limits apply

    data.load(data.DEFAULT_DATASET, progress=False)
    # sets up the course folder and its gradebook; says whether notebooks/student/ is what release generates now
    root = tmp / "grading"
    out = {"root": root, "release": run("ttlib", "grade", "release", "--check", env=env, may_fail=True),
           "seconds": {}, "hidden seconds": {}, "downloads": tmp / "downloads", "env": env}
    for assignment in BY_CODE:
        folder = tmp / "downloads" / assignment  # what an instructor downloads: one <student>.ipynb each
        folder.mkdir(parents=True)
        for student, nb in submissions(assignment).items():
            nbformat.write(nb, folder / f"{student}.ipynb")
        out[f"collect {assignment}"] = collect(assignment, folder, env, fresh=assignment == BY_CODE[0])
    rest = [a for a in BY_CODE if a != CHEAP and a not in HOGGED]
    for assignments, hogged in (([CHEAP], False), (HOGGED, True), (rest, False)):
        with one_core_beside_a_hog() if hogged else contextlib.nullcontext():
            lines, logs = autograde(assignments, {**env, **limits(assignments[0])}, root)
        out["lines"] = out.get("lines", "") + lines
        for assignment, log in logs.items():
            out[f"autograde {assignment}"] = log
            out["seconds"][assignment] = {student: float(seconds) for student, seconds in RAN_IN.findall(log)}
            out["hidden seconds"][assignment] = {student: float(seconds) for student, seconds in HIDDEN_IN.findall(log)}
    for assignment in [ATTENTION, CHEAP, BEAM]:
        run("nbgrader", "generate_feedback", assignment, env=env)
    run("nbgrader", "export", "--to", str(tmp / "grades.csv"), env=env)
    run("nbgrader", "export", "--exporter", "ttlib.grading.assignments.StudentTotals", "--to", str(tmp / "totals.csv"),
        env=env)
    with open(tmp / "grades.csv", newline="") as f:
        out["grades"] = list(csv.DictReader(f))
    with open(tmp / "totals.csv", newline="") as f:
        out["totals"] = list(csv.DictReader(f))
    return out


def score(graded, assignment, student) -> tuple[float, float]:
    with Gradebook(f"sqlite:///{graded['root'] / 'gradebook.db'}") as gb:
        submission = gb.find_submission(assignment, student)
        return submission.score, submission.max_score


def cell_scores(graded, assignment, student) -> dict[str, float]:
    with Gradebook(f"sqlite:///{graded['root'] / 'gradebook.db'}") as gb:
        notebook = gb.find_submission(assignment, student).notebooks[0]
        return {g.name: g.score for g in notebook.grades}


def autograded(graded, assignment, student):
    return read(graded["root"] / "autograded" / student / assignment / f"{assignment}.ipynb")


def feedback(graded, assignment, student) -> str:
    return (graded["root"] / "feedback" / student / assignment / f"{assignment}.html").read_text()


def errors(nb, grade_id) -> list[str]:
    return [o.ename for o in cell(nb, grade_id).outputs if o.output_type == "error"]


# ---- the student versions ------------------------------------------------------------------------------------------
def test_every_graded_notebook_has_a_student_version():
    assert GRADED[:5] == ["00_offline_rl_as_sequence_modeling", "01_attention", "02_trajectory_tokenizer",
                          "03_trajectory_gpt", "04_kv_cache"]
    assert sorted(p.stem for p in STUDENT.glob("*.ipynb")) == GRADED


@pytest.mark.parametrize("assignment", GRADED)
def test_student_version_is_blank_clean_and_checksummed(assignment):
    nb, solution = student_notebook(assignment), solution_notebook(assignment)
    header = nb.cells[0].source
    badge = re.findall(r"colab\.research\.google\.com/github/[\w.-]+/[\w.-]+/blob/main/(notebooks/[\w./-]+)\)", header)
    assert badge == [f"notebooks/student/{assignment}.ipynb"], "the Colab badge opens the student version itself"
    stated = re.search(r"(\d+) points in total", header)
    assert stated and int(stated.group(1)) == sum(grade.points(nb).values()) == sum(points(assignment).values())
    assert len(nb.cells) == len(solution.cells)
    text = json.dumps(nb)
    assert "BEGIN SOLUTION" not in text and "HIDDEN TESTS" not in text
    for c in nb.cells:
        if c.cell_type == "code":
            assert c.outputs == [] and c.execution_count is None
        meta = nbgrader_meta(c)
        if meta.get("solution"):
            assert "raise NotImplementedError()" in c.source
        if meta.get("grade"):  # test cells: read-only, with nbgrader's checksum of what the student sees
            assert meta["locked"] and c.metadata["editable"] is False and c.metadata["deletable"] is False
            assert meta["checksum"] == compute_checksum(c)


def test_release_check_finds_student_versions_out_of_date(tmp_path, monkeypatch):
    """What the graded fixture's `ttlib grade release --check` relies on: a changed solution notebook or a student
    version without one is reported, and `release` brings notebooks/student/ up to date."""
    repo = tmp_path / "repo"
    (repo / "notebooks" / "student").mkdir(parents=True)
    shutil.copyfile(REPO / "nbgrader_config.py", repo / "nbgrader_config.py")
    shutil.copyfile(STUDENT / "01_attention.ipynb", repo / "notebooks" / "student" / "01_attention.ipynb")
    shutil.copyfile(STUDENT / "04_kv_cache.ipynb", repo / "notebooks" / "student" / "04_kv_cache.ipynb")
    nb = solution_notebook("01_attention")
    cell(nb, "01-mask-test").source += "\nassert trajectory_mask(1, 1).shape == (1, 1)"
    nbformat.write(nb, repo / "notebooks" / "01_attention.ipynb")
    monkeypatch.setenv("TTLIB_COURSE_DIR", str(tmp_path / "grading"))
    course = grade.open_course(repo)
    report = grade.release(course, check=True)
    assert (report.written, report.unchanged, report.stale) == (["01_attention.ipynb"], [], ["04_kv_cache.ipynb"])
    assert read(repo / "notebooks" / "student" / "01_attention.ipynb") == student_notebook("01_attention")
    report = grade.release(course)
    assert "trajectory_mask(1, 1)" in cell(read(course.student_dir / "01_attention.ipynb"), "01-mask-test").source
    assert not (course.student_dir / "04_kv_cache.ipynb").exists()
    assert grade.release(course, check=True).unchanged == ["01_attention.ipynb"]


# ---- grading a class ------------------------------------------------------------------------------------------------
def test_committed_student_versions_are_what_release_generates(graded):
    assert graded["release"].startswith("exit status 0\n"), graded["release"]
    for assignment in GRADED:
        assert f"notebooks/student/{assignment}.ipynb: up to date" in graded["release"]


@pytest.mark.parametrize("assignment", BY_CODE)
def test_solutions_get_full_marks(graded, assignment):
    total = sum(points(assignment).values())
    assert score(graded, assignment, "solutions") == (total, total)


@pytest.mark.parametrize("assignment", BY_CODE)
def test_every_student_gets_the_expected_points_for_each_exercise(graded, assignment):
    """Each exercise is graded on its own: a one-bug submission loses exactly the exercise with the bug."""
    students = [s for s, by_assignment in EXPECTED.items() if assignment in by_assignment]
    assert len(students) >= 2, "a class for every graded notebook: the solutions and at least one mistake"
    for student in students:
        assert cell_scores(graded, assignment, student) == EXPECTED[student][assignment], student


@pytest.mark.parametrize("assignment", UNMODIFIED)
def test_unmodified_student_versions_get_zero_without_crashing(graded, assignment):
    assert score(graded, assignment, "unmodified") == (0, sum(points(assignment).values()))
    nb = autograded(graded, assignment, "unmodified")
    for grade_id in points(assignment):
        assert errors(nb, grade_id) == ["HiddenTestFailed"], f"{grade_id} fails"
        assert "NotImplementedError" in json.dumps(cell(nb, grade_id).outputs), "the message says it is unsolved"
    assert all(c.execution_count for c in nb.cells if nbgrader_meta(c).get("grade")), "every test cell ran"


def test_a_mistake_in_attention_or_mask_costs_only_its_own_exercise(graded):
    # these three used to zero the multi-head exercise too, "blaming" multi_head_attention
    for student in ["no_scale", "softmax_axis", "mask_off_by_one"]:
        nb = autograded(graded, ATTENTION, student)
        assert errors(nb, "01-multi-head-test") == [], student
        assert "multi_head_attention" not in json.dumps(cell(nb, "01-multi-head-test").outputs), student
    assert errors(autograded(graded, ATTENTION, "no_scale"), "01-sdpa-test") == ["HiddenTestFailed"]
    assert "1/sqrt(d)" in json.dumps(cell(autograded(graded, ATTENTION, "no_scale"), "01-sdpa-test").outputs)
    # a mistake in the heads themselves is still caught, and named
    heads = autograded(graded, ATTENTION, "heads_unmerged")
    assert "merge_heads" in json.dumps(cell(heads, "01-multi-head-test").outputs)


def test_answers_wrong_only_on_edges_or_only_when_rounding_bites_lose_their_exercise(graded):
    nb = autograded(graded, CHEAP, "encode_left")
    assert errors(nb, "02-uniform-test") == ["HiddenTestFailed"]
    assert "encode" in json.dumps(cell(nb, "02-uniform-test").outputs)
    nb = autograded(graded, CHEAP, "unsorted_edges")
    assert "never decrease" in json.dumps(cell(nb, "02-quantile-test").outputs) or \
        "non-decreasing" in json.dumps(cell(nb, "02-quantile-test").outputs)


def test_an_exercise_that_raises_gets_zero_and_grading_goes_on(graded):
    assert errors(autograded(graded, CHEAP, "raises"), "02-quantile-test") == ["HiddenTestFailed"]
    assert "ValueError" in str(cell(autograded(graded, CHEAP, "raises"), "02-quantile-test").outputs)


def test_a_looping_submission_loses_its_exercise_within_its_budgets(graded):
    """decode loops forever: in the kernel its visible check is stopped at the cell's CPU seconds, and its hidden
    tests at the exercise's; it loses that exercise only, and the next students are graded."""
    nb = autograded(graded, CHEAP, "loops")
    assert errors(nb, "02-decode-test") == ["HiddenTestFailed"]
    assert "loop forever" in json.dumps(cell(nb, "02-decode-test").outputs)
    kernel, hidden = graded["seconds"][CHEAP]["loops"], graded["hidden seconds"][CHEAP]["loops"]
    assert CELL_TIMEOUT - 2 < kernel < NOTEBOOK_TIMEOUT + 5, kernel
    assert EXERCISE_CPU - 2 < hidden < 3 * EXERCISE_CPU + 30, hidden  # one exercise's budget, not the whole run's
    for student in ["partial", "raises", "solutions", "unmodified"]:  # graded after "loops" (alphabetical order)
        assert (graded["root"] / "autograded" / student / CHEAP).is_dir()
    html = feedback(graded, CHEAP, "loops")
    assert html.count("output_error") == 1 and "loop forever" in html  # the verdict, nothing of the kernel's


def test_a_memory_hog_is_stopped_and_keeps_the_points_graded_before_it(graded):
    nb = autograded(graded, CHEAP, "hog")
    died = [o for o in cell(nb, "02-decode-test").outputs if o.output_type == "error"]
    assert [o.ename for o in died] == ["HiddenTestFailed"] and "memory" in died[0].evalue, died
    assert score(graded, CHEAP, "hog")[0] == points(CHEAP)["02-uniform-test"] + points(CHEAP)["02-quantile-test"]
    assert graded["seconds"][CHEAP]["hog"] < NOTEBOOK_TIMEOUT, "stopped by the memory limit, not by the clock"
    assert graded["hidden seconds"][CHEAP]["hog"] < 3 * EXERCISE_CPU + 30, "the hidden tests too"
    assert "GiB of memory" in feedback(graded, CHEAP, "hog")


def test_edited_and_deleted_test_cells_are_reported_and_undone(graded):
    report = graded[f"collect {CHEAP}"]
    assert re.search(r"^edited .* test cell 02-uniform-test edited", report, re.M)
    assert re.search(r"^deleted .* test cell 02-decode-test deleted", report, re.M)
    assert sum("edited" in line or "deleted" in line for line in report.splitlines()) == 2, report
    # nbgrader restores both test cells before it runs them: the edit and the deletion gain nothing
    assert errors(autograded(graded, CHEAP, "edited"), "02-uniform-test") == ["HiddenTestFailed"]
    assert errors(autograded(graded, CHEAP, "deleted"), "02-decode-test") == ["HiddenTestFailed"]
    flagged = {row["student_id"]: row["flagged"] for row in graded["totals"]}
    assert flagged.pop("edited") == f"{CHEAP}: test cell 02-uniform-test edited"
    assert flagged.pop("deleted") == f"{CHEAP}: test cell 02-decode-test deleted"
    for student in [*CHEATERS, "rebinder"]:  # flagged by the scan, with the cell and line
        assert flagged.pop(student).startswith(f"{ATTENTION}: cell "), student
    assert set(flagged.values()) == {""}, "honest students are never flagged"


def test_correct_submissions_keep_full_marks_beside_a_cpu_hog_and_a_warning(graded):
    """03 and 05 were graded beside a CPU hog: their solutions keep every point, within a fraction of the budgets
    (CPU seconds of the kernel; the hidden tests get their own). A right answer that warns keeps its points."""
    for assignment in HOGGED:
        total = sum(points(assignment).values())
        assert score(graded, assignment, "solutions") == (total, total)
        assert graded["seconds"][assignment]["solutions"] < FAST_NOTEBOOK_TIMEOUT / 2, graded["seconds"][assignment]
        exercises = len(points(assignment))
        assert graded["hidden seconds"][assignment]["solutions"] < (60 + 120 * exercises) / 2
    nb = autograded(graded, ATTENTION, "warns")
    assert "float32 attention" in json.dumps(cell(nb, "01-sdpa-test").outputs), "what it printed is kept"
    assert errors(nb, "01-sdpa-test") == []


def test_the_autograde_log_warns_only_about_edited_test_cells(graded):
    logs = "\n".join(graded[f"autograde {a}"] for a in BY_CODE)
    assert "Attribute 'checksum'" not in logs, "nbgrader's warning for every test cell of every student is gone"
    edited = re.findall(r"test cell (\S+) was edited by the student", logs)
    assert edited == ["02-uniform-test"], edited


def test_the_gradebook_csv_has_one_row_per_student_with_the_right_totals(graded):
    expected = expected_scores()
    rows = graded["totals"]
    assert list(rows[0]) == ["student_id", *GRADED, "total", "max_total", "flagged"]
    assert sorted(r["student_id"] for r in rows) == sorted(expected)
    max_total = sum(sum(points(a).values()) for a in GRADED)
    for row in rows:
        scores = expected[row["student_id"]]
        assert {a: float(row[a]) for a in GRADED} == scores, row
        assert float(row["total"]) == sum(scores.values()) and float(row["max_total"]) == max_total
    # nbgrader's own export: one row per student and notebook, the same scores
    assert len(graded["grades"]) == len(expected) * len(GRADED)
    for row in graded["grades"]:
        assert float(row["score"]) == expected[row["student_id"]][row["assignment"]], row


@pytest.mark.parametrize("assignment", [ATTENTION, CHEAP, BEAM])
def test_feedback_shows_the_score_and_only_what_is_the_students(graded, assignment):
    visible = json.dumps(student_notebook(assignment).cells)
    secrets = {line.strip() for c in solution_notebook(assignment).cells if nbgrader_meta(c).get("grade")
               for line in c.source.split("### BEGIN HIDDEN TESTS")[1].split("### END HIDDEN TESTS")[0].splitlines()
               if len(line.strip()) > 25 and json.dumps(line.strip())[1:-1] not in visible}  # only hidden ones
    total = sum(points(assignment).values())
    for student, by_assignment in EXPECTED.items():
        if assignment not in by_assignment:
            continue
        html = feedback(graded, assignment, student)
        got = sum(by_assignment[assignment].values())
        assert re.search(rf"Score: {got:g}(\.0)? / {total:g}(\.0)?", html), student
        text = re.sub(r"<[^>]+>", "", html).replace("&quot;", '"').replace("&#39;", "'").replace("&gt;", ">")
        text = text.replace("&lt;", "<").replace("&amp;", "&")
        assert "BEGIN HIDDEN TESTS" not in text and "hidden tests: not shown" in text, student
        leaked = [line for line in secrets if line in text]
        assert not leaked, f"{student}'s feedback quotes hidden tests: {leaked[:3]}"
        # errors of demo cells are not theirs (e.g. 05's demos after a "bug" loop that does not reorder): the
        # feedback shows the errors of test cells only
        nb = autograded(graded, assignment, student)
        test_errors = sum(len(errors(nb, nbgrader_meta(c)["grade_id"])) for c in nb.cells
                          if nbgrader_meta(c).get("grade"))
        assert html.count("output_error") == test_errors, student
        if student == "solutions":
            assert "output_error" not in html, f"{student}'s feedback shows an error"


def test_autograde_says_how_each_submission_went(graded):
    """A line a submission: (its notebook, when a run grades several,) student, points, flags, CPU seconds."""
    flagged = {row["student_id"] for row in graded["totals"] if row["flagged"]}
    for student, by_assignment in EXPECTED.items():
        for assignment, cells in by_assignment.items():
            prefix = "" if assignment == CHEAP else f"{assignment} "
            line = (rf"^{prefix}{student} +{sum(cells.values()):g}/{sum(points(assignment).values()):g} points +"
                    rf"(\d+) flags? +[0-9.]+ \+ [0-9.]+ CPU s \(kernel \+ hidden tests\), \d+ s")
            found = re.search(line, graded["lines"], re.M)
            assert found, f"{assignment} {student}: no line {line!r}"
            assert (found.group(1) != "0") == (student in flagged), found[0]  # (flagged ones hand in one notebook)
    assert f"{JOBS} at a time on this machine" in graded["lines"]


def verdicts(root: Path, assignment: str) -> dict:
    """{student: (points of each test cell, the errors each shows, the scan's flags)}: what must not depend on how
    a class was graded."""
    out = {}
    with Gradebook(f"sqlite:///{root / 'gradebook.db'}") as gb:
        for submission in gb.assignment_submissions(assignment):
            student = submission.student.id
            nb = read(root / "autograded" / student / assignment / f"{assignment}.ipynb")
            cells = {g.name: g.score for g in submission.notebooks[0].grades}
            out[student] = (cells, {g: errors(nb, g) for g in cells}, nb.metadata["ttlib"]["flags"])
    return out


# The class the layouts are compared on: a small one, each kind of verdict once -- full marks, a lost exercise (two,
# one of them left undone), an exercise that raises, an edited test cell (a flag) -- so that grading it twice more
# costs little. Its JOBS-at-a-time verdicts come from the whole class's run (`graded`).
LAYOUT_CLASS = ["solutions", "partial", "raises", "edited"]


def released_and_collected(tmp: Path, downloads: Path, env: dict) -> dict:
    """Notebook 02's small class (LAYOUT_CLASS) in a course folder of its own, released and collected -> the
    environment that grades it."""
    root = tmp / "grading"
    env = {**env, **limits(CHEAP), "TTLIB_COURSE_DIR": str(root)}
    source = root / "source" / CHEAP / f"{CHEAP}.ipynb"
    source.parent.mkdir(parents=True)
    nbformat.write(grade.source_version(solution_notebook(CHEAP), f"{CHEAP}.ipynb"), source)
    run("nbgrader", "generate_assignment", CHEAP, "--force", env=env)
    folder = tmp / "downloads"
    folder.mkdir()
    for student in LAYOUT_CLASS:
        shutil.copyfile(downloads / f"{student}.ipynb", folder / f"{student}.ipynb")
    collect(CHEAP, folder, env)
    return env


def test_the_same_verdicts_whatever_the_layout(graded, tmp_path):
    """A small class of notebook 02 (LAYOUT_CLASS: full marks, a partly done notebook, an exercise that raises, an
    edited test cell) graded one at a time and on a local Ray cluster of two workers -- both runs at once -- gets
    the points, errors and flags it got JOBS at a time in the whole class's run, for every student and test cell.
    In each run a worker is lost mid-grading (it exits 3 s into one submission): that submission is graded again,
    nothing is booked twice, and nothing the lost worker ran outlives it."""
    import tempfile

    import ray
    from test_sandbox import marked

    from ttlib.evaluation.ray_cluster import connect

    everyone = verdicts(graded["root"], CHEAP)
    assert set(everyone) == {s for s, by in EXPECTED.items() if CHEAP in by}
    expected = {student: everyone[student] for student in LAYOUT_CLASS}
    assert len({sum(cells.values()) for cells, _, _ in expected.values()}) == len(LAYOUT_CLASS), \
        "each student of the small class a score of its own"
    layouts = {"one at a time": ("raises", ["--jobs", "1"]), "ray": ("partial", ["--ray"])}
    ray_files = tempfile.mkdtemp(prefix="ttray-")  # short: Ray's socket paths must stay under 107 characters
    try:
        assert connect(num_cpus=2, temp_dir=ray_files)[1], "a local cluster of its own"
        layouts["ray"][1].append(ray.get_runtime_context().gcs_address)
        runs = {}
        for name, (lost, where) in layouts.items():
            env = released_and_collected(tmp_path / name.replace(" ", "-"), graded["downloads"] / CHEAP,
                                         {**graded["env"], "TTLIB_GRADE_CRASH": f"{lost}:3:{tmp_path / name}.lost"})
            runs[name] = (env, subprocess.Popen([sys.executable, "-m", "ttlib", "grade", "autograde", CHEAP, *where],
                                                cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                                text=True))
        outputs = {name: proc.communicate(timeout=1800)[0] for name, (_, proc) in runs.items()}
    finally:
        ray.shutdown()
        shutil.rmtree(ray_files, ignore_errors=True)
    for name, (env, proc) in runs.items():
        assert proc.returncode == 0 and (tmp_path / f"{name}.lost").exists(), outputs[name][-3000:]
        assert verdicts(Path(env["TTLIB_COURSE_DIR"]), CHEAP) == expected, name
    assert "1 at a time on this machine" in outputs["one at a time"] and "on the Ray cluster" in outputs["ray"]
    sandboxes = "|".join(re.escape(s) for s in expected)
    assert marked("ttlib-no-marker", re.compile(rf"TTLIB_SANDBOX=[^\0]*/ttsbx-({sandboxes})-".encode())) == []


def test_the_class_table(graded):
    """The table of the issue's closing note: student, notebook, expected, got, grading time (run with -s)."""
    rows = []
    for student, by_assignment in EXPECTED.items():
        for assignment in by_assignment:
            expected = sum(by_assignment[assignment].values())
            got = score(graded, assignment, student)[0]
            rows.append((student, assignment, expected, got, graded["seconds"][assignment][student],
                         graded["hidden seconds"][assignment].get(student, 0.0)))
            assert got == expected
    print("\n| student | notebook | expected | got | kernel CPU s | hidden tests CPU s |\n|---|---|---|---|---|---|")
    for student, assignment, expected, got, seconds, hidden in rows:
        print(f"| {student} | {assignment} | {expected:g} | {got:g} | {seconds:.1f} | {hidden:.1f} |")


# ---- bad input ------------------------------------------------------------------------------------------------------
def grade_error(capsys, *argv) -> str:
    assert cli.main(["grade", *argv]) == 2
    return capsys.readouterr().err


def test_collect_explains_bad_input(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(REPO)
    monkeypatch.setenv("TTLIB_COURSE_DIR", str(tmp_path / "grading"))
    assert "unknown assignment '99_nothing'" in grade_error(capsys, "collect", "99_nothing", str(tmp_path))
    assert "run `ttlib grade release` first" in grade_error(capsys, "collect", CHEAP, str(tmp_path))
    course = grade.open_course(REPO)
    released = course.released(CHEAP)
    released.parent.mkdir(parents=True)
    shutil.copyfile(STUDENT / f"{CHEAP}.ipynb", released)
    assert "no folder" in grade_error(capsys, "collect", CHEAP, str(tmp_path / "missing"))
    folder = tmp_path / "downloads"
    folder.mkdir()
    assert "no <student>.ipynb files" in grade_error(capsys, "collect", CHEAP, str(folder))
    shutil.copyfile(STUDENT / f"{CHEAP}.ipynb", folder / "ada.ipynb")
    (folder / "bob.ipynb").write_text("print('hello')\n")
    (folder / "carol.py").write_text("print('hello')\n")
    (folder / "dan").mkdir()
    (folder / "not valid.ipynb").write_text("{}")
    message = grade_error(capsys, "collect", CHEAP, str(folder))
    assert "nothing collected" in message and "bob.ipynb: not a readable Jupyter notebook" in message
    assert "carol.py: not a notebook" in message and "dan: not a notebook" in message
    assert "not valid.ipynb: name it <student id>.ipynb" in message
    assert not (course.root / "submitted").exists(), "nothing is copied when anything is wrong"
    for name in ["bob.ipynb", "carol.py", "not valid.ipynb"]:
        (folder / name).unlink()
    (folder / "dan").rmdir()
    assert cli.main(["grade", "collect", CHEAP, str(folder)]) == 0
    assert "ada" in capsys.readouterr().out and course.submitted("ada", CHEAP).read_bytes() == (
        STUDENT / f"{CHEAP}.ipynb").read_bytes()


def test_a_pool_that_cannot_start_a_process_loses_the_submissions_it_was_given():
    """The pool's fork server gone (killed, say): `pool.submit` cannot start a process. Each submission it is given
    comes back as one whose process was lost (BrokenProcessPool), counted as an attempt: the run starts it again in
    a new pool, up to MAX_ATTEMPTS times; none is started beyond the pool's jobs."""
    from collections import deque
    from concurrent.futures.process import BrokenProcessPool
    from types import SimpleNamespace

    from ttlib.grading import layouts

    class NoForkServer:
        def submit(self, *args):
            raise EOFError("unexpected EOF")  # what multiprocessing raises when its fork server is gone

    ada, bob, cyd = (SimpleNamespace(shared=None, student=name, files={}) for name in ("ada", "bob", "cyd"))
    queue, pending, attempts = deque([ada, bob, cyd]), {}, {id(ada): 0, id(bob): 0, id(cyd): 0}
    layouts._fill(queue, pending, 2, lambda s: layouts._start_in_pool(NoForkServer(), s), attempts)
    assert list(pending.values()) == [ada, bob] and list(queue) == [cyd]
    for future in pending:
        assert future.done() and isinstance(future.exception(), BrokenProcessPool)
    assert attempts == {id(ada): 1, id(bob): 1, id(cyd): 0}


def test_autograde_explains_bad_input(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(REPO)
    monkeypatch.setenv("TTLIB_COURSE_DIR", str(tmp_path / "grading"))
    assert "unknown assignment '99_nothing'" in grade_error(capsys, "autograde", "99_nothing")
    assert "run `ttlib grade release` first" in grade_error(capsys, "autograde", CHEAP)
    assert "at least one submission at a time" in grade_error(capsys, "autograde", CHEAP, "--jobs", "0")
    course = grade.open_course(REPO)
    released = course.released(CHEAP)
    released.parent.mkdir(parents=True)
    shutil.copyfile(STUDENT / f"{CHEAP}.ipynb", released)
    Gradebook(f"sqlite:///{course.root / 'gradebook.db'}").close()
    assert "no Ray cluster answers at 127.0.0.1:9" in grade_error(capsys, "autograde", CHEAP, "--ray", "127.0.0.1:9")
    assert cli.main(["grade", "autograde", CHEAP]) == 0  # nothing submitted: nothing to grade
    assert f"graded 0 submissions of {CHEAP}" in capsys.readouterr().out


def test_grade_commands_need_the_repository_root(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert "run `ttlib grade` (and nbgrader) from the root of the course repository" in grade_error(
        capsys, "release")
