"""The course's exercises: how each one is checked, the mistakes it knows by name, and how it is graded.

One module per notebook (`attention` for notebook 01, ...) holds its exercises (notebook 03's `gpt` lists
`gpt_training`'s too). An `Exercise` knows

- which names of your notebook make up your answer (`names`), and which earlier pieces it lends you from ttlib
  while it checks this one (`lends`): a mistake in an earlier exercise never costs this one;
- how to make a trial from a random generator (`trial`), and how to run an answer on it (`run`): the named
  outputs it compares, in the order a computation produces them, so "where it first differs" means something;
- ttlib's answer (`reference`) and the wrong answers it knows (`mistakes`), each with one sentence that teaches.

`exercise.check(globals())` (the visible test cell) runs your answer and ttlib's on a few trials. When they differ
it runs the known mistakes on the same trial and names the one you made, or else says where your answer first
differs; either way the message comes first and no checker frames follow it (`ExerciseFailed`).

Grading never trusts the notebook's own process: `ttlib.exercises.hidden` runs your answers on fresh random seeds
in a separate, sandboxed process that holds only your notebook's definitions, and the grader compares what they
returned with ttlib's answer in its own process (`judge`). `exercise.check_hidden(globals())` (the hidden test
cell) does the same inside the notebook when it is run outside grading.
"""

from __future__ import annotations

import base64
import contextlib
import io
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ttlib.course.checks import check_close, check_equal_arrays, to_numpy
from ttlib.exercises.refuse import Refused, guard

__all__ = ["Exercise", "ExerciseFailed", "GRADING_ENV", "MODULES", "Mistake", "Pieces", "Trial", "all_exercises",
           "compare", "decode", "encode", "find", "hidden_seeds"]

GRADING_ENV = "TTLIB_GRADING"  # set in a kernel that nbgrader grades: the hidden tests run outside it
MODULES = ("values", "attention", "tokenizer", "gpt", "kv_cache", "beam_search", "critic", "rollouts", "ray", "dt")


class ExerciseFailed(AssertionError):
    """A check that failed. IPython shows only its message (no traceback): what is wrong comes first."""

    def _render_traceback_(self) -> list[str]:
        lines = str(self).splitlines() or [""]
        return ["\x1b[1;31m" + lines[0] + "\x1b[0m", *lines[1:]]


@dataclass(frozen=True)
class Mistake:
    says: str  # one sentence that teaches: what this answer got wrong, and what the right one does
    answer: Mapping[str, Any]  # the wrong pieces, by the names of the exercise's answer (the rest: ttlib's)


class Pieces:
    """An answer: names -> functions or classes (a notebook's globals, ttlib's pieces, a mistake's)."""

    def __init__(self, mapping: Mapping[str, Any], whose: str):
        self._mapping, self.whose = mapping, whose

    def __getattr__(self, name: str):
        try:
            return self._mapping[name]
        except KeyError:
            raise AssertionError(f"{name} is not defined: run the exercise's cell above first") from None


@dataclass
class Trial:
    """One trial's outcome: the outputs by name, or what went wrong before there were any."""

    outputs: dict[str, np.ndarray] | None = None
    error: str | None = None  # "your Block raised ValueError: ..." / "your code called ...: ... refuses to run"
    line: str = ""  # the line of the learner's code that raised `error`, for the message (never compared)


