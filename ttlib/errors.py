"""The one base of ttlib's own errors: a mistake in what the user gave, said in one line that says how to fix it.

`ttlib` commands print a TTLibError as that line and exit with status 2. Anything else that escapes is a bug in
ttlib (or in a library under it) and keeps its traceback, so that it can be reported and found.

A subclass also derives from the built-in error that describes it best (ValueError for a bad value, RuntimeError
for a state that cannot go on), so `except ValueError` keeps working around ttlib's calls.
"""

from __future__ import annotations

__all__ = ["TTLibError"]


class TTLibError(Exception):
    """A mistake in ttlib's input (a dataset, a checkpoint, an option, an observation): its message says what to do."""
