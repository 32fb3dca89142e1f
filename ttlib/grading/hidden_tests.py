"""Autograding's hidden tests, out of the submission's kernel: what decides a graded test cell's points.

nbgrader scores a test cell by its outputs: an error means 0. The kernel that ran the notebook ran the student's
code too, so nothing it says can be trusted to decide a grade -- a submission can swallow its own errors, read or
rewrite what a check compares with, or print what nbgrader takes for partial credit. Here, after the kernel's run:

1. `run_hidden` starts `python -m ttlib.exercises.hidden` in a sandbox of its own (ttlib.grading.sandbox; its
   process forked from this grading process's zygote, ttlib.grading.zygote, which imported PyTorch and ttlib once),
   on the release's setup cells and the submission's definitions only, with trials from a seed chosen now, and reads its
   records; the exercises are judged in this process (`judge_records`), where the submission never ran. An
   exercise that loops is stopped at its CPU budget, one that sleeps at its idle seconds (`IdleClock`: the clock's
   seconds in which the runner neither ran nor waited for a CPU, so a busy machine does not count), and the runner
   starts again with the exercises after it.
2. `apply_verdicts` rewrites each graded test cell's outputs: what it printed stays (stderr too, moved to stdout, so
   a warning never costs points), results nbgrader would read as partial credit are dropped, the kernel's own error
   is replaced by the verdict -- an error output with the message the student reads, or nothing when it passed.

Test cells of exercises that have no `ttlib.exercises` entry are left to the kernel's run, as nbgrader does.
`judge` does all of it for autograde's executor, with the static scan's flags (ttlib.grading.scan).
"""

from __future__ import annotations

import json
import os
import secrets
from dataclasses import dataclass, field

import nbformat

from ttlib.exercises import find
from ttlib.exercises.hidden import judge_records

__all__ = ["HiddenRun", "IdleClock", "apply_verdicts", "hidden_exercises", "judge", "run_hidden"]


@dataclass
class HiddenRun:
    verdicts: dict[str, str | None]  # test cell grade_id -> None (passed) or the message
    seconds: float = 0.0  # on the clock, every runner start together
    cpu_seconds: float = 0.0
    notes: list[str] = field(default_factory=list)  # what happened to the runner (stopped at a limit, restarted)


def hidden_exercises(nb) -> dict[str, str]:
    """{test cell grade_id: exercise id} for the graded cells whose exercise ttlib.exercises knows."""
    found = {}
    for cell in nb.cells:
        meta = cell.get("metadata", {}).get("nbgrader", {})
        grade_id = meta.get("grade_id", "")
        if meta.get("grade") and cell.get("cell_type") == "code" and find(grade_id) is not None:
            found[grade_id] = grade_id.removesuffix("-test")
    return found


class IdleClock:
    """The watchdog's guard of one runner start: "idle" once the runner has been idle (sleeping, blocked) for
    `exercise_idle` seconds since the exercise it is on started -- or `start_idle` seconds before the first one. It
    reads the runner's records as they arrive. (An exercise counts from the first time it says it started: a
    submission that writes false records gains at most `exercise_idle` an exercise.)"""

    def __init__(self, exercises: list[str], exercise_idle: float, start_idle: float):
        self.exercises, self.exercise_idle, self.start_idle = set(exercises), exercise_idle, start_idle
        self.started: set[str] = set()
        self.since, self.allowed = 0.0, start_idle
        self._read, self._partial = 0, b""

    def __call__(self, watchdog, out: list[bytes]) -> str | None:
        if watchdog is None:
            return None
        while self._read < len(out):
            self._partial += out[self._read]
            self._read += 1
            *lines, self._partial = self._partial.split(b"\n")
            for line in lines:
                self._note(line, watchdog.idle)
        return "idle" if watchdog.idle - self.since > self.allowed else None

    def _note(self, line: bytes, idle: float) -> None:
        try:
            entry = json.loads(line)
        except ValueError:
            return
        if not isinstance(entry, dict):
            return
        exercise = entry.get("exercise")
        if entry.get("started") and exercise in self.exercises - self.started:
            self.started.add(exercise)
            self.since, self.allowed = idle, self.exercise_idle