@dataclass
class Exercise:
    id: str  # nbgrader's grade_id of the exercise's solution cell, e.g. "01-sdpa"
    number: int | str  # "Exercise 2" ("4a": a graded stage of exercise 4)
    what: str  # what the learner wrote, for messages: "your attention"
    names: tuple[str, ...]  # the notebook's names that are the answer (functions or classes)
    trial: Callable[[np.random.Generator], Any]  # a random trial: inputs for `run`
    run: Callable[[Pieces, Any], dict]  # run(answer, trial) -> {output name: value}, in computation order
    reference: Mapping[str, Any]  # ttlib's answer under the same names
    mistakes: list[Mistake] = field(default_factory=list)
    lends: Mapping[str, Any] = field(default_factory=dict)  # earlier exercises' names -> ttlib's, while checking
    forbid: tuple = ()  # what the answer must not call: the references it rebuilds
    atol: float = 1e-5  # float outputs: |got - expected| <= atol + rtol * |expected|
    rtol: float = 0.0
    trials: int = 5  # visible trials (seeds 0 ..); the hidden ones use other seeds
    hidden_trials: int = 8
    passed: str = ""  # printed when the check passes
    cell: str = ""  # the grade_id of the solution cell it checks, when that is not `id` (a graded stage of another)

    # ---- running an answer ------------------------------------------------------------------------------------
    def outcome(self, answer: Pieces, trial, *, learner: bool = False, strict: bool = False,
                report: Callable[[str], None] | None = None) -> Trial:
        """Run `answer` on `trial`. A learner's answer runs guarded (the references it rebuilds refuse to run);
        ttlib's runs as it is, and raises if it fails. A learner's or a mistake's exceptions become messages."""
        trial = _copy(trial)  # an answer that writes into its inputs cannot change the next answer's
        if answer.whose == "ttlib":
            return Trial(outputs=_arrays(self.run(answer, trial)))
        try:
            with guard(*(self.forbid if learner else ()), strict=strict and learner, report=report) as watch:
                outputs = self.run(answer, trial)
        except Refused as refusal:
            return Trial(error=str(refusal))
        except NotImplementedError:
            return Trial(error=f"{self.what} is not implemented yet: fill in the cell above (replace the "
                               "`raise NotImplementedError()`) and run it, then run this cell again.")
        except AssertionError as error:  # a message written for the learner (e.g. "is not defined")
            return Trial(error=str(error))
        except Exception as error:  # noqa: BLE001 (anything the answer raises is reported, not re-raised)
            return Trial(error=f"{self.what} raised {type(error).__name__}: {_first_line(error)}",
                         line=_learners_line(error) if learner else "")
        if watch.refused:  # refused, and the refusal caught by the answer itself: it still does not count
            return Trial(error=watch.message())
        try:
            return Trial(outputs=_arrays(outputs))
        except AssertionError as error:
            return Trial(error=str(error))

    @contextlib.contextmanager
    def lending(self, namespace: dict):
        """The earlier exercises' names in `namespace` replaced by ttlib's while this one is checked."""
        saved = {name: namespace[name] for name in self.lends if name in namespace}
        namespace.update(self.lends)
        try:
            yield
        finally:
            for name in self.lends:
                namespace.pop(name, None)
            namespace.update(saved)

    def learner(self, namespace: dict) -> Pieces:
        return Pieces(namespace, "yours")

    # ---- judging ----------------------------------------------------------------------------------------------
    def judge(self, trial, got: Trial, where: str = "") -> str | None:
        """None if `got` is ttlib's answer on `trial`; otherwise the message a learner reads: the known mistake it
        matches, if one does, then where it first differs from ttlib's answer, expected vs got."""
        expected = self.outcome(Pieces(self.reference, "ttlib"), trial)
        if got.error is not None:
            at = f" (at the line `{got.line}`)" if got.line else ""
            return self._message(self.diagnose(trial, got, expected), got.error + at, where)
        difference = self.difference(got.outputs, expected.outputs)
        if difference is None:
            return None
        return self._message(self.diagnose(trial, got, expected), difference, where)

    def difference(self, got: dict, expected: dict) -> str | None:
        """Where `got` first differs from `expected` (output by output, in order), or None."""
        for name, want in expected.items():
            if name not in got:
                return f"{name}: missing from your answer's outputs"
            try:
                compare(got[name], want, name, self.atol, self.rtol)
            except AssertionError as error:
                return str(error)
        return None

    def diagnose(self, trial, got: Trial, expected: Trial) -> str | None:
        """The sentence of the first known mistake that gives what `got` gives on `trial` (and not ttlib's answer):
        the same outputs, or the same error."""
        for mistake in self.mistakes:
            wrong = self.outcome(Pieces({**self.reference, **mistake.answer}, "mistake"), trial)
            if got.error is not None:
                if wrong.error == got.error:
                    return mistake.says
            elif wrong.outputs is not None and self.difference(wrong.outputs, expected.outputs) is not None \
                    and self.difference(got.outputs, wrong.outputs) is None:
                return mistake.says
        return None

    def _message(self, diagnosis: str | None, detail: str, where: str) -> str:
        head = f"Exercise {self.number} is not right yet: " + (diagnosis or _headline(detail))
        lines = [head]
        if diagnosis:
            lines.append(f"  {detail}")
        if where:
            lines.append(f"  ({where})")
        return "\n".join(lines)

    # ---- the test cells -------------------------------------------------------------------------------------------
    def check(self, namespace: dict) -> None:
        """The visible test: your answer against ttlib's on `trials` random trials (seeds 0, 1, ...)."""
        __tracebackhide__ = True
        self._own_code(namespace)
        with self.lending(namespace):
            for seed in range(self.trials):
                trial = self.make_trial(seed)
                got = self.outcome(self.learner(namespace), trial, learner=True)
                message = self.judge(trial, got, where=f"trial {seed + 1} of {self.trials}")
                if message is not None:
                    raise ExerciseFailed(message)
        if self.passed:
            print(f"Exercise {self.number} passed: {self.passed}")

    def check_hidden(self, namespace: dict) -> None:
        """The graders' tests, run here (outside grading): more trials, other seeds, the strict guard. When nbgrader
        grades the notebook they run in a separate process instead (ttlib.exercises.hidden), and this does nothing."""
        __tracebackhide__ = True
        if os.environ.get(GRADING_ENV):
            return
        self._own_code(namespace)
        with self.lending(namespace):
            for seed in hidden_seeds(self.hidden_trials):
                trial = self.make_trial(seed)
                got = self.outcome(self.learner(namespace), trial, learner=True, strict=True)
                message = self.judge(trial, got, where=f"hidden trial, seed {seed}")
                if message is not None:
                    raise ExerciseFailed(message)

    def make_trial(self, seed: int):
        """The trial of `seed`: the same in every process (numpy and torch seeded with it)."""
        import torch

        torch.manual_seed(seed)
        return self.trial(np.random.default_rng(seed))

    def _own_code(self, namespace: dict) -> None:
        __tracebackhide__ = True
        for name in self.names:
            if name not in namespace:
                raise ExerciseFailed(f"Exercise {self.number}: `{name}` is not defined -- run the exercise's cell "
                                     "above first.")
            module = getattr(namespace[name], "__module__", None)
            if module != "__main__":
                raise ExerciseFailed(f"Exercise {self.number}: your {name} comes from the module `{module}`, not "
                                     "from this notebook: the exercise asks you to write it here, in the cell above.")


