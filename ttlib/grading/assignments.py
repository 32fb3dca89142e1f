"""Grading the course's exercises with nbgrader: nbgrader grades, ttlib only moves and checks files.

Every graded notebook `notebooks/NN_name.ipynb` is one nbgrader assignment `NN_name` holding that one notebook. The
course folder (nbgrader's source/, release/, submitted/, autograded/, feedback/, gradebook.db) is set in the
repository's `nbgrader_config.py`: `grading/` unless the environment variable TTLIB_COURSE_DIR names another one.

    ttlib grade release           nbgrader generate_assignment for every graded notebook, and the student versions
                                  copied to notebooks/student/ (--check: only say whether those are up to date)
    ttlib grade collect A FOLDER  a flat folder of <student>.ipynb files -> submitted/<student>/A/A.ipynb, reporting
                                  test cells a student edited or deleted (nbgrader's checksums)

The rest is nbgrader itself (`nbgrader autograde A`, `nbgrader generate_feedback A`, `nbgrader export`), plus
`StudentTotals`, an nbgrader export plugin that writes one row per student.
"""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
from nbgrader.plugins import ExportPlugin

from ttlib.course.challenge import FILE as CHALLENGE_FILE
from ttlib.course.challenge import NOTEBOOK as CHALLENGE_NOTEBOOK
from ttlib.course.notebooks import NOTEBOOKS
from ttlib.errors import TTLibError
from ttlib.files import atomic_path

__all__ = ["BADGE_PATH", "CONFIG_FILE", "Course", "GradingError", "NOTEBOOK_PATTERN", "ReleaseReport", "STUDENT_DIR",
           "STUDENT_ID", "StudentTotals", "assignments", "collect", "graded_notebooks", "open_course", "points",
           "release", "source_version", "tampering"]

CONFIG_FILE = "nbgrader_config.py"
STUDENT_DIR = "student"  # student versions live in notebooks/student/
NOTEBOOK_PATTERN = "[0-9][0-9]_*.ipynb"
STUDENT_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@+-]*$")  # what a submission's file name may be (before .ipynb)
BADGE_PATH = re.compile(r"(/blob/[\w.-]+/notebooks/)([\w.-]+\.ipynb\))")


class GradingError(TTLibError, ValueError):
    """Bad input to a `ttlib grade` command: the message says what to fix."""


# ---- the course: where things are -------------------------------------------------------------------------------
@dataclass
class Course:
    repo: Path  # the repository root (holds nbgrader_config.py and notebooks/)
    config: object  # the traitlets Config nbgrader reads from nbgrader_config.py
    root: Path  # nbgrader's course folder

    @property
    def notebooks(self) -> Path:
        return self.repo / "notebooks"

    @property
    def student_dir(self) -> Path:
        return self.notebooks / STUDENT_DIR

    def released(self, assignment: str) -> Path:
        return self.root / "release" / assignment / f"{assignment}.ipynb"

    def submitted(self, student: str, assignment: str) -> Path:
        return self.root / "submitted" / student / assignment / f"{assignment}.ipynb"


def open_course(repo: str | Path = ".") -> Course:
    """The course configured by `repo`/nbgrader_config.py (read exactly as nbgrader reads it)."""
    from nbgrader.coursedir import CourseDirectory
    from traitlets.config.loader import PyFileConfigLoader

    repo = Path(repo).resolve()
    if not (repo / CONFIG_FILE).is_file() or not (repo / "notebooks").is_dir():
        raise GradingError(f"no {CONFIG_FILE} and notebooks/ in {repo}: run `ttlib grade` (and nbgrader) from the "
                           "root of the course repository")
    config = PyFileConfigLoader(CONFIG_FILE, path=str(repo)).load_config()
    return Course(repo, config, Path(CourseDirectory(config=config).root))


def graded_notebooks(notebooks: Path) -> list[Path]:
    """The course's notebooks (NOTEBOOKS, in `notebooks`) with at least one graded test cell."""
    paths = [notebooks / name for name in NOTEBOOKS]
    return [p for p in paths if p.exists() and points(nbformat.read(p, as_version=4))]


def points(nb) -> dict[str, float]:
    """{grade_id: points} of a notebook's graded test cells, in order."""
    return {c.metadata.nbgrader["grade_id"]: float(c.metadata.nbgrader["points"]) for c in nb.cells
            if c.metadata.get("nbgrader", {}).get("grade")}


def assignments(course: Course) -> list[str]:
    return [p.stem for p in graded_notebooks(course.notebooks)]


# ---- release: the student versions ------------------------------------------------------------------------------
def source_version(nb, name: str):
    """The notebook nbgrader turns into the student version: the solution notebook with its Colab badge pointing
    to notebooks/student/<name>. (What a learner does with it, the header's Exercises paragraph says.)"""
    nb = nbformat.from_dict(json.loads(json.dumps(nb)))  # a deep copy
    header = nb.cells[0]
    header.source, n_badges = BADGE_PATH.subn(rf"\g<1>{STUDENT_DIR}/\g<2>", header.source, count=1)
    if n_badges != 1:
        raise GradingError(f"notebooks/{name}: its first cell has no Colab badge linking to notebooks/{name}")
    nb.metadata.pop("ttlib", None)  # the record of the committed outputs' run (tools.outputs): not the student's
    for cell in nb.cells:
        cell.metadata.pop("ttlib", None)
    return nb


