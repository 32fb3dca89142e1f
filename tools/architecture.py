"""Draw which of ttlib's rooms (subpackages) imports which, into docs/ARCHITECTURE.md.

    python -m tools.architecture            rewrite the picture between the file's markers
    python -m tools.architecture --check    exit 1 if the picture is out of date (the tests run this)

The picture is a Mermaid diagram (GitHub and JupyterLab render it): one box per room, an arrow from a room to each
room its modules import, read from the source with `ast` (nothing is imported). Imports inside functions count; those
under `if TYPE_CHECKING:` do not, as they never run.
"""

from __future__ import annotations

import argparse
import ast
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "ARCHITECTURE.md"
BEGIN, END = "<!-- rooms: begin (python -m tools.architecture) -->", "<!-- rooms: end -->"


def room_of(module: str) -> str:
    """ttlib.planning.beam -> planning; ttlib.files -> files (a top-level module is a room of its own)."""
    return module.split(".")[1]


def imported_modules(tree: ast.Module) -> set[str]:
    """Every ttlib module a parsed module imports, wherever the import stands, except under TYPE_CHECKING."""
    found = set()

    def visit(node):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue
            if isinstance(child, ast.Import):
                found.update(a.name for a in child.names if a.name.startswith("ttlib."))
            elif isinstance(child, ast.ImportFrom) and child.level == 0 and (child.module or "").startswith("ttlib."):
                found.add(child.module)
            visit(child)

    visit(tree)
    return found


def room_edges() -> dict[str, set[str]]:
    """room -> the other rooms its modules import."""
    edges: dict[str, set[str]] = {}
    for path in sorted((ROOT / "ttlib").rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if len(parts) < 2 or parts[1] in {"__init__", "__main__"}:
            continue
        source = parts[1]
        tree = ast.parse(path.read_text(encoding="utf-8"))
        targets = {room_of(m) for m in imported_modules(tree)} - {source}
        edges.setdefault(source, set()).update(targets)
    return edges


def diagram() -> str:
    edges = room_edges()
    lines = ["```mermaid", "flowchart TD"]
    for room in sorted(edges):
        lines.append(f"    {room}[{room}/]" if (ROOT / "ttlib" / room).is_dir() else f"    {room}[{room}.py]")
    for room in sorted(edges):
        lines += [f"    {room} --> {target}" for target in sorted(edges[room])]
    return "\n".join(lines + ["```"])


def updated(text: str) -> str:
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{DOC}: the markers {BEGIN} and {END} are missing")
    head, rest = text.split(BEGIN, 1)
    return head + BEGIN + "\n" + diagram() + "\n" + END + rest.split(END, 1)[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.architecture", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if docs/ARCHITECTURE.md's picture is stale")
    args = parser.parse_args(argv)
    text = DOC.read_text(encoding="utf-8")
    new = updated(text)
    if args.check:
        print("up to date" if new == text else f"{DOC.relative_to(ROOT)}: stale, run python -m tools.architecture")
        return 0 if new == text else 1
    if new != text:
        tmp = DOC.with_suffix(".md.tmp")
        tmp.write_text(new, encoding="utf-8")
        os.replace(tmp, DOC)
    print(f"{DOC.relative_to(ROOT)}: {'rewritten' if new != text else 'up to date'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
