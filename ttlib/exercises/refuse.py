"""While an exercise's answer runs, the reference it rebuilds refuses to run -- under any name.

    with guard(ttlib.model.attention.explicit_attention, F.scaled_dot_product_attention) as watch:
        got = your_attention(q, k, v, mask)
    watch.refused  # what your code called that it should have written itself (empty: nothing)

How each kind of reference is caught:
- a Python function, method or class (its `forward`): by its code's file, first line and name, through a profile
  hook that sees every Python call. A private copy of the module, a function rebuilt from the code object, or the
  original restored by hand refuse like the original;
- a built-in torch function (F.scaled_dot_product_attention): through a TorchFunctionMode;
- with `strict`, the ATen operators behind it (`torch.ops.aten._scaled_dot_product_flash_attention_for_cpu`, ...):
  through a TorchDispatchMode, which sees the operator however the call reached it.

`strict=True` (the graders' hidden tests) also refuses what could undo the guard or compute the answer somewhere
the guard cannot see: exec/eval/compile and code objects, profile and trace hooks, other threads, forks and
subprocesses, ctypes, other calls' frames and the garbage collector's lists of objects, and popping torch's mode
stacks. Every refusal is recorded (and, with `report`, written out at once: a grader reads it from outside the
process, where nothing the code does afterwards can take it back) and the check fails, whatever the code returns.

A guard is a check, not a sandbox: code that reaches the guard's own state can still undo it. The graders pair it
with a sandboxed process and with a static scan of the submission (ttlib.grading.scan) that flags such code.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import sys
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch

__all__ = ["Refused", "Watch", "guard", "label", "runs_learners_code", "warm_up_dispatch"]


class Refused(AssertionError):
    """Your code called something the exercise asks you to write yourself."""


def label(reference) -> str:
    """`torch.nn.functional.scaled_dot_product_attention`, `ttlib.model.attention.explicit_attention`, ..."""
    if isinstance(reference, torch._ops.OpOverloadPacket):
        return f"torch.ops.aten.{reference.__name__}"
    module = getattr(reference, "__module__", None) or "torch"
    name = getattr(reference, "__qualname__", getattr(reference, "__name__", repr(reference)))
    return f"{module}.{name}"


def _code(reference):
    """The code object a Python reference runs (a class runs its forward), or None for a built-in."""
    target = reference.forward if isinstance(reference, type) else reference
    target = getattr(target, "__func__", target)  # a bound method -> its function
    return getattr(target, "__code__", None)


def _key(code) -> tuple[str, int, str]:
    return os.path.realpath(code.co_filename), code.co_firstlineno, code.co_name


# what strict mode refuses, beyond the references themselves: built-ins that run code the guard cannot see, leave
# the guard or reach its state ...
def _strict_builtins() -> dict:
    import gc
    import marshal

    found = {exec: "exec", eval: "eval", compile: "compile", sys.setprofile: "sys.setprofile",
             sys.settrace: "sys.settrace", sys._getframe: "sys._getframe", sys._current_frames: "sys._current_frames",
             gc.get_objects: "gc.get_objects", gc.get_referrers: "gc.get_referrers",
             gc.get_referents: "gc.get_referents", marshal.loads: "marshal.loads"}
    import _thread

    for name in ("start_new_thread", "start_joinable_thread", "start_new"):
        if hasattr(_thread, name):
            found[getattr(_thread, name)] = f"_thread.{name}"
    for name in ("fork", "forkpty", "vfork", "system", "popen", "posix_spawn", "posix_spawnp", "execv", "execve",
                 "execvp", "execvpe", "spawnv", "spawnve", "kill", "killpg"):
        if callable(getattr(os, name, None)):
            found[getattr(os, name)] = f"os.{name}"
    try:
        import _posixsubprocess

        found[_posixsubprocess.fork_exec] = "subprocess (_posixsubprocess.fork_exec)"
    except ImportError:  # not on POSIX
        pass
    for name in ("_pop_torch_function_stack", "_pop_torch_dispatch_stack", "_set_torch_function_mode",
                 "_set_torch_dispatch_mode", "_unset_dispatch_mode", "_disabled_torch_function_impl"):
        if callable(getattr(torch._C, name, None)):
            found[getattr(torch._C, name)] = f"torch._C.{name}"
    return found


# ... and Python modules whose functions do the same (by file: a private copy of them is caught too)
_STRICT_MODULES = ("inspect", "ctypes", "subprocess", "multiprocessing", "concurrent.futures", "threading",
                   "pdb", "bdb", "code", "codeop", "runpy", "pickle")
_STRICT_FUNCTIONS = {"torch.overrides": ("_pop_mode", "_pop_mode_temporarily", "_no_torch_function_mode"),
                     "torch.utils._python_dispatch": ("_pop_mode", "_pop_mode_temporarily", "_disable_current_modes")}


def _module_files(names: Iterable[str]) -> tuple[str, ...]:
    """The source folders (packages) or files of modules, for a prefix test on a code's file name."""
    import importlib.util

    places = []
    for name in names:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            continue
        if spec is None or spec.origin is None:
            continue
        origin = os.path.realpath(spec.origin)
        places.append(os.path.dirname(origin) + os.sep if spec.submodule_search_locations else origin)
    return tuple(places)


