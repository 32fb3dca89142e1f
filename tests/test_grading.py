"""Instructors grade the exercises with nbgrader: a real course folder, a real sqlite gradebook, and the commands of
the README's instructor guide, run as written (`ttlib grade ...`, `nbgrader ...`) from the repository root.

One test class is graded once (the `graded` fixture) and each test reads its results:
- "solutions" hands in every graded notebook with the solution notebook's answers; "unmodified" hands in the student
  versions exactly as released, of notebooks 00-03 only (grading a blank notebook runs it to the end like any
  other, so the later, slower notebooks would double the test's time to show the same thing; their blank versions
  are checked without running below: every exercise a stub, every test cell checksummed);
- on notebook 03 (cheap, and its three exercises are independent) five more students hand in a partly correct
  notebook, one whose exercise raises, one that loops forever, one with an edited test cell and one with a deleted
  test cell. Notebook 03 is graded with a short per-cell time limit, so the loop costs seconds.
"""

from __future__ import annotations

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
from nbgrader.api import Gradebook
from nbgrader.utils import compute_checksum

from ttlib import cli, grade

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = REPO / "notebooks"
STUDENT = NOTEBOOKS / "student"
GRADED = [p.stem for p in grade.graded_notebooks(NOTEBOOKS)]
CHEAP = "03_trajectory_tokenizer"  # the notebook the special cases are graded on
CELL_TIMEOUT = 15  # seconds per cell when grading CHEAP; its slowest cell (the imports) takes about 5 s
# Every other notebook is graded with this per-cell limit (fast mode's slowest cell, notebook 05's evaluation, takes
# about 90 s): nbclient sometimes misses the reply to a cell that displays widgets (jupyter/nbclient#312) and then
# waits for the whole limit before going on, so the instructors' 10 minutes would stall the test that long.
FAST_CELL_TIMEOUT = 150
SPECIAL = ["partial", "raises", "loops", "edited", "deleted"]
UNMODIFIED = GRADED[:4]  # the notebooks "unmodified" hands in (see above)


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


def answered(assignment, answers: dict[str, str | None] | None = None):
    """The student version with exercises filled in: `answers` maps a solution cell's grade_id to its new source
    (None: the solution notebook's answer); without `answers`, every exercise gets the solution's answer."""
    nb = student_notebook(assignment)
    solutions = {nbgrader_meta(c)["grade_id"]: c.source for c in solution_notebook(assignment).cells
                 if nbgrader_meta(c).get("solution")}
    answers = answers if answers is not None else dict.fromkeys(solutions)
    for cell in nb.cells:
        grade_id = nbgrader_meta(cell).get("grade_id")
        if grade_id in answers:
            source = answers[grade_id] if answers[grade_id] is not None else solutions[grade_id]
            cell.source = "\n".join(line for line in source.splitlines() if "### " not in line)  # no markers
    return nb


def cell(nb, grade_id):
    return next(c for c in nb.cells if nbgrader_meta(c).get("grade_id") == grade_id)


WRONG_QUANTILES = '''def quantile_edges(x, n_bins):
    # equal-width edges: uniform bins, not quantiles (wrong)
    return np.linspace(x.min(axis=0), x.max(axis=0), n_bins + 1).T
'''
RAISING_QUANTILES = '''def quantile_edges(x, n_bins):
    return np.quantile(x, n_bins, axis=0).T  # raises ValueError: quantiles must be in [0, 1]
'''
LOOPING_DECODE = '''def decode(bins, edges):
    centres = []
    while len(centres) < bins.size:  # never grows: loops forever
        centres + [0.0]
    return np.array(centres)
'''


def special_submissions():
    """Notebook 03 as five students hand it in (exercises: 03-uniform, 03-quantile, 03-decode)."""
    partial = answered(CHEAP, {"03-uniform": None, "03-quantile": WRONG_QUANTILES})  # decode left undone
    raises = answered(CHEAP, {"03-uniform": None, "03-quantile": RAISING_QUANTILES, "03-decode": None})
    loops = answered(CHEAP, {"03-uniform": None, "03-quantile": None, "03-decode": LOOPING_DECODE})
    edited = answered(CHEAP, {"03-quantile": None, "03-decode": None})  # uniform left undone, its test "fixed":
    cell(edited, "03-uniform-test").source = 'print("Exercise 1 passed: your uniform tokenizer is ttlib\'s.")'
    deleted = answered(CHEAP, {"03-uniform": None, "03-quantile": None})  # decode left undone, its test deleted
    deleted.cells.remove(cell(deleted, "03-decode-test"))
    return {"partial": partial, "raises": raises, "loops": loops, "edited": edited, "deleted": deleted}


