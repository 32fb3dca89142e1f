"""`ttlib grade autograde ASSIGNMENT`: a class graded N submissions at a time, on this machine or on a Ray cluster,
with the same plugins, sandbox and hidden tests as `nbgrader autograde`, and one process writing the gradebook.

nbgrader's autograde grades one submission at a time, and two of them cannot run at once: both would write the one
SQLite gradebook, and each one's bookkeeping assumes it is alone (it creates students and submissions, deletes a
failed submission's folder). Here the work is cut where nbgrader's own converter can be run twice:

1. each submission is graded by nbgrader's autograde, unchanged, in a course folder of its own (ttlib.grading.worker:
   the release, the submission, and a copy of the gradebook with the assignment's cells and no student) -- in a
   pool of processes on this machine (`jobs`), or in a task on a worker of a Ray cluster (`ray`);
2. this process books each graded notebook as it comes back, one at a time: nbgrader's autograde again, on the
   course folder, in which the notebook the worker graded replaces running the submission and only the steps from
   SaveAutoGrades on run (the grades, the late penalty). Grades are written by nbgrader's code, by one process; a
   notebook's grades in one transaction (ttlib.grading.plugins.SaveAutoGrades). A worker lost mid-grading books
   nothing: its submission is graded again (ttlib.grading.layouts: where the work runs).

Each graded notebook records what it was graded from (a hash of the submission and the release): a run grades only
the submissions that are new or changed since, unless `force` (one graded by `nbgrader autograde`, which records
nothing, counts as changed when a file of it is newer than its graded notebook).

    report = autograde(course, ["01_attention"], jobs=4)        # this machine
    report = autograde(course, ["01_attention", "02_trajectory_tokenizer"], ray="10.0.0.5:6379")
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
from nbconvert.preprocessors import Preprocessor

from ttlib.grading.layouts import default_jobs, on_ray, on_this_machine
from ttlib.grading.worker import Graded, Shared, carried_env, template_gradebook

__all__ = ["Replay", "Report", "Submission", "autograde", "book", "booking_steps", "default_jobs", "on_ray",
           "on_this_machine", "plan", "scores", "shared_settings", "with_options"]


@dataclass
class Submission:
    student: str
    files: dict[str, bytes]  # everything in submitted/<student>/<assignment>/
    digest: str  # of the submission and the release: what its graded notebook records
    shared: Shared  # its assignment's: the release, the gradebook's cells, the settings

    @property
    def assignment(self) -> str:
        return self.shared.assignment


@dataclass
class Report:
    graded: list[tuple[str, str]] = field(default_factory=list)  # (assignment, student)
    up_to_date: list[tuple[str, str]] = field(default_factory=list)
    failed: dict[tuple[str, str], str] = field(default_factory=dict)  # (assignment, student) -> why
    seconds: float = 0.0
    jobs: int = 1
    where: str = "this machine"
    logs: list[Path] = field(default_factory=list)  # autograde_<assignment>.log in the course folder


# ---- what to grade ----------------------------------------------------------------------------------------------
def _files(folder: Path, ignore: list[str]) -> dict[str, bytes]:
    """Every file below `folder` (relative paths), but what nbgrader ignores when it copies folders."""
    out = {}
    for path in sorted(folder.rglob("*")):
        parts = path.relative_to(folder).parts
        if path.is_file() and not any(fnmatch.fnmatch(part, pattern) for part in parts for pattern in ignore):
            out[str(path.relative_to(folder))] = path.read_bytes()
    return out


def _digest(*file_sets: dict[str, bytes]) -> str:
    h = hashlib.sha256()
    for files in file_sets:
        for name in sorted(files):
            h.update(name.encode() + b"\0" + hashlib.sha256(files[name]).digest())
        h.update(b"\1")
    return h.hexdigest()


def _up_to_date(graded_folder: Path, submitted: Path, digest: str) -> bool:
    """Whether a submission's graded notebooks are of this submission and release: they say they were graded from
    `digest` -- or, graded by `nbgrader autograde` (which keeps no such record), they are newer than every file of
    the submission, as nbgrader itself would judge."""
    graded = list(graded_folder.glob("*.ipynb"))
    if not graded:
        return False
    found = set()
    for path in graded:
        try:
            found.add(nbformat.read(path, as_version=4).metadata.get("ttlib", {}).get("graded_from"))
        except Exception:  # noqa: BLE001 (a half-written or unreadable notebook: grade it again)
            return False
    if found == {None}:
        newest = max((p.stat().st_mtime for p in submitted.rglob("*") if p.is_file()), default=0.0)
        return min(p.stat().st_mtime for p in graded) > newest
    return found == {digest}


def plan(coursedir, shared: Shared, force: bool) -> tuple[list[Submission], list[str]]:
    """(the submissions of `shared.assignment` to grade, the students whose graded notebooks are up to date), in
    order of student."""
    import glob
    import re

    assignment = shared.assignment
    pattern = re.compile(coursedir.format_path(coursedir.submitted_directory, "(?P<student>[^/]+)", assignment,
                                               escape=True) + "$")
    excluded = set(filter(None, coursedir.student_id_exclude.split(",")))
    todo, current = [], []
    for folder in sorted(glob.glob(coursedir.format_path(coursedir.submitted_directory, "*", assignment))):
        found = pattern.match(folder)
        if not found or not os.path.isdir(folder) or found["student"] in excluded:
            continue
        student = found["student"]
        files = _files(Path(folder), coursedir.ignore)
        digest = _digest(files, shared.release)
        graded = Path(coursedir.format_path(coursedir.autograded_directory, student, assignment))
        if not force and _up_to_date(graded, Path(folder), digest):
            current.append(student)
        else:
            todo.append(Submission(student, files, digest, shared))
    return todo, current


def shared_settings(coursedir, config, assignment: str) -> Shared:
    """What every worker of this run gets: the release, the source's other files, a gradebook without students, the
    configuration, the run's settings, and the instructor's folders its sandbox must keep out of reach."""
    from ttlib.grading.assignments import GradingError

    release = Path(coursedir.format_path(coursedir.release_directory, ".", assignment))
    if not any(release.glob("*.ipynb")):
        raise GradingError(f"{assignment} is not released in {coursedir.root} yet: run `ttlib grade release` first")
    gradebook = coursedir.db_url.removeprefix("sqlite:///")
    if not coursedir.db_url.startswith("sqlite:///") or not os.path.isfile(gradebook):
        raise GradingError(f"no sqlite gradebook at {coursedir.db_url}: run `ttlib grade release` first")
    source = Path(coursedir.format_path(coursedir.source_directory, ".", assignment))
    others = {k: v for k, v in _files(source, coursedir.ignore).items() if not k.endswith(".ipynb")} \
        if source.is_dir() else {}
    return Shared(assignment, _files(release, coursedir.ignore), others, template_gradebook(gradebook),
                  _with_challenge_secret(dict(config), coursedir, assignment), carried_env(),
                  sorted({str(coursedir.root), os.getcwd()}))


def _with_challenge_secret(settings: dict, coursedir, assignment: str) -> dict:
    """The challenge's secret seeds travel to the workers, whose course folder is a copy without it."""
    from traitlets.config import Config

    from ttlib.course.challenge import NOTEBOOK
    from ttlib.grading.challenge import course_secret

    if assignment == NOTEBOOK:
        execute = Config(settings.get("BoundedExecute") or {})
        if not execute.get("challenge_seed"):
            execute.challenge_seed = course_secret(str(coursedir.root))
        settings["BoundedExecute"] = execute
    return settings


