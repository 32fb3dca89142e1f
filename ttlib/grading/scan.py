"""A static scan of a submission's own code for what the graders' guard cannot stop in every case: each finding is
flagged for the instructor to review, with its cell, line and reason. It decides no grade.

What grading enforces (ttlib.exercises.hidden and the sandbox) already stops most of these from earning points:
the hidden tests run only the submission's definitions, in a process of its own, with the references refusing to
run. The scan catches the rest of the attempt -- and the attempt itself, which an instructor wants to know about:

    code from strings (exec, eval, compile), code objects and functions rebuilt from them, source and frame
    inspection, import machinery and sys.modules, profile and trace hooks, the garbage collector's object lists,
    IPython hooks and magics, other processes and C calls (subprocess, os.system, multiprocessing, ctypes),
    PyTorch's internals (torch.ops, torch._C, function and dispatch modes), rebinding a library's names
    (`ttlib.x = ...`, setattr on a module), the checker itself (ttlib.exercises, ttlib.course.checks, ttlib.grading),
    and files or processes outside the notebook's own work (deleting files, signals, the course folder's names).

    flags = scan_notebook(submitted_nb, released_nb)   # [Flag(cell, line, code, reason), ...]
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

__all__ = ["ATTRIBUTES", "BUILTINS", "COURSE_WORDS", "Flag", "MODULE_ALIASES", "NAMES", "OS_EXEC", "imports_of",
           "scan_notebook", "scan_source", "student_cells"]


@dataclass(frozen=True)
class Flag:
    cell: int  # index of the cell in the notebook
    line: int  # line in the cell, from 1
    code: str  # the line, stripped (at most 100 characters)
    reason: str  # why it is flagged, in a few words

    def __str__(self) -> str:
        return f"cell {self.cell} line {self.line}: `{self.code}` ({self.reason})"


# names (as written, dotted) whose use is flagged, and why
NAMES = {
    "exec": "runs code from a string", "eval": "runs code from a string", "compile": "compiles code from a string",
    "__import__": "imports through the import machinery", "importlib": "uses the import machinery",
    "runpy": "runs modules by hand", "sys.modules": "reads or replaces loaded modules",
    "inspect": "reads source code or frames", "linecache": "reads source code",
    "sys._getframe": "reaches other calls' frames", "sys._current_frames": "reaches other calls' frames",
    "sys.settrace": "installs a trace hook", "sys.setprofile": "installs a profile hook",
    "threading.settrace": "installs a trace hook", "threading.setprofile": "installs a profile hook",
    "sys.monitoring": "installs a monitoring hook", "gc": "reaches other objects through the garbage collector",
    "get_ipython": "changes how the notebook's cells run", "IPython": "changes how the notebook's cells run",
    "subprocess": "starts another process", "multiprocessing": "starts another process",
    "concurrent.futures": "runs code in other threads or processes", "threading": "runs code in another thread",
    "_thread": "runs code in another thread", "os.system": "starts another process",
    "os.popen": "starts another process", "os.fork": "starts another process", "os.forkpty": "starts another process",
    "os.posix_spawn": "starts another process", "os.posix_spawnp": "starts another process",
    "pty": "starts another process", "ctypes": "calls C code directly", "cffi": "calls C code directly",
    "types.CodeType": "builds code objects", "types.FunctionType": "builds functions from code objects",
    "marshal": "loads code from bytes", "pickle": "loads objects (and code) from bytes",
    "dill": "loads objects (and code) from bytes", "cloudpickle": "loads objects (and code) from bytes",
    "torch.ops": "calls PyTorch's operators by their internal names", "torch._C": "reaches PyTorch's internals",
    "torch.overrides": "reaches PyTorch's function modes", "torch.utils._python_dispatch": "reaches dispatch modes",
    "TorchFunctionMode": "reaches PyTorch's function modes", "TorchDispatchMode": "reaches dispatch modes",
    "builtins": "rebinds Python's built-ins", "__builtins__": "rebinds Python's built-ins",
    "ttlib.exercises": "reaches the exercises' checker", "ttlib.course.checks": "reaches the exercises' checker",
    "ttlib.grading": "reaches the grader", "shutil.rmtree": "deletes folders", "os.remove": "deletes files",
    "os.unlink": "deletes files", "os.rmdir": "deletes folders", "os.kill": "signals other processes",
    "os.killpg": "signals other processes", "signal": "handles or sends signals", "os.setsid": "detaches a process",
    "os.chdir": "leaves its own folder", "socket": "opens network connections",
}
OS_EXEC = re.compile(r"^os\.(exec|spawn)\w*$")
ATTRIBUTES = {
    "__code__": "reaches a function's code object", "co_code": "reads a code object",
    "co_consts": "reads a code object", "__globals__": "reaches a function's globals",
    "__closure__": "reaches a function's closure", "cell_contents": "rewrites a closure",
    "__defaults__": "rewrites a function's defaults", "__kwdefaults__": "rewrites a function's defaults",
    "f_back": "walks up other calls' frames", "f_locals": "reads other calls' variables",
    "f_globals": "reads other calls' globals", "tb_frame": "reaches frames through a traceback",
    "gi_frame": "reaches a generator's frame", "__subclasses__": "walks the class hierarchy",
    "__dict__": "reads or rewrites an object's namespace", "__class__": "rewrites an object's class",
    "unlink": "deletes files", "rmdir": "deletes folders",
}
COURSE_WORDS = re.compile(r"gradebook|autograded|submitted|feedback|release|grading|\.\./|/\.\.")
MODULE_ALIASES = {"np", "numpy", "torch", "F", "nn", "ttlib", "math", "os", "sys", "gym", "gymnasium", "plt"}


def _dotted(node: ast.AST) -> str | None:
    """`a.b.c` for a Name/Attribute chain, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


