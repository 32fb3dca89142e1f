"""One submission graded in a course folder of its own: what a job of `ttlib grade autograde` runs, in a process of
this machine's pool or in a task on a worker of a Ray cluster.

The grading is nbgrader's own `autograde`, unchanged, with the course's configuration and plugins (BoundedExecute,
its sandbox, the hidden tests). It runs in a temporary course folder that holds only what it needs: the release, the
assignment's other source files, the one submission, and a gradebook with the assignment's cells and no student
(`template_gradebook`, made once a run from the course's gradebook). It sends back the graded notebooks and its log;
it writes nothing where the instructor's files are. ttlib.grading.batch books the results, in one process.

    shared = Shared(assignment, release, source, gradebook, config, env, protected)   the same for every submission
    graded = grade_one(shared, student, files)    files: {path in submitted/<student>/<assignment>/: bytes}
"""

from __future__ import annotations

import contextlib
import copy
import logging
import os
import re
import socket
import sqlite3
import tempfile
import threading
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["CARRIED_ENV", "Graded", "Shared", "captured_log", "carried_env", "grade_one", "skip_unused_imports",
           "template_gradebook", "worker_started"]


# nbgrader's own SQLAlchemy warning each time it makes a submission in a fresh gradebook (as every worker's is)
warnings.filterwarnings("ignore", message=".*not in session, add operation along.*")
# the settings of a run that travel with it (the limits' overrides, fast mode, a sandbox guarantee turned off)
CARRIED_ENV = re.compile(r"^TTLIB_(GRADE_\w+|FAST|SANDBOX_DISABLE)$")


@dataclass
class Shared:
    """What every submission of one run needs (with Ray, one copy in the object store)."""
    assignment: str
    release: dict[str, bytes]  # release/<assignment>/: the student version(s)
    source: dict[str, bytes]  # source/<assignment>/'s other files (nbgrader copies them beside a graded notebook)
    gradebook: bytes  # template_gradebook(): the assignment's cells, no student
    config: dict  # the course's nbgrader configuration, with the command line's overrides
    env: dict[str, str] = field(default_factory=dict)  # the run's TTLIB_GRADE_* settings, and the like
    protected: list[str] = field(default_factory=list)  # the instructor's folders a sandbox must not reach


@dataclass
class Graded:
    """What comes back from grading one submission."""
    student: str
    notebooks: dict[str, str]  # {name.ipynb: the autograded notebook, as JSON text}; empty when it failed
    log: list[str]  # nbgrader's log of this submission, one line a record
    error: str | None  # why nbgrader could not grade it (nothing is booked then)
    seconds: float  # on the clock, in the worker
    host: str  # where it was graded: host name and process id


def carried_env(environ=os.environ) -> dict[str, str]:
    return {k: v for k, v in environ.items() if CARRIED_ENV.match(k)}


def template_gradebook(path: str | Path) -> bytes:
    """The gradebook at `path` (sqlite) without any student: its assignments, notebooks and cells only, as bytes.
    Every table that holds a student's row (students, submissions, grades, comments, and whatever refers to them)
    is emptied in a copy, so no student's grade travels to a worker."""
    with tempfile.TemporaryDirectory(prefix="ttgradebook-") as tmp:
        copy_path = Path(tmp) / "gradebook.db"
        source = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        target = sqlite3.connect(copy_path)
        try:
            source.backup(target)  # a consistent copy, even while nbgrader writes
            for table in _student_tables(target):
                target.execute(f'DELETE FROM "{table}"')
            target.commit()
            target.execute("VACUUM")  # the deleted rows leave the file too
        finally:
            source.close()
            target.close()
        return copy_path.read_bytes()


