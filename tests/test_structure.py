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
6. Boundaries: every module of ttlib says what it offers in `__all__` -- exactly the public names it defines, and
   for a face (data.trajectories, planning.beam, grading.sandbox) the names it presents from the modules behind it
   (`python -m tools.public_api` writes them) -- and no module of ttlib or tools takes from another a name outside
   that one's `__all__`: neither a private name (`from ttlib.x import _helper`, `x._helper`) nor a name the other
   only imported itself (a re-export kept for convenience).
7. One error base: every exception class ttlib defines derives from ttlib.errors.TTLibError (which `ttlib` prints as
   one line) and from a built-in error (so `except ValueError` still works). Not counted: warnings, the grader's
   private signals (`_Stop`), and the exercises' AssertionErrors, which are the learner's messages.
8. One episode loop. Every agent is played by ttlib.evaluation.rollout's loop: no other module of ttlib/ or tools/
   steps an environment (`env.step(...)`, `envs.step(...)`: a receiver named for an environment) or builds a
   vector environment (gymnasium.vector, SyncVectorEnv, AsyncVectorEnv), except the few that step environments
   for another purpose, each named below with it; and none but Ray's environment workers steps rollout's
   EpisodeBatch itself (`batch.act(...)`) instead of letting it play.
9. A library function leaves the process's torch thread count as it finds it. Only what a process starts with sets
   it (torch.set_num_threads, or ttlib.course.threads.fit): the `ttlib` command and the worker processes ttlib
   starts itself (THREAD_SETTERS); notebooks call fit in their first cell.
10. One decoder field. How the planner decodes is chosen by one field, PlannerConfig.decoder (a DecoderName): no
   config dataclass of ttlib has another field that says it (`use_cache`, `cache`, `cuda_graphs`, `graphs`), and no
   other config takes a DecoderName. (tests/test_planning.py checks what the field does.)
