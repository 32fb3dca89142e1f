"""Checks for the course notebooks' exercises: compare your answer with the expected one and say what is wrong.

Every exercise in the notebooks is followed by a test cell that calls one of these helpers. When your answer is
right they return quietly; when it is wrong they raise an AssertionError whose message is written for you, the
learner: which shapes differ, how far off the values are and where, a few expected-vs-got values, and for
`check_function` the random input on which your function first disagreed with the reference (ttlib's version).
An exercise asks you to write a piece yourself: the graders' tests run your code while the reference it rebuilds
refuses to run (`forbidding`), so handing the work to ttlib or PyTorch earns no points.

    check_close(got, expected, "attention output", atol=1e-5)    # floats, up to a tolerance
    check_equal_arrays(got, expected, "bins")                    # exactly equal (integers, booleans)
    check_shape(got, (2, 4, 9, 8), "q")                          # None in the shape matches any size
    check_function(my_fn, ttlib_fn, make_inputs, trials=5)       # both on random inputs, compared
    check_own_code(my_fn, "your attention")                      # written in this notebook, not imported
    with forbidding(ttlib_fn, F.scaled_dot_product_attention):   # calling these inside the block raises
        my_fn(...)

They accept numpy arrays, torch tensors (on any device), Python numbers and lists, and tuples of those. A
function that still raises NotImplementedError gets "not implemented yet: fill in the cell above".
"""

from __future__ import annotations

import contextlib
import copy
import re
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["check_close", "check_equal_arrays", "check_shape", "check_function", "call", "check_own_code",
           "forbidding"]

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


def _subject(name: str) -> str:
    """What a name for listed parts is about: "(keys, k_buf) of your write_kv" -> "your write_kv"."""
    listed = re.fullmatch(r"\(([^()]+)\)(.*)", name, re.S)
    rest = listed.group(2).strip() if listed else ""
    return rest[rest.find("your"):] if "your" in rest else rest or name


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


def _describe(value) -> str:
    if _is_tensor(value) or isinstance(value, np.ndarray):
        kind = "tensor" if _is_tensor(value) else "array"
        text = f"{kind} {tuple(value.shape)} {str(value.dtype).replace('torch.', '')}"
        if (value.size if isinstance(value, np.ndarray) else value.numel()) <= 8:
            text += " [" + ", ".join(_fmt(x) for x in to_numpy(value, "input").ravel()) + "]"
        return text
    if isinstance(value, (list, tuple)) and len(value) > 8:
        return f"{type(value).__name__} of {len(value)} items"
    text = " ".join(repr(value).split())  # one line, however long the repr (a module's is many)
    return text if len(text) <= 80 else text[:77] + "..."


def _describe_inputs(args, kwargs) -> str:
    parts = [_describe(a) for a in args] + [f"{k}={_describe(v)}" for k, v in kwargs.items()]
    return ", ".join(parts)


def check_function(fn: Callable, reference: Callable, make_inputs: Callable, trials: int = 5, atol: float = 1e-5,
                   rtol: float = 0.0, exact: bool = False, name: str | None = None, seed: int = 0,
                   forbid: tuple = ()) -> None:
    """Call `fn` and `reference` on `trials` random inputs and compare the results.

    make_inputs(rng) gets a numpy Generator (torch is seeded too, so it may use torch.randn) and returns the
    positional arguments as a tuple, or a dict of keyword arguments, or a pair (args tuple, kwargs dict). Each
    function gets its own copy of the inputs, so one that writes into its inputs cannot spoil the other's.
    exact=True compares with `check_equal_arrays`, otherwise `check_close(atol, rtol)`. The message names the
    trial and describes the input on which `fn` first went wrong. `fn` runs inside `forbidding(*forbid)`; the
    reference does not.
    """
    __tracebackhide__ = True  # tracebacks (IPython, pytest) skip this frame: your mistake shows first
    name = name or getattr(fn, "__name__", "your function")
    for trial in range(trials):
        rng = np.random.default_rng(seed + trial)
        try:
            import torch

            torch.manual_seed(seed + trial)
        except ImportError:  # numpy-only exercises work without torch
            pass
        inputs = make_inputs(rng)
        if isinstance(inputs, dict):
            args, kwargs = (), inputs
        elif isinstance(inputs, tuple) and len(inputs) == 2 and isinstance(inputs[1], dict) \
                and isinstance(inputs[0], tuple):
            args, kwargs = inputs
        else:
            args, kwargs = (inputs if isinstance(inputs, tuple) else (inputs,)), {}
        expected = reference(*copy.deepcopy(args), **copy.deepcopy(kwargs))
        where = f"trial {trial + 1} of {trials}, inputs: {_describe_inputs(args, kwargs)}"
        try:
            with forbidding(*forbid):
                got = call(fn, *copy.deepcopy(args), **copy.deepcopy(kwargs))
        except AssertionError:
            raise
        except Exception as error:
            raise AssertionError(f"{_subject(name)} raised {type(error).__name__}: {error}\n  ({where})") from error
        try:
            if exact:
                check_equal_arrays(got, expected, name)
            else:
                check_close(got, expected, name, atol=atol, rtol=rtol)
        except AssertionError as error:
            raise AssertionError(f"{error}\n  ({where})") from None