# ---- booking: one process writes the gradebook ---------------------------------------------------------------------
class Replay(Preprocessor):
    """In the booking run, the notebook a worker graded takes the submission's place (by notebook name), with the
    record of what it was graded from."""

    def __init__(self, notebooks: dict[str, str], digest: str, **kwargs):
        super().__init__(**kwargs)
        self.enabled = True
        self.notebooks, self.digest = notebooks, digest

    def preprocess(self, nb, resources):
        name = f"{resources['nbgrader']['notebook']}.ipynb"
        if name not in self.notebooks:
            raise ValueError(f"the worker sent back no graded {name}")
        nb = nbformat.reads(self.notebooks[name], as_version=4)
        nb.metadata.setdefault("ttlib", {})["graded_from"] = self.digest
        return nb, resources


def booking_steps(config) -> list:
    """The configured autograde steps from SaveAutoGrades on: the ones that write the gradebook (the steps before
    it ran in the worker)."""
    from nbgrader.converters import Autograde
    from nbgrader.preprocessors import SaveAutoGrades
    from traitlets.utils.importstring import import_item

    from ttlib.grading.assignments import GradingError

    steps = list(Autograde(config=config).autograde_preprocessors)
    for i, step in enumerate(steps):
        cls = import_item(step) if isinstance(step, str) else step
        if isinstance(cls, type) and issubclass(cls, SaveAutoGrades):
            return steps[i:]
    raise GradingError("the configuration's Autograde.autograde_preprocessors has no SaveAutoGrades: nothing "
                       "would record the grades")