"""

from __future__ import annotations

import ast
import builtins
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


@dataclass(frozen=True)
class Borrow:
    source: str  # the module that uses the name
    target: str  # the module the name is taken from
    name: str
    line: int


def borrowed(source: str, tree: ast.Module, is_package: bool, known: set[str]) -> list[Borrow]:
    """Every name `source` takes from another module in `known`: `from ttlib.x import name` (not a submodule), and
    `x.name` where x is a module it imported (`import ttlib.x as x`, `from ttlib import x`), in the scope where x
    means that module (a function whose argument or variable is also called x uses its own)."""
    package = source.split(".") if is_package else source.split(".")[:-1]
    found = []

    def visit(node, aliases: dict[str, str]):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                for alias in child.names:
                    if alias.name in known:  # `import ttlib.x` is used as written, `ttlib.x.name`
                        aliases[alias.asname or alias.name] = alias.name
            elif isinstance(child, ast.ImportFrom):
                base = package[:len(package) - child.level + 1] if child.level else []
                module = ".".join(base + ([child.module] if child.module else []))
                for alias in child.names:
                    if f"{module}.{alias.name}" in known:
                        aliases[alias.asname or alias.name] = f"{module}.{alias.name}"
                    elif module in known and module != source and alias.name != "*":
                        found.append(Borrow(source, module, alias.name, child.lineno))
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                own = {a.arg for a in ast.walk(child.args) if isinstance(a, ast.arg)}
                own |= {n.id for n in ast.walk(child) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
                visit(child, {k: v for k, v in aliases.items() if k.split(".")[0] not in own})
                continue
            elif isinstance(child, ast.Attribute) and ast.unparse(child.value) in aliases:
                target = aliases[ast.unparse(child.value)]
                if target != source:
                    found.append(Borrow(source, target, child.attr, child.lineno))
            visit(child, aliases)

    visit(tree, {})
    return found


def private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


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

    def borrowed(self) -> list[Borrow]:
        known = set(self.trees)
        return [b for name, (path, tree) in self.trees.items()
                for b in borrowed(name, tree, path.name == "__init__.py", known)]

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


def error_classes(trees: dict[str, ast.Module]) -> dict[str, set[str]]:
    """Every exception class the modules define ("module.Name"), with the names of all its ancestors: the modules'
    own classes followed by their simple names, a built-in by its name, a dotted base from elsewhere
    (`nbgrader.X`) by its last part, counted as an error when that part ends in Error or Exception."""
    bases = {}  # simple name -> base names (the last part of a dotted one)
    where = {}  # "module.Name" -> simple name
    for module, tree in trees.items():
        for node in tree.body:
            if isinstance(node, ast.ClassDef):
                bases.setdefault(node.name, []).extend(ast.unparse(b).rpartition(".")[2] for b in node.bases)
                where[f"{module}.{node.name}"] = node.name

    def ancestors(name: str, seen: frozenset = frozenset()) -> set[str]:
        if name in seen:
            return set()
        found = set()
        for base in bases.get(name, []):
            found |= {base} | ancestors(base, seen | {name})
        return found

    def is_error(name: str) -> bool:
        if isinstance(getattr(builtins, name, None), type):
            return issubclass(getattr(builtins, name), BaseException)
        return name.endswith(("Error", "Exception"))

    found = {qualified: ancestors(name) for qualified, name in where.items()}
    return {qualified: names for qualified, names in found.items() if any(is_error(a) for a in names)}


def not_ttlib_errors(trees: dict[str, ast.Module]) -> list[str]:
    """The exception classes that break rule 6, each with what it lacks."""
    wrong = []
    for qualified, ancestors in sorted(error_classes(trees).items()):
        module, _, name = qualified.rpartition(".")
        warning = any(issubclass(getattr(builtins, a), Warning) for a in ancestors
                      if isinstance(getattr(builtins, a, None), type))
        if (warning or qualified == "ttlib.errors.TTLibError"
                or (module.startswith("ttlib.grading") and name.startswith("_"))
                or (module.startswith("ttlib.exercises") and "AssertionError" in ancestors)):
            continue
        builtin = {a for a in ancestors if isinstance(getattr(builtins, a, None), type)} - {"Exception",
                                                                                            "BaseException"}
        lacks = [what for what, ok in (("TTLibError", "TTLibError" in ancestors),
                                       ("a built-in error (ValueError, RuntimeError, ...)", builtin)) if not ok]
        if lacks:
            wrong.append(f"  {qualified}: not derived from {' nor '.join(lacks)}")
    return wrong


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


def test_the_files_the_suite_runs_first_exist():
    from conftest import SLOWEST_FIRST  # tests/conftest.py

    missing = [name for name in SLOWEST_FIRST if not (ROOT / name).is_file()]
    assert not missing, f"tests/conftest.py's SLOWEST_FIRST names files that are gone (renamed?): {missing}"


THREAD_SETTERS = {  # (module, function): the entry points of processes, which set torch's threads for the process
    ("ttlib.cli.main", "main"),  # the `ttlib` command, once per command that computes
    ("ttlib.training.data_parallel", "worker_main"),  # a data-parallel worker process (torchrun's)
    ("ttlib.evaluation.ray_evaluation", "ModelActor.__init__"),  # a Ray actor, in a process of its own
    ("ttlib.grading.zygote", "_after_fork"),  # a process forked from the grading zygote: its own start
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


def test_no_private_name_crosses_modules():
    crossing = sorted({f"  {b.source} (line {b.line}) uses {b.target}.{b.name}" for b in SOURCE.borrowed()
                       if private(b.name)})
    assert not crossing, ("a private name (_name) is its module's own: make it public (and list it in __all__), or "
                          "move what uses it next to it:\n" + "\n".join(crossing))


def test_every_module_of_ttlib_lists_its_public_api_in_all():
    from tools import public_api

    wrong = []
    for name, (_, tree) in sorted(SOURCE.trees.items()):
        if not name.startswith("ttlib"):
            continue
        node, names = public_api.declared(tree)
        defined, imported = public_api.bound_names(tree)
        if node is None:
            wrong.append(f"  {name}: no __all__")
            continue
        unknown = sorted(set(names) - set(defined) - imported)
        if unknown:
            wrong.append(f"  {name}: __all__ names what it does not have: {unknown}")
        if sorted(names) != public_api.public_api(tree):
            missing = sorted(set(public_api.public_api(tree)) - set(names))
            wrong.append(f"  {name}: __all__ is not its public names" + (f" (it lacks {missing})" if missing else ""))
    assert not wrong, ("every module's __all__ is the public names it defines, plus what a face presents "
                       "(python -m tools.public_api writes them):\n" + "\n".join(wrong))


def test_no_module_takes_a_name_outside_the_others_all():
    from tools import public_api

    offered = {name: set(public_api.declared(tree)[1] or []) for name, (_, tree) in SOURCE.trees.items()}
    wrong = sorted({f"  {b.source} (line {b.line}) takes {b.name} from {b.target}, which does not offer it"
                    for b in SOURCE.borrowed() if b.target.startswith("ttlib") and not b.name.startswith("__")
                    and b.name not in offered[b.target]})
    assert not wrong, ("take a name from the module that defines it (or a face that lists it in __all__); a name "
                       "another module uses is public and in its module's __all__:\n" + "\n".join(wrong))


def test_every_error_ttlib_defines_derives_from_ttliberror_and_a_builtin():
    trees = {name: tree for name, (_, tree) in SOURCE.trees.items() if name.startswith("ttlib")}
    assert "ttlib.training.checkpoint_files.CheckpointError" in error_classes(trees)  # the scan sees them
    wrong = not_ttlib_errors(trees)
    assert not wrong, ("ttlib's errors derive from ttlib.errors.TTLibError and the built-in that fits, e.g. "
                       "`class FooError(TTLibError, ValueError)`:\n" + "\n".join(wrong))
EPISODE_LOOP = "ttlib.evaluation.rollout"
OTHER_STEPPERS = {  # modules that step environments, and why that is no second episode loop
    "ttlib.data.build": "collects the course datasets with scripted pilots, recording every transition",
    "ttlib.data.examples.pendulum_dataset": "collects an example dataset with a scripted swing-up",
    "ttlib.exercises.rollouts": "records what the learner's own loop (notebook 07) does to its environments",
}
BATCH_STEPPERS = {  # modules that step rollout.EpisodeBatch one step at a time, and why
    "ttlib.evaluation.ray_evaluation": "central inference: an environment worker steps when the planner actor, "
                                       "far away, has planned",
}
VECTOR_ENVS = ("SyncVectorEnv", "AsyncVectorEnv")


def _name(node: ast.expr) -> str:
    return node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", "")


def batch_steps(tree: ast.Module) -> list[tuple[int, str]]:
    """(line, code) of every `x.act(...)` where x's last name holds "batch": an EpisodeBatch stepped by hand."""
    return sorted({(node.lineno, ast.unparse(node)) for node in ast.walk(tree)
                   if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "act"
                   and "batch" in _name(node.func.value).lower()})