def expected_scores() -> dict[str, dict[str, float]]:
    """{student: {assignment: score}}, from the points in the notebooks' nbgrader metadata."""
    scores = {"solutions": {a: sum(points(a).values()) for a in GRADED}, "unmodified": dict.fromkeys(GRADED, 0.0)}
    p = points(CHEAP)
    total = sum(p.values())
    lost = {"partial": total - p["03-uniform-test"], "raises": p["03-quantile-test"], "loops": p["03-decode-test"],
            "edited": p["03-uniform-test"], "deleted": p["03-decode-test"]}
    for student in SPECIAL:
        scores[student] = {**dict.fromkeys(GRADED, 0.0), CHEAP: total - lost[student]}
    return scores


def run(*args, env, timeout=1800, may_fail=False) -> str:
    """One command of the instructor guide, run from the repository root; its output (stdout and stderr)."""
    done = subprocess.run([sys.executable, "-m", *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout)
    output = f"exit status {done.returncode}\n{done.stdout}{done.stderr}"
    assert may_fail or done.returncode == 0, f"`{' '.join(args)}` failed:\n{output[-4000:]}"
    return output


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """A class graded end to end: release, collect, autograde, feedback, export. Returns what the tests read."""
    tmp = tmp_path_factory.mktemp("course")
    # one thread per kernel, as tests/conftest.py sets for pytest-xdist workers: the class is graded one by one
    env = {**os.environ, "TTLIB_COURSE_DIR": str(tmp / "grading"), "TTLIB_FAST": "1", "OMP_NUM_THREADS": "1"}
    from ttlib import data  # the course dataset, built before the short time limits apply (a no-op when there)

    data.load(data.DEFAULT_DATASET, progress=False)
    # sets up the course folder and its gradebook; says whether notebooks/student/ is what release generates now
    out = {"root": tmp / "grading", "release": run("ttlib", "grade", "release", "--check", env=env, may_fail=True)}
    special = special_submissions()
    for assignment in GRADED:
        folder = tmp / "downloads" / assignment  # what an instructor downloads: one <student>.ipynb each
        folder.mkdir(parents=True)
        nbformat.write(answered(assignment), folder / "solutions.ipynb")
        if assignment in UNMODIFIED:
            shutil.copyfile(STUDENT / f"{assignment}.ipynb", folder / "unmodified.ipynb")
        if assignment == CHEAP:
            for student, nb in special.items():
                nbformat.write(nb, folder / f"{student}.ipynb")
        out[f"collect {assignment}"] = run("ttlib", "grade", "collect", assignment, str(folder), env=env)
        limit = [f"--Execute.timeout={CELL_TIMEOUT if assignment == CHEAP else FAST_CELL_TIMEOUT}"]
        out[f"autograde {assignment}"] = run("nbgrader", "autograde", assignment, *limit, env=env)
    run("nbgrader", "generate_feedback", CHEAP, env=env)
    run("nbgrader", "export", "--to", str(tmp / "grades.csv"), env=env)
    run("nbgrader", "export", "--exporter", "ttlib.grade.StudentTotals", "--to", str(tmp / "totals.csv"), env=env)
    with open(tmp / "grades.csv", newline="") as f:
        out["grades"] = list(csv.DictReader(f))
    with open(tmp / "totals.csv", newline="") as f:
        out["totals"] = list(csv.DictReader(f))
    return out


def score(graded, assignment, student) -> tuple[float, float]:
    with Gradebook(f"sqlite:///{graded['root'] / 'gradebook.db'}") as gb:
        submission = gb.find_submission(assignment, student)
        return submission.score, submission.max_score


def autograded(graded, assignment, student):
    return read(graded["root"] / "autograded" / student / assignment / f"{assignment}.ipynb")


def errors(nb, grade_id) -> list[str]:
    return [o.ename for o in cell(nb, grade_id).outputs if o.output_type == "error"]


# ---- the student versions ------------------------------------------------------------------------------------------
def test_every_graded_notebook_has_a_student_version():
    assert GRADED[:5] == ["00_offline_rl_as_sequence_modeling", "01_attention", "02_kv_cache",
                          "03_trajectory_tokenizer", "04_trajectory_gpt"]
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
    shutil.copyfile(STUDENT / "02_kv_cache.ipynb", repo / "notebooks" / "student" / "02_kv_cache.ipynb")
    nb = solution_notebook("01_attention")
    cell(nb, "01-mask-test").source += "\nassert trajectory_mask(1, 1).shape == (1, 1)"
    nbformat.write(nb, repo / "notebooks" / "01_attention.ipynb")
    monkeypatch.setenv("TTLIB_COURSE_DIR", str(tmp_path / "grading"))
    course = grade.open_course(repo)
    report = grade.release(course, check=True)
    assert (report.written, report.unchanged, report.stale) == (["01_attention.ipynb"], [], ["02_kv_cache.ipynb"])
    assert read(repo / "notebooks" / "student" / "01_attention.ipynb") == student_notebook("01_attention")
    report = grade.release(course)
    assert "trajectory_mask(1, 1)" in cell(read(course.student_dir / "01_attention.ipynb"), "01-mask-test").source
    assert not (course.student_dir / "02_kv_cache.ipynb").exists()
    assert grade.release(course, check=True).unchanged == ["01_attention.ipynb"]


# ---- grading a class ------------------------------------------------------------------------------------------------
def test_committed_student_versions_are_what_release_generates(graded):
    assert graded["release"].startswith("exit status 0\n"), graded["release"]
    for assignment in GRADED:
        assert f"notebooks/student/{assignment}.ipynb: up to date" in graded["release"]


@pytest.mark.parametrize("assignment", GRADED)
def test_solutions_get_full_marks(graded, assignment):
    total = sum(points(assignment).values())
    assert score(graded, assignment, "solutions") == (total, total)


@pytest.mark.parametrize("assignment", UNMODIFIED)
def test_unmodified_student_versions_get_zero_without_crashing(graded, assignment):
    assert score(graded, assignment, "unmodified") == (0, sum(points(assignment).values()))
    nb = autograded(graded, assignment, "unmodified")
    for grade_id in points(assignment):
        assert errors(nb, grade_id), f"{grade_id} fails"
    assert [c for c in nb.cells if c.cell_type == "code"][-1].execution_count, "grading ran to the last cell"


def test_partly_correct_gets_exactly_the_points_of_the_right_exercise(graded):
    assert score(graded, CHEAP, "partial")[0] == points(CHEAP)["03-uniform-test"] == 3
    nb = autograded(graded, CHEAP, "partial")
    assert errors(nb, "03-uniform-test") == [] and errors(nb, "03-quantile-test") == ["AssertionError"]


def test_an_exercise_that_raises_gets_zero_and_grading_goes_on(graded):
    p = points(CHEAP)
    assert score(graded, CHEAP, "raises")[0] == p["03-uniform-test"] + p["03-decode-test"]
    assert errors(autograded(graded, CHEAP, "raises"), "03-quantile-test") == ["AssertionError"]  # "raised ..."
    assert "raised ValueError" in str(cell(autograded(graded, CHEAP, "raises"), "03-quantile-test").outputs)


def test_an_exercise_that_loops_forever_hits_the_time_limit_and_grading_goes_on(graded):
    p = points(CHEAP)
    assert score(graded, CHEAP, "loops")[0] == p["03-uniform-test"] + p["03-quantile-test"]
    nb = autograded(graded, CHEAP, "loops")
    assert "CellTimeoutError" in errors(nb, "03-decode-test")
    assert [c for c in nb.cells if c.cell_type == "code"][-1].execution_count, "the cells after the loop still ran"
    for student in ["partial", "raises", "solutions", "unmodified"]:  # graded after "loops" (alphabetical order)
        assert (graded["root"] / "autograded" / student / CHEAP).is_dir()
    assert "CellTimeoutError" not in json.dumps(autograded(graded, CHEAP, "solutions"))


def test_edited_and_deleted_test_cells_are_reported_and_undone(graded):
    p = points(CHEAP)
    report = graded[f"collect {CHEAP}"]
    assert re.search(r"^edited .* test cell 03-uniform-test edited", report, re.M)
    assert re.search(r"^deleted .* test cell 03-decode-test deleted", report, re.M)
    assert sum("edited" in line or "deleted" in line for line in report.splitlines()) == 2, report
    # nbgrader restores both test cells before it runs them: the edit and the deletion gain nothing
    assert score(graded, CHEAP, "edited")[0] == p["03-quantile-test"] + p["03-decode-test"]
    assert score(graded, CHEAP, "deleted")[0] == p["03-uniform-test"] + p["03-quantile-test"]
    assert "AssertionError" in errors(autograded(graded, CHEAP, "edited"), "03-uniform-test")
    assert "AssertionError" in errors(autograded(graded, CHEAP, "deleted"), "03-decode-test")
    flagged = {row["student_id"]: row["flagged"] for row in graded["totals"]}
    assert flagged.pop("edited") == f"{CHEAP}: test cell 03-uniform-test edited"
    assert flagged.pop("deleted") == f"{CHEAP}: test cell 03-decode-test deleted"
    assert set(flagged.values()) == {""}


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


def test_feedback_for_every_student(graded):
    for student in ["solutions", "unmodified", *SPECIAL]:
        html = graded["root"] / "feedback" / student / CHEAP / f"{CHEAP}.html"
        total = sum(points(CHEAP).values())
        got = expected_scores()[student][CHEAP]
        assert re.search(rf"Score: {got:g}(\.0)? / {total:g}(\.0)?", html.read_text()), student


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


def test_grade_commands_need_the_repository_root(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert "run `ttlib grade` (and nbgrader) from the root of the course repository" in grade_error(
        capsys, "release")
