"""The house rules of the code, checked on its source: the files are parsed, nothing is imported (well under a
second). Each failure names every offender with its size, so one run says what remains to do.

1. Small pieces. Every module under ttlib/ and tools/ is at most 480 lines, every function at most 65 -- counted from
   its `def` line to its last line (a decorator is not counted; a nested function counts in its own right and in the
   function around it). A module may be one piece instead: its docstring then has a line that starts with
   "One piece:" and says why, in a sentence of its own (at least six words), e.g.

       One piece: the wrapper's steps must run in this order in one process, and read best in that order.

   Such a module is exempt from both bounds; the sentence is what a reviewer checks.
2. No import circle among ttlib's modules. An import counts wherever it stands: one inside a function only runs
   later, it is still a dependency, and moving it there does not break a circle. Not counted: imports under
   `if TYPE_CHECKING:` (they never run) and imports by name in strings (`importlib.import_module(name)`).
3. The rooms stay apart. The library learners import (every module of ttlib outside ttlib/grading/, except the
   `ttlib` command line, whose `ttlib grade` is the grader's front door) never reaches ttlib.grading, directly or
   through another module; and nothing in ttlib imports tools/, which is not installed.
4. CI runs the README's test command, verbatim.
5. Rooms, not a heap: ttlib's top level keeps at most 6 modules (its faces); everything else lives in a subpackage
   named for what it holds, and docs/ARCHITECTURE.md's picture of which room imports which is the source's.
6. A library function leaves the process's torch thread count as it finds it. Only what a process starts with sets
   it (torch.set_num_threads, or ttlib.course.threads.fit): the `ttlib` command and the worker processes ttlib
   starts itself (THREAD_SETTERS); notebooks call fit in their first cell.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODULE_LINES, FUNCTION_LINES = 480, 65
ONE_PIECE = re.compile(r"^\s*One piece:\s+([^.]+)\.", re.MULTILINE)  # "One piece:" and a sentence
COMMAND_LINE = {"ttlib.cli.main", "ttlib.__main__"}  # the `ttlib` command: mounts the grader's subcommands


# ---- reading the source ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Import:
    source: str  # the importing module, dotted
    target: str  # the imported module, dotted (a name imported from a module counts as that module)
    line: int
    in_function: bool


def python_files(folder: str) -> list[Path]:
    """The folder's Python modules, and its scripts without a suffix that Python runs (tools/gpu-check)."""
    found = sorted((ROOT / folder).rglob("*.py"))
    scripts = [p for p in (ROOT / folder).iterdir() if p.is_file() and not p.suffix
               and p.read_text(encoding="utf-8", errors="replace").startswith("#!/usr/bin/env python")]
    return found + sorted(scripts)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def one_piece(tree: ast.Module) -> bool:
    """Does the module's docstring say why it is one piece ("One piece:" and a sentence of six words or more)?"""
    said = ONE_PIECE.search(ast.get_docstring(tree) or "")
    return said is not None and len(said.group(1).split()) >= 6


def long_functions(tree: ast.Module, bound: int = FUNCTION_LINES) -> list[tuple[str, int, int]]:
    """(qualified name, line, length) of every function longer than `bound` lines."""
    found = []

    def visit(node, prefix):
        for child in ast.iter_child_nodes(node):
            name = prefix
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}."
                length = child.end_lineno - child.lineno + 1
                if not isinstance(child, ast.ClassDef) and length > bound:
                    found.append((name[:-1], child.lineno, length))
            visit(child, name)

    visit(tree, "")
    return found


def imports(source: str, tree: ast.Module, is_package: bool, known: set[str]) -> list[Import]:
    """Every import statement of `source` that names a module in `known` (relative ones resolved)."""
    package = source.split(".") if is_package else source.split(".")[:-1]
    found = []

    def add(target, node, in_function):
        while target and target not in known:  # `from ttlib.x import name`: the module is ttlib.x
            target = target.rpartition(".")[0]
        if target:
            found.append(Import(source, target, node.lineno, in_function))

    def visit(node, in_function):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                visit(ast.Module(body=child.orelse, type_ignores=[]), in_function)
                continue
            if isinstance(child, ast.Import):
                for alias in child.names:
                    add(alias.name, child, in_function)
            elif isinstance(child, ast.ImportFrom):
                base = package[:len(package) - child.level + 1] if child.level else []
                module = ".".join(base + ([child.module] if child.module else []))
                for alias in child.names:  # `from . import gpt` imports a module; `from . import Exercise`, a name
                    add(f"{module}.{alias.name}" if f"{module}.{alias.name}" in known else module, child, in_function)
            visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    visit(tree, False)
    return found