def environment_steps(tree: ast.Module) -> list[tuple[int, str]]:
    """(line, code) of every call that steps an environment (`x.step(...)` where x's last name holds "env") and
    every use of gymnasium's vector environments."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "step":
            if "env" in _name(node.func.value).lower():
                found.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.Attribute) and (node.attr == "vector" or node.attr in VECTOR_ENVS):
            found.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("gymnasium.vector"):
            found.append((node.lineno, f"from {node.module} import ..."))
        elif isinstance(node, ast.Name) and node.id in VECTOR_ENVS:
            found.append((node.lineno, node.id))
    return sorted(set(found))


def test_one_episode_loop_steps_the_environments():
    loops = [f"  {path.relative_to(ROOT)}:{line} {code}" for name, (path, tree) in SOURCE.trees.items()
             if name != EPISODE_LOOP and name not in OTHER_STEPPERS for line, code in environment_steps(tree)]
    loops += [f"  {path.relative_to(ROOT)}:{line} {code}" for name, (path, tree) in SOURCE.trees.items()
              if name != EPISODE_LOOP and name not in BATCH_STEPPERS for line, code in batch_steps(tree)]
    assert not loops, ("a second episode loop: these step environments outside ttlib/evaluation/rollout.py; play the "
                       "agent with rollout.play (it follows ttlib.agents.protocol.Agent):\n" + "\n".join(loops))
    assert environment_steps(SOURCE.trees[EPISODE_LOOP][1]), "the episode loop no longer steps environments?"
    stale = sorted(set(OTHER_STEPPERS) - {n for n, (_, tree) in SOURCE.trees.items() if environment_steps(tree)})
    stale += sorted(set(BATCH_STEPPERS) - {n for n, (_, tree) in SOURCE.trees.items() if batch_steps(tree)})
    assert not stale, f"these no longer step environments: take them off OTHER_STEPPERS: {stale}"


DECODER_FIELDS = {"use_cache", "cache", "cuda_graphs", "graphs", "decoder"}  # names that would say how to decode


def config_fields(tree: ast.Module) -> dict[str, dict[str, str]]:
    """A module's dataclasses: class name -> {field: its annotation, as written}."""
    out = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and any("dataclass" in ast.unparse(d) for d in node.decorator_list):
            out[node.name] = {f.target.id: ast.unparse(f.annotation) for f in node.body
                              if isinstance(f, ast.AnnAssign) and isinstance(f.target, ast.Name)}
    return out


def test_one_field_chooses_how_the_planner_decodes():
    found = {f"{name}.{cls}.{field}": hint for name, (_, tree) in SOURCE.trees.items()
             for cls, fields in config_fields(tree).items() for field, hint in fields.items()
             if field in DECODER_FIELDS or "DecoderName" in hint}
    assert found == {"ttlib.planning.beam.PlannerConfig.decoder": "DecoderName"}, (
        f"one field chooses the decoder, PlannerConfig.decoder; found {found}")


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