def _with_own_scripts_on_path() -> None:
    """nbgrader runs the `alembic` command to open its gradebook; find it beside this Python even when its
    environment is not activated (e.g. `.venv/bin/ttlib grade release`)."""
    scripts = os.path.dirname(sys.executable)
    if scripts not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = scripts + os.pathsep + os.environ.get("PATH", "")


def _generate(course: Course, assignment: str) -> None:
    """nbgrader generate_assignment: solutions stubbed, hidden tests removed, outputs cleared, checksums added."""
    from nbgrader.converters import GenerateAssignment
    from nbgrader.coursedir import CourseDirectory

    _with_own_scripts_on_path()

    coursedir = CourseDirectory(config=course.config)
    coursedir.assignment_id = assignment
    app = GenerateAssignment(coursedir=coursedir, config=course.config)
    app.force = True  # regenerate over an older release
    app.create_assignment = True  # add it to the gradebook
    app.log.setLevel("WARNING")
    try:
        app.start()
    except Exception as e:  # nbgrader logs the details above
        raise GradingError(f"nbgrader generate_assignment {assignment} failed: {e}") from e


@dataclass
class ReleaseReport:
    written: list[str] = field(default_factory=list)  # student versions written (they were new or changed)
    unchanged: list[str] = field(default_factory=list)
    stale: list[str] = field(default_factory=list)  # out of date (check) or removed (release): no solution notebook


def release(course: Course, check: bool = False) -> ReleaseReport:
    """Run nbgrader generate_assignment for every graded notebook and put the student versions in
    notebooks/student/. With `check`, write nothing there: only report which ones differ."""
    report = ReleaseReport()
    names = []
    for path in graded_notebooks(course.notebooks):
        assignment = path.stem
        names.append(path.name)
        source = course.root / "source" / assignment / path.name
        source.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(str(source)) as tmp:
            nbformat.write(source_version(nbformat.read(path, as_version=4), path.name), tmp)
        _generate(course, assignment)
        student_text = course.released(assignment).read_text(encoding="utf-8")
        target = course.student_dir / path.name
        if target.is_file() and target.read_text(encoding="utf-8") == student_text:
            report.unchanged.append(path.name)
            continue
        report.written.append(path.name)
        if not check:
            with atomic_path(str(target)) as tmp:
                Path(tmp).write_text(student_text, encoding="utf-8")
    for old in sorted(course.student_dir.glob(NOTEBOOK_PATTERN)):
        if old.name not in names:
            report.stale.append(old.name)
            if not check:
                old.unlink()
    return report


# ---- collect: a folder of submissions into nbgrader's layout ----------------------------------------------------
def tampering(submitted, released) -> list[str]:
    """The read-only cells of `released` (test cells) that `submitted` changed or deleted, found with nbgrader's
    checksums. nbgrader puts them back before grading, so they gain nothing; an instructor wants to know."""
    from nbgrader.utils import compute_checksum, is_grade, is_locked

    cells = {c.metadata["nbgrader"].get("grade_id"): c for c in submitted.cells if "nbgrader" in c.metadata}
    problems = []
    for cell in released.cells:
        if not is_locked(cell) or "checksum" not in cell.metadata.nbgrader:
            continue
        grade_id = cell.metadata.nbgrader["grade_id"]
        kind = "test cell" if is_grade(cell) else "read-only cell"
        if grade_id not in cells:
            problems.append(f"{kind} {grade_id} deleted")
            continue
        try:
            same = compute_checksum(cells[grade_id]) == cell.metadata.nbgrader["checksum"]
        except (KeyError, TypeError, ValueError):  # its nbgrader metadata was edited too
            same = False
        if not same:
            problems.append(f"{kind} {grade_id} edited")
    return problems


def _read_submission(path: Path):
    try:
        nb = nbformat.read(path, as_version=4)
        nbformat.validate(nb)
    except Exception as e:  # nbformat raises several kinds; any of them means "not a notebook"
        raise GradingError(f"{path.name}: not a readable Jupyter notebook ({type(e).__name__}: "
                           f"{str(e).splitlines()[0][:200] if str(e) else ''})") from e
    return nb