BUILTINS = {"exec", "eval", "compile", "__import__", "get_ipython", "__builtins__", "builtins"}


def _name_reason(name: str, aliases: dict[str, str]) -> str | None:
    """The reason a dotted name is flagged, or None. Its first part must be an imported module (`import x as y`
    resolved) or a flagged built-in: a variable that happens to be called `signal` is not flagged."""
    head, _, rest = name.partition(".")
    if head not in aliases and head not in BUILTINS:
        return None
    full = aliases.get(head, head) + ("." + rest if rest else "")
    for candidate in _prefixes(full):
        if candidate in NAMES:
            return NAMES[candidate]
    if OS_EXEC.match(full):
        return "replaces the process with another program"
    return None


def _prefixes(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(len(parts), 0, -1)]


def imports_of(source: str) -> dict[str, str]:
    """{name: module} bound by a cell's imports (`import numpy as np` -> {"np": "numpy"})."""
    try:
        tree = ast.parse(_as_python(source))
    except SyntaxError:
        return {}
    aliases = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                aliases[alias.asname or alias.name.split(".")[0]] = alias.name if alias.asname else \
                    alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return aliases


def scan_source(source: str, cell: int = 0, known: dict[str, str] | None = None) -> list[Flag]:
    """The flags of one cell's code (IPython syntax allowed: magics and `!commands` are flagged too). `known`: the
    names other cells imported (the notebook's import cell), so that `torch.ops...` is flagged there too."""
    lines = source.splitlines()
    found: list[tuple[int, str]] = [(number, "a shell command or IPython magic") for number, text in
                                    enumerate(lines, start=1) if text.lstrip().startswith(("!", "%"))]
    try:
        tree = ast.parse(_as_python(source))
    except SyntaxError:
        tree = None  # a cell that does not parse cannot run either
    if tree is not None:
        bound = _bound_names(tree)  # a parameter called `mask` is not the module another cell imported as `mask`
        aliases = {name: module for name, module in {**{name: name for name in MODULE_ALIASES}, "np": "numpy",
                   "F": "torch.nn.functional", "nn": "torch.nn", **(known or {})}.items() if name not in bound}
        aliases.update(imports_of(source))
        found += _import_findings(tree)
        for node in ast.walk(tree):
            found += [(getattr(node, "lineno", 0), reason) for reason in _node_reasons(node, aliases)]
    return _one_flag_a_line(found, lines, cell)


def _import_findings(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, reason) of the imports of flagged modules or names."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                top = alias.name.split(".")[0]
                found.append((node.lineno, _name_reason(alias.name, {top: top})))
        elif isinstance(node, ast.ImportFrom) and node.module:
            top = {node.module.split(".")[0]: node.module.split(".")[0]}
            for alias in node.names:
                found.append((node.lineno, _name_reason(f"{node.module}.{alias.name}", top) or
                              _name_reason(node.module, top)))
    return [(line, reason) for line, reason in found if reason]


