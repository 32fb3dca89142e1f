"""Every way of cheating an in-process checker that was tried on this course (tests/wrong_answers/cheats.py) scores 0
in the graders' hidden tests and is flagged by the static scan; honest solutions are neither refused nor flagged.

The hidden tests run for real: `python -m ttlib.exercises.hidden` on the submission in a sandboxed process of its
own, forked from the zygote, and the grader's judge (`judge_records`) in this one, as nbgrader's autograde does.
"""

from __future__ import annotations

import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import nbformat
import pytest
from test_exercises import load_module  # tests/ is on sys.path under pytest

from ttlib.course.notebooks import NOTEBOOKS as NOTEBOOK_LIST
from ttlib.exercises.hidden import judge_records
from ttlib.grading import sandbox
from ttlib.grading.scan import scan_notebook, scan_source

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
CHEATS = load_module(Path(__file__).parent / "wrong_answers" / "cheats.py").CHEATS
ATTENTION = "01_attention"
SEED = 424242


def grade_id(cell) -> str:
    return cell.metadata.get("nbgrader", {}).get("grade_id", "")


def submission(tmp_path: Path, name: str, exercise: str, source: str) -> Path:
    """The solution notebook with one exercise cell replaced by `source`, written as <name>.ipynb."""
    nb = nbformat.read(NOTEBOOKS / f"{ATTENTION}.ipynb", as_version=4)
    next(c for c in nb.cells if grade_id(c) == exercise).source = source
    path = tmp_path / f"{name}.ipynb"
    nbformat.write(nb, path)
    return path


def hidden_verdicts(submitted: Path, exercises: list[str], released: Path | None = None) -> dict:
    """The graders' hidden tests on `submitted`, in a sandboxed process of their own forked from this process's
    zygote (as autograde runs them: ttlib.grading.hidden_tests), judged here."""
    released = released or NOTEBOOKS / "student" / f"{ATTENTION}.ipynb"
    files = {"released.ipynb": released.read_bytes(), "submitted.ipynb": submitted.read_bytes()}
    done = sandbox.run([sys.executable, "-m", "ttlib.exercises.hidden", "released.ipynb", "submitted.ipynb",
                        "--exercises", ",".join(exercises), "--seed", str(SEED)],
                       sandbox.Limits(wall_seconds=600), files=files, name="cheat", preload=True)
    return judge_records(done.stdout.decode().splitlines(), exercises, SEED)


@pytest.mark.slow
def test_every_cheat_scores_zero_in_the_hidden_tests_and_is_flagged(tmp_path):
    paths = {name: submission(tmp_path, name, "01-sdpa", source) for name, (_, source) in CHEATS.items()}
    with ThreadPoolExecutor(max_workers=2) as pool:
        verdicts = dict(zip(paths, pool.map(lambda p: hidden_verdicts(p, ["01-sdpa"]), paths.values()),
                            strict=True))
    problems = []
    for name, (what, source) in CHEATS.items():
        if verdicts[name]["01-sdpa"] is None:
            problems.append(f"{name} ({what}): passed the hidden tests")
        if not scan_source(source):
            problems.append(f"{name} ({what}): not flagged by the scan")
    assert not problems, "\n".join(problems)


@pytest.mark.slow
def test_an_honest_submission_passes_the_hidden_tests_out_of_process(tmp_path):
    nb = nbformat.read(NOTEBOOKS / f"{ATTENTION}.ipynb", as_version=4)
    exercises = [grade_id(c) for c in nb.cells if nb and c.metadata.get("nbgrader", {}).get("solution")]
    path = tmp_path / "honest.ipynb"
    nbformat.write(nb, path)
    assert hidden_verdicts(path, exercises) == dict.fromkeys(exercises)


def test_a_wrong_answer_fails_the_hidden_tests_with_its_diagnosis(tmp_path):
    solution = next(c.source for c in nbformat.read(NOTEBOOKS / f"{ATTENTION}.ipynb", as_version=4).cells
                    if grade_id(c) == "01-sdpa")
    path = submission(tmp_path, "unscaled", "01-sdpa", solution.replace(" / math.sqrt(q.shape[-1])", ""))
    verdict = hidden_verdicts(path, ["01-sdpa"])["01-sdpa"]
    assert verdict is not None and "without the 1/sqrt(d) scaling" in verdict


@pytest.mark.parametrize("name", list(NOTEBOOK_LIST))
def test_the_solutions_are_not_flagged(name):
    solution = nbformat.read(NOTEBOOKS / name, as_version=4)
    released = nbformat.read(NOTEBOOKS / "student" / name, as_version=4)
    assert [str(flag) for flag in scan_notebook(solution, released)] == []


def test_the_student_versions_are_not_flagged():
    for name in NOTEBOOK_LIST:
        released = nbformat.read(NOTEBOOKS / "student" / name, as_version=4)
        assert scan_notebook(released, released) == [], name