# ---- your own code, not the reference's ------------------------------------------------------------------------
def check_own_code(obj, name: str = "your function") -> None:
    """`obj` (a function or class) was written in the notebook, not imported from a module."""
    __tracebackhide__ = True  # tracebacks (IPython, pytest) skip this frame: your mistake shows first
    module = getattr(obj, "__module__", None)
    if module != "__main__":
        raise AssertionError(f"{name} comes from the module `{module}`, not from this notebook: the exercise asks "
                             "you to write it here, in the cell above.")


_REFUSAL = "<refused>"  # the message constant that `forbidding` replaces in a copy of _refuse's code


def _refuse(*args, **kwargs):
    __tracebackhide__ = True
    raise AssertionError("<refused>")


def _refusal(label: str):
    message = f"your code called {label}: this exercise asks you to write that yourself, so here it refuses to run."
    code = _refuse.__code__
    return code.replace(co_consts=tuple(message if c == _REFUSAL else c for c in code.co_consts))


def _label(reference) -> str:
    module = getattr(reference, "__module__", None) or "torch"
    return f"{module}.{getattr(reference, '__qualname__', getattr(reference, '__name__', repr(reference)))}"


@contextlib.contextmanager
def forbidding(*references):
    """Inside the block, calling any of `references` raises an AssertionError that says so.

    A reference may be a Python function or method (`ttlib.model.attention.explicit_attention`, `KVCache.reorder`): its
    code is swapped for the block, so it refuses however it was imported or stored. A class refuses through its
    `forward`. Built-in torch functions (`torch.nn.functional.scaled_dot_product_attention`) refuse through a
    TorchFunctionMode. Everything is put back when the block ends, however it ends. A reference defined in the
    notebook itself means the notebook replaced the original (`ttlib.data.trajectories.fn = my_fn`): an AssertionError
    says so.
    """
    swapped, builtins = [], []
    for reference in references:
        target = reference.forward if isinstance(reference, type) else reference
        target = getattr(target, "__func__", target)  # a bound method -> its function
        code = getattr(target, "__code__", None)
        if getattr(target, "__module__", None) == "__main__":  # `ttlib.data.trajectories.fn = fn` in the notebook
            raise AssertionError(f"{getattr(target, '__qualname__', target)}, which this test expects to be "
                                 "ttlib's or PyTorch's own function, was written in this notebook: the notebook "
                                 "replaced the original. Restart the kernel and leave ttlib's functions as they are.")
        if code is None:
            builtins.append(reference)
        elif code.co_freevars:
            raise TypeError(f"forbidding: {_label(reference)} is a closure; forbid the function that creates it")
        else:
            swapped.append((target, code))
    try:
        for target, _code in swapped:
            target.__code__ = _refusal(_label(target))
        with contextlib.ExitStack() as stack:
            if builtins:
                stack.enter_context(_refusing_torch_functions(builtins))
            yield
    finally:
        for target, code in swapped:
            target.__code__ = code


def _refusing_torch_functions(functions):
    from torch.overrides import TorchFunctionMode

    class Refuse(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if func in functions:
                raise AssertionError(f"your code called {_label(func)}: this exercise asks you to write that "
                                     "yourself, so here it refuses to run.")
            return func(*args, **(kwargs or {}))

    return Refuse()