@dataclass
class Source:
    """The parsed modules of ttlib/ and tools/."""

    trees: dict[str, tuple[Path, ast.Module]]

    @classmethod
    def read(cls) -> Source:
        trees = {}
        for folder in ("ttlib", "tools"):
            for path in python_files(folder):
                trees[module_name(path)] = path, ast.parse(path.read_text(encoding="utf-8"), str(path))
        return cls(trees)

    def imports(self) -> list[Import]:
        known = set(self.trees) | {"tools"}
        return [i for name, (path, tree) in self.trees.items()
                for i in imports(name, tree, path.name == "__init__.py", known)]


def circles(edges: list[Import]) -> list[list[str]]:
    """The import circles: each strongly connected set of two or more modules (Tarjan), sorted; a module that
    imports itself is one too."""
    graph: dict[str, set[str]] = {}
    for edge in edges:
        graph.setdefault(edge.source, set()).add(edge.target)
        graph.setdefault(edge.target, set())
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def connect(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                connect(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while not group or group[-1] != node:
                group.append(stack.pop())
                on_stack.discard(group[-1])
            if len(group) > 1 or node in graph[node]:
                found.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return sorted(found)


def reachable(start: str, edges: list[Import]) -> dict[str, list[Import]]:
    """Every module `start` imports, directly or through others, with the chain of imports that gets there."""
    paths: dict[str, list[Import]] = {start: []}
    frontier = [start]
    while frontier:
        node = frontier.pop(0)
        for edge in edges:
            if edge.source == node and edge.target not in paths:
                paths[edge.target] = paths[node] + [edge]
                frontier.append(edge.target)
    return paths


def thread_setters(tree: ast.Module) -> set[str]:
    """The qualified names of the functions ("<module>" outside any) that set torch's thread count: a call of
    set_num_threads, or of ttlib.course.threads' fit or keep_fitting, under whatever name it was imported."""
    aliases = {}  # local name -> dotted name
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            aliases.update({a.asname or a.name.split(".")[0]: a.name if a.asname else a.name.split(".")[0]
                            for a in node.names})
        elif isinstance(node, ast.ImportFrom) and node.module:
            aliases.update({a.asname or a.name: f"{node.module}.{a.name}" for a in node.names})
    setters = {f"ttlib.course.threads.{name}" for name in ("fit", "keep_fitting")}
    found = set()

    def visit(node, name):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Call) and isinstance(child.func, (ast.Name, ast.Attribute)):
                first, _, rest = ast.unparse(child.func).partition(".")
                called = ".".join(filter(None, (aliases.get(first, first), rest)))
                if called.rpartition(".")[2] == "set_num_threads" or called in setters:
                    found.add(name)
            inner = isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            visit(child, (child.name if name == "<module>" else f"{name}.{child.name}") if inner else name)

    visit(tree, "<module>")
    return found


def where(edge: Import) -> str:
    return f"{edge.source} -> {edge.target} (line {edge.line}{', in a function' if edge.in_function else ''})"


# ---- the rules -----------------------------------------------------------------------------------------------------
SOURCE = Source.read()


def test_every_module_is_at_most_480_lines_or_says_why_it_is_one_piece():
    over = [(len(path.read_text(encoding="utf-8").splitlines()), path.relative_to(ROOT))
            for path, tree in SOURCE.trees.values() if not one_piece(tree)]
    over = sorted(((n, p) for n, p in over if n > MODULE_LINES), reverse=True)
    assert not over, (f"{len(over)} modules over {MODULE_LINES} lines (split them by idea, or say in the docstring "
                      "'One piece: why'):\n" + "\n".join(f"  {p}: {n} lines" for n, p in over))


def test_every_function_is_at_most_65_lines_or_its_module_says_why_it_is_one_piece():
    over = sorted(((length, f"{path.relative_to(ROOT)}:{line} {name}")
                   for path, tree in SOURCE.trees.values() if not one_piece(tree)
                   for name, line, length in long_functions(tree)), reverse=True)
    assert not over, (f"{len(over)} functions over {FUNCTION_LINES} lines:\n"
                      + "\n".join(f"  {where}: {n} lines" for n, where in over))


def test_no_import_circle_among_ttlibs_modules():
    edges = [e for e in SOURCE.imports() if e.source.startswith("ttlib") and e.target.startswith("ttlib")]
    found = circles(edges)
    report = []
    for group in found:
        report.append("  " + ", ".join(group) + ":")
        report += sorted({f"    {where(e)}" for e in edges if e.source in group and e.target in group})
    assert not found, f"{len(found)} import circles (function-level imports count too):\n" + "\n".join(report)


def test_the_learners_library_never_reaches_the_grader_nor_tools():
    edges = SOURCE.imports()
    library = [m for m in SOURCE.trees if m.startswith("ttlib") and not m.startswith("ttlib.grading")
               and m not in COMMAND_LINE]
    wrong = []
    for module in library:
        for target, chain in reachable(module, edges).items():
            if target.startswith("ttlib.grading"):
                wrong.append(f"  {module} reaches {target}: " + "; ".join(where(e) for e in chain))
    wrong += [f"  {where(e)}" for e in edges if e.source.startswith("ttlib") and e.target.split(".")[0] == "tools"]
    assert not wrong, "the library reaches the grader or tools/:\n" + "\n".join(sorted(set(wrong)))


def test_ci_runs_the_readmes_test_command_verbatim():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    commands = re.findall(r"^(TTLIB_FAST=1 python -m pytest .*)$", readme, re.MULTILINE)
    assert len(commands) == 1, f"the README should show one test command, not {commands}"
    assert "--durations=" in commands[0], "the test command should name the slowest tests (--durations=N)"
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert commands[0] in ci, f".ci/run does not run the README's test command: {commands[0]}"


THREAD_SETTERS = {  # (module, function): the entry points of processes, which set torch's threads for the process
    ("ttlib.cli.main", "main"),  # the `ttlib` command, once per command that computes
    ("ttlib.training.data_parallel", "worker_main"),  # a data-parallel worker process (torchrun's)
    ("ttlib.evaluation.ray_evaluation", "ModelActor.__init__"),  # a Ray actor, in a process of its own
    ("ttlib.course.threads", "fit"), ("ttlib.course.threads", "timed"),  # the setter; timed restores the count
}


def test_only_the_entry_points_of_processes_set_torchs_thread_count():
    found = {(module, name) for module, (_, tree) in SOURCE.trees.items() if module.startswith("ttlib")
             for name in thread_setters(tree)}
    assert ("ttlib.cli.main", "main") in found, "the `ttlib` command no longer fits torch's threads"
    wrong = sorted(found - THREAD_SETTERS)
    assert not wrong, ("library functions that change the whole process's torch thread count (leave it to the entry "
                       "points: the `ttlib` command, a notebook's first cell, a worker process's start):\n"
                       + "\n".join(f"  {module}: {name}" for module, name in wrong))


TOP_LEVEL_MODULES = 6  # __init__, __main__ and a few faces (errors, files)


def test_ttlibs_top_level_keeps_only_its_faces_and_every_folder_is_a_package():
    top = sorted(p.name for p in (ROOT / "ttlib").glob("*.py"))
    assert len(top) <= TOP_LEVEL_MODULES, f"{len(top)} modules at ttlib's top level (at most {TOP_LEVEL_MODULES}: " \
        f"move the rest into the room that holds their kind, see docs/ARCHITECTURE.md): {top}"
    folders = [p for p in (ROOT / "ttlib").rglob("*") if p.is_dir() and any(p.glob("*.py"))]
    missing = sorted(str(p.relative_to(ROOT)) for p in folders if not (p / "__init__.py").is_file())
    assert not missing, f"folders of modules without an __init__.py (a docstring saying what the room holds): {missing}"


def test_the_architecture_picture_is_the_sources():
    from tools import architecture

    assert architecture.updated(architecture.DOC.read_text(encoding="utf-8")) == \
        architecture.DOC.read_text(encoding="utf-8"), "docs/ARCHITECTURE.md is stale: python -m tools.architecture"


# ---- the checks themselves find what they should ------------------------------------------------------------------
def test_the_checks_find_a_long_function_a_circle_and_a_one_piece_sentence():
    long = ast.parse("def outer():\n    def inner():\n" + "        x = 1\n" * 70 + "    return inner\n")
    assert [(name, length) for name, _, length in long_functions(long)] == [("outer", 73), ("outer.inner", 71)]
    assert one_piece(ast.parse('"""Intro.\n\nOne piece: the six steps must be read in this order."""'))
    assert not one_piece(ast.parse('"""One piece: because.\n\nA long paragraph that follows it."""'))
    known = {"p", "p.a", "p.b", "p.c"}
    a = imports("p.a", ast.parse("from . import b\n"), False, known)
    b = imports("p.b", ast.parse("def f():\n    from .c import name\n"), False, known)
    c = imports("p.c", ast.parse("import p.a\nif TYPE_CHECKING:\n    from p import b\n"), False, known)
    assert [(e.target, e.in_function) for e in a + b + c] == [("p.b", False), ("p.c", True), ("p.a", False)]
    assert circles(a + b + c) == [["p.a", "p.b", "p.c"]]
    assert circles(a + b) == []
    assert [e.target for e in reachable("p.a", a + b)["p.c"]] == ["p.b", "p.c"]
    sets = ast.parse("from ttlib.course import threads as t\nimport torch as th\nfrom ttlib.course.threads import fit "
                     "as fit_threads\nfit_threads()\ndef f():\n    t.fit(2)\nclass A:\n    def g(self):\n"
                     "        th.set_num_threads(1)\n    def h(self):\n        t.free_cores(); fit(1)\n")
    assert thread_setters(sets) == {"<module>", "f", "A.g"}