def test_the_error_check_finds_an_error_outside_the_base_and_spares_warnings_and_learners_messages():
    trees = {
        "ttlib.errors": ast.parse("class TTLibError(Exception): pass\n"),
        "ttlib.a": ast.parse("from ttlib.errors import TTLibError\n"
                             "class Good(TTLibError, ValueError): pass\n"
                             "class AlsoGood(Good): pass\n"
                             "class Bare(TTLibError): pass\n"
                             "class Plain(RuntimeError): pass\n"
                             "class FromElsewhere(nbgrader.GradingException): pass\n"
                             "class Quiet(UserWarning): pass\n"
                             "class NotAnError(dict): pass\n"),
        "ttlib.exercises.x": ast.parse("class Failed(AssertionError): pass\n"),
        "ttlib.grading.y": ast.parse("class _Stop(Exception): pass\nclass Public(Exception): pass\n"),
    }
    assert set(error_classes(trees)) == {"ttlib.errors.TTLibError", "ttlib.a.Good", "ttlib.a.AlsoGood", "ttlib.a.Bare",
                                         "ttlib.a.Plain", "ttlib.a.FromElsewhere", "ttlib.a.Quiet",
                                         "ttlib.exercises.x.Failed", "ttlib.grading.y._Stop", "ttlib.grading.y.Public"}
    assert [line.split(":")[0].strip() for line in not_ttlib_errors(trees)] == [
        "ttlib.a.Bare", "ttlib.a.FromElsewhere", "ttlib.a.Plain", "ttlib.grading.y.Public"]


def test_the_boundary_check_sees_imports_attributes_and_shadowing():
    known = {"p", "p.a", "p.b"}
    code = ("import p.b\nfrom p import b as bee\nfrom p.b import _hidden, shown\nfrom . import b\n"
            "x = bee._one + p.b._two + b.three\n"
            "def f(bee):\n    return bee._not_the_module\n"
            "def g():\n    from p import b as local\n    return local._four\n")
    found = [(x.target, x.name) for x in borrowed("p.a", ast.parse(code), False, known)]
    assert sorted(found) == sorted([("p.b", "_hidden"), ("p.b", "shown"), ("p.b", "_one"), ("p.b", "_two"),
                                    ("p.b", "three"), ("p.b", "_four")])
    assert [name for _, name in found if private(name)] == ["_hidden", "_one", "_two", "_four"]
    assert not private("__version__") and private("_x")
def test_the_episode_loop_check_finds_environments_stepped_elsewhere():
    loop = ast.parse("import gymnasium as gym\nfrom gymnasium.vector import SyncVectorEnv\n"
                     "def play(agent):\n    envs = gym.vector.SyncVectorEnv([])\n"
                     "    obs = self.envs.step(agent.act(obs))\n    env.step(0)\n    vec_env.step(1)\n")
    assert [line for line, _ in environment_steps(loop)] == [2, 4, 4, 5, 6, 7]
    assert environment_steps(ast.parse("optimizer.step()\nscheduler.step()\nbatch.step(x)\nagent.step = 1\n")) == []
    by_hand = ast.parse("while batch.running.any():\n    ended = self.batch.act(policy.act(obs))\n")
    assert [line for line, _ in batch_steps(by_hand)] == [2] and batch_steps(loop) == []


def test_public_api_writes_the_public_names_and_keeps_a_faces():
    from tools import public_api

    source = ('"""Doc."""\n\nfrom p.q import shown, hidden\n\n__all__ = ["shown", "gone"]\n\nLIMIT = 3\n\n\n'
              'def run():\n    pass\n\n\ndef _helper():\n    pass\n')
    written = public_api.rewritten(source)
    assert '__all__ = ["LIMIT", "run", "shown"]\n' in written and public_api.rewritten(written) == written
    fresh = public_api.rewritten('"""Doc."""\n\nimport os\n\n\ndef f():\n    pass\n')
    assert fresh == '"""Doc."""\n\nimport os\n\n__all__ = ["f"]\n\n\ndef f():\n    pass\n'
    sets = ast.parse("from ttlib.course import threads as t\nimport torch as th\nfrom ttlib.course.threads import fit "
                     "as fit_threads\nfit_threads()\ndef f():\n    t.fit(2)\nclass A:\n    def g(self):\n"
                     "        th.set_num_threads(1)\n    def h(self):\n        t.free_cores(); fit(1)\n")
    assert thread_setters(sets) == {"<module>", "f", "A.g"}
