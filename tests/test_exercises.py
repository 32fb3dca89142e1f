"""Wrong, delegating and tampering answers to the exercises, each run against its notebook's own test cell (hidden
tests included) in a real Jupyter kernel: the catalogue of mistakes is the test of the messages learners read.

Every file in tests/wrong_answers/ holds the answers for one notebook (named like it): a list ANSWERS of
`(grade_id, why, answer, says)`. `grade_id` names the exercise's solution cell; `answer` is either a pair
`(old, new)` -- the solution with `old` replaced by `new`, once -- or a whole new source for the cell; `says` is a
piece of text the failure must show: the sentence that names the mistake (ttlib.exercises' diagnoses) or, for a
mistake no diagnosis fits, where the answer first differs.

The solution notebook's setup cells, exercise cells and test cells run in one kernel, in fast mode (the demos are
not needed: every test builds its own trials), started as the grader starts a submission's: in a sandbox, forked
from a process that imported PyTorch and ttlib once (ttlib.grading.kernels; afresh where the sandbox cannot run),
which spares each notebook's kernel its seconds of imports. Right after an exercise's test cell has passed, each
wrong answer to it is run in the solution cell's place and the test cell is run again: it must fail with
`ExerciseFailed` -- what the learner sees first, and what nbgrader scores as zero for that exercise -- and say
`says`. The solution is then run again (and ttlib.course.checks reloaded, in case the answer rebound it), so the
notebook goes on with the right answer. tests/test_grading.py grades a few of these with nbgrader itself, to show the
scores are the ones this predicts.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

from ttlib.course.notebooks import NOTEBOOKS as NOTEBOOK_LIST
from ttlib.exercises import find
from ttlib.grading import sandbox
from ttlib.grading.kernels import SandboxedKernelManager

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
ANSWER_FILES = sorted((Path(__file__).parent / "wrong_answers").glob("[0-9][0-9]_*.py"))
CELL_TIMEOUT = 300  # seconds; the slowest graded cell in fast mode takes well under a minute
# run before the right answer comes back: a tampering answer may have rebound ttlib.course.checks for the cells after it
RESTORE = "import importlib\nimport ttlib.course.checks\nimportlib.reload(ttlib.course.checks)\n"


def load_module(path: Path):
    spec = importlib.util.spec_from_file_location(f"wrong_answers_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_answers(path: Path) -> list[tuple]:
    return load_module(path).ANSWERS


def grade_id(cell) -> str:
    return cell.metadata.get("nbgrader", {}).get("grade_id", "")


def wrong_source(solution: str, answer) -> str:
    if isinstance(answer, str):
        return answer
    old, new = answer
    assert solution.count(old) == 1, f"{old!r} should occur exactly once in the solution"
    return solution.replace(old, new)


def error_text(error: CellExecutionError) -> str:
    return f"{error.ename}: {error.evalue}"


def solution_of(exercise: str) -> str:
    """The grade_id of the solution cell an exercise checks: its own, or for a graded stage (e.g. 05's 4a) the
    whole exercise's."""
    found = find(exercise)
    return found.cell if found is not None and found.cell else exercise


def is_graded_path(cell) -> bool:
    """The cells a test needs: set-up (imports, settings), the exercises and their tests; not the demos."""
    return cell.cell_type == "code" and ("setup" in cell.metadata.get("tags", []) or bool(grade_id(cell)))


@contextlib.contextmanager
def kernel_in(box: sandbox.Sandbox, nb):
    """A kernel in fast mode for `nb`, as the grader starts one (ttlib.grading.kernels): in `box`'s scratch folder,
    where what the answers write (notebook 10: an agent file) lands, never beside nbval's run; forked from this
    process's zygote, PyTorch and ttlib imported once, where the sandbox runs (afresh elsewhere) -> its client."""
    km = SandboxedKernelManager(kernel_name="python3")
    km.sandbox, km.preload, km.connection_file = box, True, str(box.scratch / "kernel.json")
    client = NotebookClient(nb, km=km, timeout=CELL_TIMEOUT, resources={"metadata": {"path": str(box.scratch)}})
    forked = None
    try:
        with client.setup_kernel(env=box.environment({**os.environ, "TTLIB_FAST": "1"}), cwd=str(box.scratch)):
            forked = km.forked and (km.forked, sandbox.started(km.forked.pid))
            yield client
    finally:
        if forked:  # what the client's shutdown left of the sandbox's tree is ended, the wrapper reaped: the zygote
            sandbox.end_tree(forked[0].pid, box.grace, forked[1])  # is free for the next kernel
            forked[0].wait(30)


def run_with_wrong_answers(stem: str, answers: list[tuple]) -> list[dict]:
    """Run notebooks/<stem>.ipynb's set-up, exercise and test cells with every wrong answer tried after its
    exercise's test; one record per answer."""
    nb = nbformat.read(NOTEBOOKS / f"{stem}.ipynb", as_version=4)
    ids = [grade_id(c) for c in nb.cells]
    by_exercise: dict[str, list[tuple]] = {}
    for answer in answers:
        assert solution_of(answer[0]) in ids, f"{stem}: no solution cell {answer[0]!r}"
        by_exercise.setdefault(answer[0], []).append(answer)
    records = []
    with sandbox.Sandbox(name=f"wrong-{stem}") as box, kernel_in(box, nb) as client:
        for index, cell in enumerate(nb.cells):
            if not is_graded_path(cell):
                continue
            client.execute_cell(cell, index)  # the solution notebook itself must pass
            exercise = grade_id(cell).removesuffix("-test")
            if not grade_id(cell).endswith("-test") or exercise not in by_exercise:
                continue
            solution = nb.cells[ids.index(solution_of(exercise))]
            for _, why, answer, *says in by_exercise[exercise]:
                record = {"exercise": exercise, "why": why, "says": says[0] if says else None, "failure": None}
                try:
                    client.execute_cell(nbformat.v4.new_code_cell(wrong_source(solution.source, answer)), index)
                except CellExecutionError as error:
                    record["answer_raised"] = error_text(error)
                try:
                    client.execute_cell(nbformat.v4.new_code_cell(cell.source), index)
                except CellExecutionError as error:
                    record["failure"], record["ename"] = error_text(error), error.ename
                    record["shown"] = error.traceback if hasattr(error, "traceback") else ""
                records.append(record)
                client.execute_cell(nbformat.v4.new_code_cell(RESTORE + solution.source), index)  # the right answer
    return records


@pytest.mark.slow
@pytest.mark.parametrize("path", ANSWER_FILES, ids=[p.stem for p in ANSWER_FILES])
def test_every_wrong_answer_fails_its_exercise_and_is_named(path):
    answers = load_answers(path)
    exercises = {c.metadata["nbgrader"]["grade_id"] for c in nbformat.read(NOTEBOOKS / f"{path.stem}.ipynb",
                                                                            as_version=4).cells
                 if c.metadata.get("nbgrader", {}).get("solution")}
    missing = exercises - {answer[0] for answer in answers}
    assert not missing, f"exercises without a wrong answer: {sorted(missing)}"
    unsaid = [answer[1] for answer in answers if len(answer) < 4 or not answer[3]]
    assert not unsaid, f"wrong answers without the message they must get (`says`): {unsaid}"
    problems = []
    for record in run_with_wrong_answers(path.stem, answers):
        where = f"{record['exercise']} ({record['why']})"
        if "answer_raised" in record:
            problems.append(f"{where}: the answer cell itself raised {record['answer_raised'][:300]}")
        elif record["failure"] is None:
            problems.append(f"{where}: passed its test")
        elif record["ename"] != "ExerciseFailed":
            problems.append(f"{where}: failed with {record['failure'][:300]}, not the exercise's check")
        elif record["says"] not in record["failure"]:
            problems.append(f"{where}: the failure does not say {record['says']!r}: {record['failure'][:400]}")
    assert not problems, "\n".join(problems)


def test_every_graded_notebook_has_wrong_answers():
    graded = [name.removesuffix(".ipynb") for name in NOTEBOOK_LIST
              if any(grade_id(c) for c in nbformat.read(NOTEBOOKS / name, as_version=4).cells)]
    assert [p.stem for p in ANSWER_FILES] == graded