# ---- outputs: plain arrays, compared the course's way ------------------------------------------------------------
def _arrays(outputs: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """{name: numpy array} of an answer's outputs (tensors on any device, numbers, booleans, strings)."""
    arrays = {}
    for name, value in outputs.items():
        if isinstance(value, str):
            arrays[name] = np.asarray(value)
        else:
            arrays[name] = np.array(to_numpy(value, name))  # a copy: later code cannot change it
    return arrays


def compare(got: np.ndarray, expected: np.ndarray, name: str, atol: float, rtol: float) -> None:
    """Exactly for integers, booleans and strings; within the tolerance for floats (ttlib.course.checks' messages)."""
    __tracebackhide__ = True
    if expected.dtype.kind in "US":
        if got.dtype.kind not in "US" or str(got) != str(expected):
            raise AssertionError(f"{name}: expected {expected}, got {got}")
    elif expected.dtype.kind in "biu":
        check_equal_arrays(got, expected, name)
    else:
        check_close(got, expected, name, atol=atol, rtol=rtol)


def _copy(trial):
    """A deep copy of a trial, or the trial itself where it cannot be copied (a live environment, an actor)."""
    import copy

    try:
        return copy.deepcopy(trial)
    except Exception:  # noqa: BLE001 (whatever cannot be copied is the trial's own: its run builds it afresh)
        return trial


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0][:300] if text else "(no message)"


def _learners_line(error: BaseException) -> str:
    """The last line of the learner's own code in the traceback of `error` (not a library's), or ""."""
    import linecache

    from ttlib.exercises.refuse import runs_learners_code

    line, tb = "", error.__traceback__
    while tb is not None:
        if runs_learners_code(tb.tb_frame):
            line = linecache.getline(tb.tb_frame.f_code.co_filename, tb.tb_lineno).strip() or line
        tb = tb.tb_next
    return line[:200]


def _headline(detail: str) -> str:
    """The first sentence of a difference, as the headline when no known mistake matches."""
    return detail.splitlines()[0]


# ---- records: what the hidden runner sends the grader ------------------------------------------------------------
def encode(trial: Trial) -> dict:
    """A JSON-able record of one trial's outcome (arrays as an .npz, base64): no pickles cross the boundary."""
    if trial.outputs is None:
        return {"error": trial.error, "line": trial.line}
    buffer = io.BytesIO()
    np.savez(buffer, **{f"o{i}": v for i, v in enumerate(trial.outputs.values())})
    return {"names": list(trial.outputs), "npz": base64.b64encode(buffer.getvalue()).decode("ascii")}


def decode(record: dict) -> Trial:
    if "error" in record:
        return Trial(error=str(record["error"])[:2000], line=str(record.get("line") or "")[:200])
    with np.load(io.BytesIO(base64.b64decode(record["npz"])), allow_pickle=False) as npz:
        return Trial(outputs={name: npz[f"o{i}"] for i, name in enumerate(record["names"])})


def hidden_seeds(n: int, start: int | None = None) -> list[int]:
    """Seeds of the hidden trials: fixed outside grading (reproducible), random when the grader chooses `start`."""
    start = 1000 if start is None else start
    return list(range(start, start + n))


# ---- the registry ------------------------------------------------------------------------------------------------
def all_exercises() -> dict[str, Exercise]:
    """{grade_id: Exercise} of every notebook's exercises."""
    import importlib

    found = {}
    for name in MODULES:
        try:
            module = importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as error:
            if error.name == f"{__name__}.{name}":  # not written yet
                continue
            raise
        for exercise in getattr(module, "EXERCISES", []):
            found[exercise.id] = exercise
    return found


def find(grade_id: str) -> Exercise | None:
    """The Exercise whose solution cell (or test cell, `<id>-test`) has this grade_id, or None."""
    return all_exercises().get(grade_id.removesuffix("-test"))