def _student_tables(db: sqlite3.Connection) -> list[str]:
    """The table `student` and every table with a foreign key, direct or not, to one of these."""
    tables = [row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
    refers = {t: {row[2] for row in db.execute(f'PRAGMA foreign_key_list("{t}")')} for t in tables}
    found = {"student"} & set(tables)
    while True:
        more = {t for t in tables if refers[t] & found} - found
        if not more:
            return sorted(found)
        found |= more


def worker_started() -> None:
    """A pool process of `ttlib grade autograde` starts (forked from the pool's fork server, which has imported
    ttlib.grading.pool_preload; or started afresh, with only this module and ttlib's command line imported): it ends
    with its parent -- the fork server, which ends with the grading process, or the grading process itself -- and
    its sandboxes end with it in turn; it skips unused imports, and forks its hidden tests' zygote now, while it has
    one thread, sharing the libraries both import."""
    import signal

    from ttlib.grading.linux import LINUX, PR_SET_PDEATHSIG, capabilities, prctl

    skip_unused_imports()
    if LINUX:
        prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if capabilities().sandboxed:
        from ttlib.grading.zygote import fork_here

        fork_here()


def skip_unused_imports() -> None:
    """Call before nbgrader is imported. jsonschema (imported by nbformat) imports rfc3987_syntax, where installed,
    only to check the "iri" string format, which nbformat and nbgrader never ask for -- and that module builds a
    grammar at import: 2 CPU s in every grading process. Marked absent, it is skipped; nothing else changes."""
    import sys

    sys.modules.setdefault("rfc3987_syntax", None)


def grade_one(shared: Shared, student: str, files: dict[str, bytes], crash: tuple[float, str] | None = None
              ) -> Graded:
    """Grade one student's submission with nbgrader's autograde in a course folder of its own.

    `crash` = (seconds, marker file): a test's way to lose this worker mid-grading -- unless the marker exists, it
    is made and the process exits abruptly after `seconds`."""
    skip_unused_imports()
    from nbgrader.converters import Autograde
    from nbgrader.coursedir import CourseDirectory
    from traitlets.config import Config

    start = time.monotonic()
    if crash is not None and not os.path.exists(crash[1]):
        Path(crash[1]).touch()
        threading.Timer(crash[0], os._exit, (70,)).start()
    assignment = shared.assignment
    with tempfile.TemporaryDirectory(prefix="ttgrade-") as tmp, _settings(shared.env):
        root = Path(tmp)
        _write(root / "release" / assignment, shared.release)
        _write(root / "source" / assignment, shared.source)
        _write(root / "submitted" / student / assignment, files)
        (root / "gradebook.db").write_bytes(shared.gradebook)
        config = Config(copy.deepcopy(shared.config))
        config.CourseDirectory.root = str(root)
        config.CourseDirectory.db_url = f"sqlite:///{root / 'gradebook.db'}"
        config.BoundedExecute.protected_paths = list(shared.protected)
        coursedir = CourseDirectory(config=config)
        coursedir.assignment_id, coursedir.student_id = assignment, student
        app = Autograde(coursedir=coursedir, config=config)
        app.force = True
        error = None
        with captured_log(app.log) as log:
            try:
                app.start()
            except Exception as e:  # nbgrader logged what went wrong; its message says where to look
                error = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        graded = Path(coursedir.format_path(coursedir.autograded_directory, student, assignment))
        notebooks = {} if error else {p.name: p.read_text(encoding="utf-8") for p in sorted(graded.glob("*.ipynb"))}
    return Graded(student, notebooks, log, error, time.monotonic() - start, f"{socket.gethostname()}:{os.getpid()}")


def _write(folder: Path, files: dict[str, bytes]) -> None:
    for relative, data in files.items():
        path = (folder / relative).resolve()
        if not path.is_relative_to(folder.resolve()):
            raise ValueError(f"{relative!r} is not a path inside {folder.name}/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


@contextlib.contextmanager
def _settings(env: dict[str, str]):
    """The run's settings in this process's environment while it grades (a Ray worker grades many runs')."""
    before = dict(os.environ)
    try:
        for k in carried_env():  # a setting of an earlier run, or of this process
            del os.environ[k]
        os.environ.update(env)
        yield
    finally:
        os.environ.clear()
        os.environ.update(before)


@contextlib.contextmanager
def captured_log(logger: logging.Logger):
    """The records `logger` (and nbgrader's steps, which log through it) emits meanwhile, as lines."""
    lines: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record):
            lines.append(f"[{record.levelname}] {self.format(record)}")

    handler = Collect(logging.INFO)
    level, propagate = logger.level, logger.propagate
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    try:
        yield lines
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        logger.propagate = propagate