def run_hidden(submitted, released_path: str, limits=None, protected=(), exercise_cpu: float = 120.0,
               exercise_idle: float | None = None) -> HiddenRun:
    """Run the hidden tests of `submitted` (a notebook) against the release at `released_path`: `exercise_cpu` CPU
    seconds an exercise, and `exercise_idle` idle seconds (None: no idle limit; three times that to start)."""
    from ttlib.grading import sandbox

    tests = hidden_exercises(submitted)
    remaining = list(dict.fromkeys(tests.values()))
    seed = secrets.randbelow(2**31 - 10_000)
    files = {"released.ipynb": open(released_path, "rb").read(),
             "submitted.ipynb": nbformat.writes(submitted).encode("utf-8")}
    lines: list[str] = []
    run = HiddenRun(verdicts={})
    stopped: dict[str, str | None] = {}  # exercise -> the limit its run was stopped at (None: it ended itself)
    startup_cpu = 60.0  # importing torch and ttlib, the release's setup cells, the definitions
    while remaining:
        budget = startup_cpu + exercise_cpu * len(remaining)
        box_limits = sandbox.Limits(**{**(limits.__dict__ if limits is not None else {}),
                                       "cpu_seconds": budget, "wall_seconds": 4 * budget})
        argv = [os.environ.get("TTLIB_PYTHON", _python()), "-m", "ttlib.exercises.hidden", "released.ipynb",
                "submitted.ipynb", "--exercises", ",".join(remaining), "--seed", str(seed),
                "--exercise-cpu", f"{exercise_cpu:g}"]
        clock = None if exercise_idle is None else IdleClock(remaining, exercise_idle, 3 * exercise_idle)
        result = sandbox.run(argv, box_limits, protected=protected, files=files, name="hidden", watch=clock,
                             preload=True)
        run.seconds += result.wall_seconds
        run.cpu_seconds += result.cpu_seconds
        out = result.stdout.decode("utf-8", errors="replace").splitlines()
        lines += out
        started, finished, ran_out, said = _progress(out)
        if result.stopped:
            run.notes.append(f"the hidden tests were stopped ({result.stopped}) while running "
                             f"{', '.join(started - finished) or 'the notebook definitions'}")
        unfinished = [e for e in remaining if e not in finished]
        stuck = [e for e in unfinished if e in started]
        for exercise in stuck:
            if exercise not in said:  # (one the runner judged itself, e.g. a missing function, keeps that message)
                stopped[exercise] = ran_out.get(exercise) or result.stopped
        if not stuck:  # nothing started and was left unfinished: the runner cannot make progress
            if unfinished and not result.stopped and result.returncode != 0:
                run.notes.append(f"the hidden tests' process ended with status {result.returncode}")
            break
        remaining = [e for e in unfinished if e not in stuck]  # go on after the one that did not finish
    verdicts = judge_records(lines, list(dict.fromkeys(tests.values())), seed)
    for exercise, limit in stopped.items():
        if verdicts.get(exercise) is not None:
            verdicts[exercise] = _stopped_verdict(exercise, limit, exercise_cpu, box_limits)
    run.verdicts = {grade_id: verdicts[exercise] for grade_id, exercise in tests.items()}
    return run


def _stopped_verdict(exercise_id: str, limit: str | None, exercise_cpu: float, limits) -> str:
    """What a student reads when their code stopped the hidden tests of an exercise."""
    number = find(exercise_id).number
    why = {"cpu time": f"your code ran past the {exercise_cpu:g} CPU seconds an exercise's hidden tests get (does "
                       "it loop forever?)",
           "memory": f"your code used more than the {limits.memory_bytes / 2**30:.2f} GiB of memory allowed",
           "wall time": "your code waited too long on the clock (does it sleep or wait for something?)",
           "idle": "your code waited, doing nothing, for longer than an exercise's hidden tests may (does it sleep, "
                   "or wait for something that never comes?)",
           "processes": "your code started too many processes"}.get(limit or "", "your code ended the process")
    return f"Exercise {number} is not right yet: its hidden tests were stopped: {why}, so they could not pass."


def _python() -> str:
    import sys

    return sys.executable


def _progress(lines: list[str]) -> tuple[set[str], set[str], dict[str, str], set[str]]:
    """(the exercises started, those finished, {exercise: the limit it ran out of}, those the runner reported an
    error for)."""
    started, finished, ran_out, said = set(), set(), {}, set()
    for line in lines:
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict) and isinstance(entry.get("exercise"), str):
            if entry.get("started"):
                started.add(entry["exercise"])
            if entry.get("finished"):
                finished.add(entry["exercise"])
            if isinstance(entry.get("stopped"), str):
                ran_out.setdefault(entry["exercise"], entry["stopped"])
            if "error" in entry:
                said.add(entry["exercise"])
    return started, finished, ran_out, said


def _error(ename: str, message: str) -> dict:
    lines = message.splitlines() or [""]
    return nbformat.v4.new_output("error", ename=ename, evalue=message,
                                  traceback=["\x1b[1;31m" + lines[0] + "\x1b[0m", *lines[1:]])


def apply_verdicts(nb, verdicts: dict[str, str | None]) -> None:
    """Every graded test cell's outputs: printed text kept (stderr as stdout), nothing nbgrader would read as
    partial credit, and the hidden tests' verdict in place of the kernel's error where there is one."""
    for cell in nb.cells:
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if not (meta.get("grade") and cell.get("cell_type") == "code"):
            continue
        grade_id = meta.get("grade_id")
        kept = []
        for output in cell.get("outputs", []):
            kind = output.get("output_type")
            if kind == "stream":
                kept.append(nbformat.v4.new_output("stream", name="stdout", text=output.get("text", "")))
            elif kind == "error" and grade_id not in verdicts:
                kept.append(output)  # no hidden tests for it: the kernel's run decides, as nbgrader does
            elif kind == "display_data":  # pictures and text a check showed; never a score
                kept.append(output)
            # execute_result: what nbgrader would read as partial credit -- dropped
        if grade_id in verdicts and verdicts[grade_id] is not None:
            kept.append(_error("HiddenTestFailed", verdicts[grade_id]))
        cell["outputs"] = kept


def judge(nb, released: str, limits, protected=(), exercise_cpu: float = 120.0, exercise_idle: float | None = None,
          hidden: bool = True) -> HiddenRun | None:
    """All that decides a submission's points and flags, after its kernel ran: the scan's flags (in the notebook's
    metadata, `ttlib.flags`), then the hidden tests' verdicts on its test cells. -> the hidden tests' run (None when
    there were none to run)."""
    from ttlib.grading.scan import scan_notebook

    nb.metadata.pop("ttlib", None)  # only this run's findings, never what a submission wrote there
    nb.metadata["ttlib"] = {"flags": [str(f) for f in scan_notebook(nb, nbformat.read(released, as_version=4))]}
    if not (hidden and hidden_exercises(nb)):
        return None
    run = run_hidden(nb, released, limits=limits, protected=protected, exercise_cpu=exercise_cpu,
                     exercise_idle=exercise_idle)
    apply_verdicts(nb, run.verdicts)
    return run