def _node_reasons(node: ast.AST, aliases: dict[str, str]) -> list[str]:
    """Why one node of a cell's syntax tree is flagged (names, attributes, rebinding, file names), if it is."""
    reasons = []
    if isinstance(node, (ast.Name, ast.Attribute)) and isinstance(getattr(node, "ctx", None), ast.Load):
        name = _dotted(node)
        reasons.append(_name_reason(name, aliases) if name else None)
    if isinstance(node, ast.Attribute) and node.attr in ATTRIBUTES:
        reasons.append(ATTRIBUTES[node.attr])
    if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
        for target in node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]:
            name = _dotted(target) if isinstance(target, ast.Attribute) else None
            if name and name.split(".")[0] in set(aliases) | MODULE_ALIASES:
                reasons.append(f"rebinds `{name}`, a name of a library")
            if isinstance(target, ast.Subscript) and isinstance(target.value, ast.Call) and \
                    _dotted(target.value.func) in ("globals", "vars", "locals"):
                reasons.append("rewrites names through globals()")
    if isinstance(node, ast.Call):
        func = _dotted(node.func)
        if func in ("setattr", "delattr") and node.args and isinstance(node.args[0], (ast.Name, ast.Attribute)):
            reasons.append(f"{func} on another object (e.g. a library's module)")
        if func == "open" or (func or "").endswith((".write_text", ".write_bytes", ".open")):
            reasons += ["opens a file outside its own folder" for arg in node.args[:1]
                        if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and
                        COURSE_WORDS.search(arg.value)]
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and COURSE_WORDS.search(node.value) \
            and ("/" in node.value or node.value.endswith(".db")):
        reasons.append("names the course folder's files")
    return [r for r in reasons if r]


def _one_flag_a_line(found: list[tuple[int, str]], lines: list[str], cell: int) -> list[Flag]:
    """The findings as flags, one a line with its reasons together (in the order found), sorted by line."""
    reasons: dict[int, str] = {}
    for line, reason in found:
        if line not in reasons:
            reasons[line] = reason
        elif reason not in reasons[line]:
            reasons[line] += f"; {reason}"
    return [Flag(cell, line, (lines[line - 1].strip() if 0 < line <= len(lines) else "")[:100], reasons[line])
            for line in sorted(reasons)]


def _bound_names(tree: ast.AST) -> set[str]:
    """Names a cell binds other than by importing: parameters, assignment and loop targets, defs."""
    bound = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            bound.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
    return bound


def _as_python(source: str) -> str:
    """IPython's syntax turned into Python (magics become get_ipython() calls, which the scan flags)."""
    try:
        from IPython.core.inputtransformer2 import TransformerManager

        return TransformerManager().transform_cell(source)
    except Exception:  # noqa: BLE001 (without IPython, or a cell it cannot transform: scan the source itself)
        return source


def _source(cell) -> str:
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else source


def student_cells(submitted, released) -> list[tuple[int, str]]:
    """(index, source) of the code cells that are the student's own: exercise cells, cells the student added, and
    released cells the student changed. Test cells are not theirs (nbgrader puts them back before grading)."""
    given = {_source(c) for c in released.cells if c.get("cell_type") == "code"}
    own = []
    for index, cell in enumerate(submitted.cells):
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if cell.get("cell_type") != "code" or meta.get("grade"):
            continue
        source = _source(cell)
        if meta.get("solution") or source not in given:
            own.append((index, source))
    return own


def scan_notebook(submitted, released) -> list[Flag]:
    """Every flag in the student's own cells of `submitted` (nbformat notebooks, or dicts shaped like them)."""
    known: dict[str, str] = {}
    for cell in released.cells:  # what the notebook's own cells import (not its test cells)
        if cell.get("cell_type") == "code" and not cell.get("metadata", {}).get("nbgrader", {}).get("grade"):
            known.update(imports_of(_source(cell)))
    flags = []
    for index, source in student_cells(submitted, released):
        flags += scan_source(source, index, known)
    return flags
