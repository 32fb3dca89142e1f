"""The one base of ttlib's own errors: a mistake in what the user gave, said in one line that says how to fix it.

`ttlib` commands print a TTLibError as that line and exit with status 2. Anything else that escapes is a bug in
ttlib (or in a library under it) and keeps its traceback, so that it can be reported and found. So a check of
what the user gave (an option, a dataset, a checkpoint, an observation) raises a TTLibError, and a check of what
ttlib itself must hold true (an invariant) raises a plain built-in error.

A subclass also derives from the built-in error that describes it best (ValueError for a bad value, RuntimeError
for a state that cannot go on), so `except ValueError` keeps working around ttlib's calls. A room has its own
where that says more (DatasetError, CheckpointError, TrainingError, CriticError, ...); the three below are the
kinds of mistake every room meets.
"""

from __future__ import annotations

__all__ = ["ConfigError", "MismatchError", "TTLibError", "UnavailableError"]


class TTLibError(Exception):
    """A mistake in ttlib's input (a dataset, a checkpoint, an option, an observation): its message says what to do."""


class ConfigError(TTLibError, ValueError):
    """A setting that cannot work: a config's field out of its range, or an option (a function's or the command
    line's) that is unknown, missing, or at odds with another."""


class MismatchError(TTLibError, ValueError):
    """Things given together that do not fit each other: a tokenizer and a model, a checkpoint and an environment,
    an input longer than the model's window or of another shape than it takes."""


class UnavailableError(TTLibError, RuntimeError):
    """What was asked needs something this machine lacks: a package (Triton, nbgrader, an environment's), a device,
    or the course's own files."""