def _library_roots() -> tuple[str, ...]:
    """Folders that hold libraries (the standard library, site-packages, ttlib): code elsewhere is the learner's."""
    import site
    import sysconfig

    roots = {sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(os.path.dirname(__file__))}
    roots.update(sysconfig.get_paths().values())
    roots.update(getattr(site, "getsitepackages", lambda: [])())
    roots.add(getattr(site, "getusersitepackages", lambda: "")())  # pip install --user
    # packages another environment lends this one (a .pth file, a virtualenv's system site packages)
    roots.update(p for p in sys.path if os.path.basename(os.path.normpath(p)) in ("site-packages", "dist-packages"))
    # and the folders PYTHONPATH adds (tools/gpu-check installs its wheels into one; the grader's sandbox adds one)
    roots.update(p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and os.path.isdir(p))
    return tuple(os.path.realpath(r) + os.sep for r in roots if r)


_LIBRARIES = _library_roots()
_LEARNERS: dict = {}  # code object -> whether it is the learner's (not a library's)


def runs_learners_code(frame) -> bool:
    """Is `frame` running the learner's code (a notebook cell, a submission), not a library's?"""
    if frame is None:
        return False
    code = frame.f_code
    if code not in _LEARNERS:
        filename = code.co_filename
        _LEARNERS[code] = not (filename.startswith("<frozen") or
                               os.path.realpath(filename).startswith(_LIBRARIES))
    return _LEARNERS[code]


@dataclass
class Watch:
    """What a guarded block's code called that it should not have (`label`s, in order)."""

    refused: list[str] = field(default_factory=list)

    def message(self) -> str:
        first = self.refused[0]
        return f"your code called {first}: this exercise asks you to write that yourself, so here it refuses to run."


@dataclass
class _Targets:
    """What one guard refuses, sorted by how each is caught (see the module's docstring)."""

    python: dict  # (file, first line, name) of a Python reference's code -> its label
    torch_functions: dict  # a built-in torch function -> its label
    aten_ops: dict  # an ATen operator's name -> its label (strict only)
    strict: bool
    builtins: dict = field(default_factory=dict)  # strict: a C function the learner's code may not call -> label
    module_files: tuple = ()  # strict: the files (or package folders) of modules the learner's code may not call
    by_name: dict = field(default_factory=dict)  # strict: (module file, function name) -> label
    known: dict = field(default_factory=dict)  # code object -> what(code): each code's file is looked up once

    @classmethod
    def of(cls, references, strict: bool) -> _Targets:
        targets = cls({}, {}, {}, strict)
        for reference in references:
            if isinstance(reference, torch._ops.OpOverloadPacket):  # only a cheat reaches these: strict mode only
                if strict:
                    targets.aten_ops[reference.__name__] = label(reference)
                continue
            code = _code(reference)
            if code is None:
                targets.torch_functions[reference] = label(reference)
            else:
                targets.python[_key(code)] = label(reference)
        if strict:
            targets.builtins, targets.module_files = _strict_builtins(), _module_files(_STRICT_MODULES)
            for module, names in _STRICT_FUNCTIONS.items():
                for place in _module_files([module]):
                    targets.by_name.update({(place, name): f"{module}.{name}" for name in names})
        return targets

    def what(self, code) -> tuple[str | None, bool]:
        """(the label of what calling `code` is, or None; whether it is one of the references themselves)."""
        if code not in self.known:
            filename = os.path.realpath(code.co_filename)
            reference = self.python.get((filename, code.co_firstlineno, code.co_name))
            what = reference
            if what is None and self.strict:
                what = self.by_name.get((filename, code.co_name))
                if what is None and filename.startswith(self.module_files):
                    what = f"{inspect.getmodulename(filename) or filename} (the module {filename})"
            self.known[code] = (what, reference is not None)
        return self.known[code]


