"""Checks for the course notebooks' exercises: compare your answer with the expected one and say what is wrong.

Every exercise in the notebooks is followed by a test cell that calls one of these helpers. When your answer is
right they return quietly; when it is wrong they raise an AssertionError whose message is written for you, the
learner: which shapes differ, how far off the values are and where, a few expected-vs-got values. (A graded
exercise's own check, ttlib.exercises, runs your answer on random trials against ttlib's while the reference it
rebuilds refuses to run, and names the mistake it recognises; it reports with these messages.)

    check_close(got, expected, "attention output", atol=1e-5)    # floats, up to a tolerance
    check_equal_arrays(got, expected, "bins")                    # exactly equal (integers, booleans)
    check_shape(got, (2, 4, 9, 8), "q")                          # None in the shape matches any size
    call(my_fn, x)                                               # my_fn(x); unsolved, it says so
    check_own_code(my_fn, "your attention")                      # written in this notebook, not imported

They accept numpy arrays, torch tensors (on any device), Python numbers and lists, and tuples of those. A
function that still raises NotImplementedError gets "not implemented yet: fill in the cell above".
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["call", "check_close", "check_equal_arrays", "check_own_code", "check_shape", "to_numpy"]

_SHOW = 3  # how many mismatching entries a message lists


def _is_tensor(x) -> bool:
    return type(x).__module__.startswith("torch") and hasattr(x, "detach")


def to_numpy(x, name: str) -> np.ndarray:
    """numpy view of an answer; None and other non-arrays get a message instead of a numpy error."""
    __tracebackhide__ = True  # tracebacks (IPython, pytest) skip this frame: your mistake shows first
    if x is None:
        raise AssertionError(f"{name} is None: did your function forget to `return` its result?")
    if _is_tensor(x):
        return x.detach().cpu().numpy()
    try:
        array = np.asarray(x)
    except Exception as error:  # ragged lists and the like
        raise AssertionError(f"{name} could not be read as an array ({type(x).__name__}): {error}") from None
    if array.dtype == object:
        raise AssertionError(f"{name} is a {type(x).__name__} that is not a plain array of numbers")
    return array


def _fmt(value) -> str:
    if isinstance(value, (bool, np.bool_)):
        return str(bool(value))
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    return f"{float(value):.6g}"


def _fmt_pair(expected, got) -> tuple[str, str]:
    """Both values, with as many digits as it takes to tell them apart (3 vs 3.000001, not 3 vs 3)."""
    e, g = _fmt(expected), _fmt(got)
    for digits in (10, 17):
        if e != g:
            break
        e, g = f"{float(expected):.{digits}g}", f"{float(got):.{digits}g}"
    return e, g


def _index(flat: int, shape: tuple) -> tuple:
    return tuple(int(i) for i in np.unravel_index(flat, shape)) if shape else ()


def _fmt_shape(shape: tuple) -> str:
    """(2, None, 4) -> "(2, any, 4)": None in an expected shape matches any size."""
    return "(" + ", ".join("any" if s is None else str(s) for s in shape) + ("," if len(shape) == 1 else "") + ")"


def _shape_message(name: str, got: tuple, expected: tuple) -> str:
    message = f"{name} has shape {_fmt_shape(got)} but should have shape {_fmt_shape(expected)}."
    if None not in expected and int(np.prod(got)) == int(np.prod(expected)) > 0:
        message += " Same number of entries, so a reshape, transpose or view is probably missing or wrong."
    elif len(got) != len(expected):
        message += f" It has {len(got)} axes instead of {len(expected)}: an axis is missing or extra."
    return message


def _pair(got, expected, name: str):
    """(got, expected) as numpy arrays of the same shape, or an AssertionError that says why not."""
    __tracebackhide__ = True  # tracebacks (IPython, pytest) skip this frame: your mistake shows first
    g, e = to_numpy(got, name), to_numpy(expected, f"the expected {name}")
    if g.shape != e.shape:
        raise AssertionError(_shape_message(name, g.shape, e.shape))
    return g, e


def _mismatch_message(name: str, bad: np.ndarray, g: np.ndarray, e: np.ndarray, what: str) -> str:
    flat = np.flatnonzero(bad)
    examples = "; ".join("at {} expected {}, got {}".format(_index(i, g.shape), *_fmt_pair(e.flat[i], g.flat[i]))
                         for i in flat[:_SHOW])
    return f"{name}: {len(flat)} of {g.size} entries {what}. First: {examples}."


def _split_tuple(got, expected, name: str, check: Callable, **kwargs) -> bool:
    """Compare a tuple of results part by part. Returns False when `expected` is not a tuple (lists are arrays)."""
    __tracebackhide__ = True  # tracebacks (IPython, pytest) skip this frame: your mistake shows first
    if not isinstance(expected, tuple):
        return False
    if not isinstance(got, (tuple, list)):
        raise AssertionError(f"{name} should be a tuple of {len(expected)} results, got a {type(got).__name__}")
    if len(got) != len(expected):
        raise AssertionError(f"{name} should have {len(expected)} parts, got {len(got)}")
    for part, g, e in zip(_part_names(name, len(expected)), got, expected, strict=True):
        check(g, e, part, **kwargs)
    return True


def _part_names(name: str, n: int) -> list[str]:
    """Names of a tuple's parts: "(keys, k_buf) after your call" -> "keys after your call", "k_buf after your
    call" when the name lists n parts in parentheses; otherwise "name[0]", "name[1]", ..."""
    listed = re.fullmatch(r"\(([^()]+)\)(.*)", name, re.S)
    parts = [part.strip() for part in listed.group(1).split(",")] if listed else []
    if len(parts) == n and all(parts):
        return [part + listed.group(2) for part in parts]
    return [f"{name}[{i}]" for i in range(n)]


