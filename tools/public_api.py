"""Write every ttlib module's public API, its `__all__`: the public names it defines (a def, class or assignment at
its top level, its name without a leading underscore).

    python -m tools.public_api            rewrite the __all__ of every module that lacks one or whose list differs
    python -m tools.public_api --check    list those modules and exit 1 (nothing is written)

A face -- a module that presents names of the modules behind it, as data.trajectories presents `build` and
`list_local` -- lists those names in its __all__ by hand; they are kept (a name in __all__ that the module imports).
The source is read with `ast` (nothing is imported). tests/test_structure.py checks the rules: every module has its
__all__, every name in it is the module's, and no module takes from another a name outside that one's __all__.
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def bound_names(tree: ast.Module) -> tuple[list[str], set[str]]:
    """(names the module defines at its top level, in order; names it imports there)."""
    defined, imported = [], set()

    def visit(body):
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                defined.append(node.name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                defined.extend(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                imported.update((a.asname or a.name).split(".")[0] for a in node.names)
            elif isinstance(node, ast.If) and "TYPE_CHECKING" not in ast.unparse(node.test):
                visit(node.body + node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body + [n for h in node.handlers for n in h.body] + node.orelse + node.finalbody)

    visit(tree.body)
    return list(dict.fromkeys(defined)), imported


def declared(tree: ast.Module) -> tuple[ast.stmt | None, list[str] | None]:
    """The module's `__all__ = [...]` statement and its names (None, None without one)."""
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) \
            else []
        if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
            return node, list(ast.literal_eval(node.value)) if node.value is not None else []
    return None, None


def public_api(tree: ast.Module) -> list[str]:
    """What the module's __all__ should be: its public names, and the names of a face's __all__ it imports."""
    defined, imported = bound_names(tree)
    _, names = declared(tree)
    presented = [n for n in names or [] if n in imported and n not in defined]
    return sorted({n for n in defined if not n.startswith("_")} | set(presented))


def render(names: list[str], width: int = 120) -> str:
    if not names:
        return "__all__: list[str] = []\n"
    lines, line = [], "__all__ = ["
    for i, name in enumerate(names):
        piece = f'"{name}"' + ("]" if i == len(names) - 1 else ",")
        if len(line) + len(piece) + 1 > width:
            lines.append(line.rstrip())
            line = " " * len("__all__ = [")
        line += piece + " "
    return "\n".join(lines + [line.rstrip()]) + "\n"


def rewritten(text: str) -> str:
    """The module's source with its __all__ written: in the place of the old one, else after its imports."""
    tree = ast.parse(text)
    lines = text.splitlines(keepends=True)
    block = render(public_api(tree))
    node, _ = declared(tree)
    if node is not None:
        return "".join(lines[:node.lineno - 1] + [block] + lines[node.end_lineno:])
    end = 0  # after the docstring, the imports and any `if TYPE_CHECKING:` block at the top
    for i, node in enumerate(tree.body):
        docstring = i == 0 and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
        if not (docstring or isinstance(node, (ast.Import, ast.ImportFrom))
                or (isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test))):
            break
        end = node.end_lineno
    before, after = "".join(lines[:end]).rstrip("\n"), "".join(lines[end:]).lstrip("\n")
    gap = "\n\n" if after.startswith(("def ", "class ", "@", "#")) else "\n"
    return (before + "\n\n" if before else "") + block + (gap + after if after else "")


def modules() -> list[Path]:
    return sorted((ROOT / "ttlib").rglob("*.py"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="list the modules to rewrite, write nothing")
    args = parser.parse_args(argv)
    stale = []
    for path in modules():
        text = path.read_text(encoding="utf-8")
        new = rewritten(text)
        if new != text:
            stale.append(path.relative_to(ROOT))
            if not args.check:
                path.write_text(new, encoding="utf-8")
    for path in stale:
        print(f"{path}: {'__all__ out of date' if args.check else 'rewritten'}")
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