def book(config, assignment: str, graded: Graded, digest: str, steps: list) -> list[str]:
    """Record one graded submission in the course's gradebook and autograded/ folder with nbgrader's autograde (see
    the module's docstring). -> its log lines. Raises when nbgrader could not book it."""
    from nbgrader.converters import Autograde
    from nbgrader.coursedir import CourseDirectory

    from ttlib.grading.worker import captured_log

    coursedir = CourseDirectory(config=config)
    coursedir.assignment_id, coursedir.student_id = assignment, graded.student
    app = Autograde(coursedir=coursedir, config=config)
    app.force = True
    app.sanitize_preprocessors = [Replay(graded.notebooks, digest)]
    app.autograde_preprocessors = steps
    with captured_log(app.log) as lines:
        try:
            app.start()
        except Exception as e:
            raise RuntimeError(f"nbgrader could not book it: {e}; its log:\n" + "\n".join(lines[-20:])) from e
    return lines


def scores(coursedir, assignment: str, student: str) -> tuple[float, float]:
    from nbgrader.api import Gradebook

    with Gradebook(coursedir.db_url, coursedir.course_id) as gb:
        submission = gb.find_submission(assignment, student)
        return submission.score, submission.max_score


# ---- the run: plan, grade, book, say -------------------------------------------------------------------------------
def with_options(config, options=()):
    """The course's configuration with nbgrader-style `--Class.trait=value` options on top."""
    import copy

    from traitlets.config import Config
    from traitlets.config.loader import KVArgParseConfigLoader

    merged = Config(copy.deepcopy(config))
    if options:
        merged.merge(KVArgParseConfigLoader(list(options)).load_config())
    return merged


def _run_record(graded: Graded) -> dict:
    """The grading's own record, summed over the submission's notebooks: flags, CPU seconds, what stopped."""
    total = {"flags": [], "cpu": 0.0, "hidden_cpu": 0.0, "stopped": []}
    for text in graded.notebooks.values():
        meta = nbformat.reads(text, as_version=4).metadata.get("ttlib", {})
        run = meta.get("run", {})
        total["flags"] += meta.get("flags") or []
        total["cpu"] += run.get("cpu", 0.0)
        total["hidden_cpu"] += run.get("hidden_cpu", 0.0)
        total["stopped"] += run.get("stopped") or []
    return total


def _tampering(files: dict[str, bytes], release: dict[str, bytes]) -> list[str]:
    from ttlib.grading.assignments import tampering

    found = []
    for name, data in files.items():
        if name.endswith(".ipynb") and name in release:
            try:
                found += tampering(nbformat.reads(data.decode("utf-8"), as_version=4),
                                   nbformat.reads(release[name].decode("utf-8"), as_version=4))
            except Exception:  # noqa: BLE001 (not a notebook: nbgrader says so in its log)
                found.append(f"{name} is not a readable notebook")
    return found


def _line(student: str, points: tuple[float, float], record: dict, flags: int, graded: Graded) -> str:
    """One line a submission: student, points, flags, CPU seconds, seconds on the clock, what stopped it."""
    stopped = f"; stopped: {'; '.join(record['stopped'])}" if record["stopped"] else ""
    return (f"{student:24s} {points[0]:g}/{points[1]:g} points  {flags} flag{'s' * (flags != 1)}  "
            f"{record['cpu']:.1f} + {record['hidden_cpu']:.1f} CPU s (kernel + hidden tests), {graded.seconds:.0f} s"
            f"{stopped}")