def check_close(got, expected, name: str = "result", atol: float = 1e-5, rtol: float = 0.0) -> None:
    """Assert |got - expected| <= atol + rtol * |expected| everywhere (NaN only where expected is NaN).

    On failure the message gives both shapes (if they differ), or how many entries are off, the largest absolute
    difference and where it is, and a few expected-vs-got values.
    """
    __tracebackhide__ = True  # tracebacks (IPython, pytest) skip this frame: your mistake shows first
    if _split_tuple(got, expected, name, check_close, atol=atol, rtol=rtol):
        return
    g, e = _pair(got, expected, name)
    g, e = g.astype(np.float64), e.astype(np.float64)
    with np.errstate(invalid="ignore"):
        diff = np.abs(g - e)
        ok = (diff <= atol + rtol * np.abs(e)) | (np.isnan(g) & np.isnan(e)) | (g == e)  # g == e: same infinities
    if ok.all():
        return
    bad = ~ok
    tolerance = f"atol={atol:g}" + (f" + rtol={rtol:g} * |expected|" if rtol else "")
    message = _mismatch_message(name, bad, g, e, f"differ by more than {tolerance}")
    finite = np.where(bad & np.isfinite(diff), diff, -1.0)
    if finite.max() >= 0:
        worst = int(finite.argmax())
        e_worst, g_worst = _fmt_pair(e.flat[worst], g.flat[worst])
        message += (f" Largest absolute difference: {finite.flat[worst]:.3g} at {_index(worst, g.shape)} "
                    f"(expected {e_worst}, got {g_worst}).")
    if np.isnan(g).any() and not np.isnan(e).any():
        message += (f" Your {name} contains NaN, which usually comes from 0/0, inf - inf, or a softmax over a row "
                    "whose entries are all -inf (every key masked).")
    raise AssertionError(message)


def check_equal_arrays(got, expected, name: str = "result") -> None:
    """Assert got == expected exactly, entry by entry (for integers such as bins and booleans such as masks)."""
    __tracebackhide__ = True  # tracebacks (IPython, pytest) skip this frame: your mistake shows first
    if _split_tuple(got, expected, name, check_equal_arrays):
        return
    g, e = _pair(got, expected, name)
    bad = g != e
    if bad.any():
        raise AssertionError(_mismatch_message(name, bad, g, e, "differ"))


def check_shape(got, shape, name: str = "result") -> None:
    """Assert got.shape matches `shape`; an entry None in `shape` matches any size on that axis."""
    __tracebackhide__ = True  # tracebacks (IPython, pytest) skip this frame: your mistake shows first
    actual = tuple(got.shape) if hasattr(got, "shape") else to_numpy(got, name).shape
    shape = tuple(shape)
    if len(actual) != len(shape):
        raise AssertionError(_shape_message(name, actual, shape))
    if any(s is not None and s != a for s, a in zip(shape, actual, strict=True)):
        raise AssertionError(f"{name} has shape {_fmt_shape(actual)} but should have shape {_fmt_shape(shape)}.")


def call(fn: Callable, *args, **kwargs) -> Any:
    """fn(*args, **kwargs), turning NotImplementedError (an unsolved exercise) into a friendly AssertionError."""
    __tracebackhide__ = True  # tracebacks (IPython, pytest) skip this frame: your mistake shows first
    try:
        return fn(*args, **kwargs)
    except NotImplementedError as error:
        tb = error.__traceback__
        while tb.tb_next is not None:  # the function that raised it, not a wrapper around it
            tb = tb.tb_next
        code = tb.tb_frame.f_code
        name = getattr(code, "co_qualname", code.co_name).split("<locals>.")[-1]  # MLP.forward (Python 3.11+)
        name = name if name.replace(".", "_").isidentifier() else getattr(fn, "__name__", "this function")
        raise AssertionError(f"{name} is not implemented yet: fill in the cell above (replace the "
                             "`raise NotImplementedError()`) and run it, then run this cell again.") from None


# ---- your own code, not the reference's ------------------------------------------------------------------------
def check_own_code(obj, name: str = "your function") -> None:
    """`obj` (a function or class) was written in the notebook, not imported from a module."""
    __tracebackhide__ = True  # tracebacks (IPython, pytest) skip this frame: your mistake shows first
    module = getattr(obj, "__module__", None)
    if module != "__main__":
        raise AssertionError(f"{name} comes from the module `{module}`, not from this notebook: the exercise asks "
                             "you to write it here, in the cell above.")