@contextlib.contextmanager
def guard(*references, strict: bool = False, report: Callable[[str], None] | None = None):
    """Inside the block, calling any of `references` (or, with `strict`, anything that could undo the guard) is
    refused: an AssertionError (`Refused`) is raised where the call was made, and the call is recorded in the
    yielded Watch. `report(label)` is called at once for every refusal (a grader writes it out of the process).
    Everything is put back when the block ends, however it ends."""
    watch, targets = Watch(), _Targets.of(references, strict)

    def refuse(what: str):
        watch.refused.append(what)
        if report is not None:
            report(what)
        raise Refused(f"your code called {what}: this exercise asks you to write that yourself, so here it "
                      "refuses to run.")

    what_is = targets.what  # the hook runs on every call: one lookup less

    def hook(frame, event, arg):
        if event == "call":
            what, is_reference = what_is(frame.f_code)
            # a reference refuses whoever calls it; the strict list only when the learner's own code calls it
            # (libraries use threading, inspect, exec, ... for their own purposes)
            if what is not None and (is_reference or runs_learners_code(frame.f_back)):
                refuse(what)
        elif event == "c_call" and strict and arg in targets.builtins and runs_learners_code(frame):
            refuse(targets.builtins[arg])

    previous = sys.getprofile()
    if previous is not None and not callable(previous):  # e.g. cProfile's profiler object: not restorable by us
        previous = None
    if targets.aten_ops:
        warm_up_dispatch()
    with contextlib.ExitStack() as stack:
        if targets.torch_functions:
            stack.enter_context(_RefuseTorchFunctions(targets.torch_functions, refuse))
        if targets.aten_ops:
            stack.enter_context(_RefuseAtenOps(targets.aten_ops, refuse))
        threads_hook = threading.getprofile() if hasattr(threading, "getprofile") else None
        if targets.python or strict:
            sys.setprofile(hook)
            threading.setprofile(hook)
        try:
            yield watch
        finally:
            sys.setprofile(previous)
            threading.setprofile(threads_hook)


@functools.cache
def warm_up_dispatch() -> None:
    """Python dispatch modes import a good deal of torch the first time one is used (seconds): do it before the
    profile hook is watching, once."""
    with _RefuseAtenOps({}, None):
        torch.ones(2) + 1


class _RefuseTorchFunctions(torch.overrides.TorchFunctionMode):
    def __init__(self, functions: dict, refuse):
        super().__init__()
        self.functions, self.refuse = functions, refuse

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in self.functions:
            self.refuse(self.functions[func])
        return func(*args, **(kwargs or {}))


def _dispatch_mode_base():
    from torch.utils._python_dispatch import TorchDispatchMode

    return TorchDispatchMode


class _RefuseAtenOps(_dispatch_mode_base()):
    def __init__(self, ops: dict, refuse):
        super().__init__()
        self.ops, self.refuse = ops, refuse

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        what = self.ops.get(func.overloadpacket.__name__)
        if what is not None:
            self.refuse(what)
        return func(*args, **(kwargs or {}))