def collect(course: Course, assignment: str, folder: str | Path) -> dict[str, list[str]]:
    """Copy every <student>.ipynb in `folder` to submitted/<student>/<assignment>/<assignment>.ipynb, where
    `nbgrader autograde <assignment>` grades it (for the challenge, notebook 10, also <student>.challenge.safetensors,
    the agent, to challenge.safetensors beside it). Checks everything first and copies nothing if anything is wrong.
    Returns {student: problems}, the test cells each student edited or deleted."""
    known = assignments(course)
    if assignment not in known:
        raise GradingError(f"unknown assignment {assignment!r}; the graded notebooks are: {', '.join(known)}")
    released_path = course.released(assignment)
    if not released_path.is_file():
        raise GradingError(f"{assignment} is not released in {course.root} yet: run `ttlib grade release` first")
    folder = Path(folder)
    if not folder.is_dir():
        raise GradingError(f"no folder {folder}: expected a folder holding one <student>.ipynb per student")
    entries = sorted(p for p in folder.iterdir() if not p.name.startswith("."))
    errors, submissions = [], {}
    agents = _agent_files(assignment, entries)  # the challenge's: <student>.challenge.safetensors beside the notebook
    for path in entries:
        if path in agents.values():
            continue
        if path.is_dir() or path.suffix != ".ipynb":
            errors.append(f"{path.name}: not a notebook; expected only <student>.ipynb files")
        elif not STUDENT_ID.match(path.stem):
            errors.append(f"{path.name}: name it <student id>.ipynb (letters, digits, _ . @ + -)")
        else:
            try:
                submissions[path.stem] = (path, _read_submission(path))
            except GradingError as e:
                errors.append(str(e))
    if errors:
        raise GradingError(f"nothing collected from {folder}, fix these first:\n  " + "\n  ".join(errors))
    if not submissions:
        raise GradingError(f"no <student>.ipynb files in {folder}")
    strays = sorted(student for student in agents if student not in submissions)
    if strays:
        raise GradingError(f"nothing collected from {folder}: an agent file without its notebook: "
                           + ", ".join(agents[s].name for s in strays))
    released = nbformat.read(released_path, as_version=4)
    report = {}
    for student, (path, nb) in submissions.items():
        target = course.submitted(student, assignment)
        copies = [(path, target)]
        if student in agents:
            copies.append((agents[student], target.parent / CHALLENGE_FILE))
        for source, to in copies:
            with atomic_path(str(to)) as tmp:
                shutil.copyfile(source, tmp)  # exactly what the student handed in
        report[student] = tampering(nb, released)
    return report


def _agent_files(assignment: str, entries: list[Path]) -> dict[str, Path]:
    """{student: their agent file} of the challenge's notebook, <student>.challenge.safetensors; none elsewhere."""
    suffix = "." + CHALLENGE_FILE
    if assignment != CHALLENGE_NOTEBOOK:
        return {}
    return {p.name[:-len(suffix)]: p for p in entries if p.is_file() and p.name.endswith(suffix)}


# ---- export: one row per student ---------------------------------------------------------------------------------
def _number(x: float) -> str:
    return f"{x:g}"


class StudentTotals(ExportPlugin):
    """nbgrader export plugin: one CSV row per student, a score column per assignment, the total, and the test
    cells the student edited or deleted:
    `nbgrader export --exporter ttlib.grading.assignments.StudentTotals --to totals.csv`."""

    def export(self, gradebook) -> None:
        from nbgrader.api import MissingEntry

        dest = self.to or "totals.csv"
        wanted_students = {str(s) for s in self.student}
        wanted_assignments = {str(a) for a in self.assignment}
        names = [a.name for a in gradebook.assignments if not wanted_assignments or a.name in wanted_assignments]
        max_total = sum(gradebook.find_assignment(a).max_score for a in names)
        coursedir = getattr(self.parent, "coursedir", None)
        header = ["student_id", *names, "total", "max_total", "flagged"]
        rows = []
        for student in gradebook.students:
            if wanted_students and student.id not in wanted_students:
                continue
            scores, flagged = [], []
            for name in names:
                try:
                    submission = gradebook.find_submission(name, student.id)
                except MissingEntry:
                    scores.append(0.0)  # nothing handed in
                    continue
                scores.append(max(0.0, submission.score - submission.late_submission_penalty))
                flagged += [f"{name}: {p}" for p in self._tampering(coursedir, name, student.id)]
            rows.append([student.id, *map(_number, scores), _number(sum(scores)), _number(max_total),
                         "; ".join(flagged)])
        self.log.info("Exporting one row per student (%d) to %s", len(rows), dest)
        with atomic_path(dest) as tmp, open(tmp, "w", newline="", encoding="utf-8") as f:
            writer = csv.writer(f)
            writer.writerow(header)
            writer.writerows(rows)

    @staticmethod
    def _tampering(coursedir, assignment: str, student: str) -> list[str]:
        if coursedir is None:
            return []
        root = Path(coursedir.root)
        submitted = root / "submitted" / student / assignment / f"{assignment}.ipynb"
        released = root / "release" / assignment / f"{assignment}.ipynb"
        flags = []
        if submitted.is_file() and released.is_file():
            flags += tampering(nbformat.read(submitted, as_version=4), nbformat.read(released, as_version=4))
        for graded in sorted((root / "autograded" / student / assignment).glob("*.ipynb")):  # the scan's flags
            flags += nbformat.read(graded, as_version=4).metadata.get("ttlib", {}).get("flags") or []
        return flags