def autograde(course, assignments: list[str], jobs: int | None = None, ray: str | None = None, force: bool = False,
              options=(), out=None) -> Report:
    """Grade every new or changed submission of `assignments` (all of them with `force`), `jobs` at a time on this
    machine (default: what it holds, `default_jobs`) or on the Ray cluster at `ray`; book each in the gradebook as
    it comes back. Prints a progress bar and one line a submission (to `out`); the whole log goes to
    autograde_<assignment>.log in the course folder."""
    from nbgrader.coursedir import CourseDirectory
    from tqdm.auto import tqdm

    from ttlib.grading.assignments import GradingError
    from ttlib.grading.assignments import assignments as graded_notebooks
    from ttlib.grading.execute import memory_limit

    known = graded_notebooks(course)
    for assignment in assignments:
        if assignment not in known:
            raise GradingError(f"unknown assignment {assignment!r}; the graded notebooks are: {', '.join(known)}")
    config = with_options(course.config, options)
    coursedir = CourseDirectory(config=config)
    steps, report, todo = booking_steps(config), Report(), []
    for assignment in dict.fromkeys(assignments):
        grade, current = plan(coursedir, shared_settings(coursedir, config, assignment), force)
        todo += grade
        report.up_to_date += [(assignment, student) for student in current]
        report.logs.append(Path(coursedir.root) / f"autograde_{assignment}.log")
    memory = memory_limit(config)
    if ray:
        report.jobs, report.where = jobs or 0, f"the Ray cluster at {ray}"
        results = on_ray(todo, ray, memory, jobs)
    else:
        report.jobs = max(1, min(jobs or default_jobs(memory), len(todo) or 1))
        results = on_this_machine(todo, report.jobs)
    start, several = time.monotonic(), len(report.logs) > 1
    logs = {path.name.removeprefix("autograde_").removesuffix(".log"): open(path, "a", encoding="utf-8")  # noqa: SIM115
            for path in report.logs}
    try:
        for log in logs.values():
            log.write(f"==== {time.strftime('%Y-%m-%d %H:%M:%S')} grading on {report.where}\n")
        with tqdm(total=len(todo), desc="grading", unit="submission", file=sys.stderr) as bar:
            for submission, graded in results:
                line = _finish(coursedir, config, submission, graded, steps, report, logs[submission.assignment])
                bar.write(f"{submission.assignment} {line}" if several else line, file=out or sys.stdout)
                bar.update()
    finally:
        for log in logs.values():
            log.close()
    report.seconds = time.monotonic() - start
    return report


def _finish(coursedir, config, submission: Submission, graded, steps, report: Report, log) -> str:
    """Book one result; -> the line that says how it went (its warnings below it)."""
    student, assignment = submission.student, submission.assignment
    key = (assignment, student)
    if isinstance(graded, Exception):
        report.failed[key] = f"{type(graded).__name__}: {str(graded).splitlines()[0] if str(graded) else ''}"
        log.write(f"---- {student}: FAILED: {graded}\n")
        return f"{student:24s} FAILED: {report.failed[key]}"
    log.write(f"---- {student} (graded on {graded.host} in {graded.seconds:.1f} s)\n" + "\n".join(graded.log) + "\n")
    warnings = [f"    {line}" for line in graded.log if line.startswith(("[WARNING]", "[ERROR]", "[CRITICAL]"))]
    if graded.error:
        report.failed[key] = graded.error
        return "\n".join([f"{student:24s} FAILED: nbgrader could not grade it ({graded.error})", *warnings])
    try:
        log.write("\n".join(book(config, assignment, graded, submission.digest, steps)) + "\n")
    except Exception as e:  # noqa: BLE001 (reported: this submission is not booked, the others go on)
        report.failed[key] = str(e).splitlines()[0]
        log.write(f"{e}\n")
        return "\n".join([f"{student:24s} FAILED: {report.failed[key]}", *warnings])
    report.graded.append(key)
    record = _run_record(graded)
    flags = len(record["flags"]) + len(_tampering(submission.files, submission.shared.release))
    return "\n".join([_line(student, scores(coursedir, assignment, student), record, flags, graded), *warnings])
