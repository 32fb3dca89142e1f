"""Colab: the badges and the set-up cell, written from the one place that names the course's repository.

The repository is named once, in pyproject.toml (`[project.urls] Repository`). Every notebook opens with a Colab
badge linking to its own path in that repository, its set-up cell installs ttlib from it when it runs on Colab,
and the README has a table of badges; all three are written from pyproject.toml by this module:

    python -m tools.colab            # rewrite the badges, the set-up cells and the README table
    python -m tools.colab --check    # list what is out of step with pyproject.toml, exit 1 if anything is

The tests run the check, so a changed repository (or a new notebook) cannot be forgotten in one place.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from ttlib.course.notebooks import NOTEBOOKS

ROOT = Path(__file__).resolve().parents[1]  # the repository checkout this module lives in


# what a notebook's set-up cell installs beyond ttlib itself (Colab has torch, numpy and matplotlib, not Ray)
EXTRAS = {"08_scaling_out_with_ray.ipynb": "[ray]"}

BADGE_IMAGE = "https://colab.research.google.com/assets/colab-badge.svg"
BADGE = re.compile(r"\[!\[Open In Colab\]\([^)]*\)\]\(https://colab\.research\.google\.com/github/[^)]*\)")
TABLE_START, TABLE_END = "<!-- colab-badges: start -->", "<!-- colab-badges: end -->"

# The set-up cell, the same in every notebook but for the extras it installs. It cannot import ttlib (that is what
# it installs), so the repository is written into it. The course is cloned rather than pip-installed from git so that
# the shipped checkpoints in assets/ come too (TTLIB_ASSETS points ttlib at them). TTLIB_CHECKOUT moves the clone
# (tests/test_colab.py runs this cell for real, outside Colab).
SETUP_CELL = '''\
# Colab only: fetch the course from its repository and install ttlib, the course library. Locally ttlib is
# already installed (`pip install -e .` in the repository), and this cell does nothing.
import os
import subprocess
import sys

REPO = os.environ.get("TTLIB_REPO", "{repo}")  # the course's GitHub owner/name

if "google.colab" in sys.modules and not REPO:
    print('Set REPO above to the GitHub owner/name of the course repository, e.g. REPO = "your-name/tt-course",\\n'
          "and run this cell again.")
elif "google.colab" in sys.modules:
    checkout = os.environ.get("TTLIB_CHECKOUT", "/content/" + REPO.split("/")[-1])
    clone = ["git", "clone", "-q", "--depth", "1", f"https://github.com/{{REPO}}", checkout]
    install = [sys.executable, "-m", "pip", "install", "-q", checkout + "{extras}"]
    for step in ([] if os.path.isdir(checkout) else [clone]) + [install]:
        result = subprocess.run(step, capture_output=True, text=True, env={{**os.environ, "GIT_TERMINAL_PROMPT": "0"}})
        if result.returncode != 0:
            print(f"Could not install ttlib from https://github.com/{{REPO}} -- is that the repository this\\n"
                  'notebook came from? Set REPO above to its GitHub owner/name, e.g. REPO = "your-name/tt-course",\\n'
                  "and run this cell again. The error was:\\n" + result.stderr[-800:])
            break
    else:
        os.environ["TTLIB_ASSETS"] = os.path.join(checkout, "assets")  # the shipped checkpoint
        print(f"installed ttlib from https://github.com/{{REPO}}")'''


def repository(root: Path = ROOT) -> str:
    """The course repository's GitHub owner/name, from pyproject.toml's `[project.urls] Repository`."""
    text = (root / "pyproject.toml").read_text()
    match = re.search(r'^Repository\s*=\s*"https://github\.com/([\w.-]+/[\w.-]+?)(?:\.git)?/?"', text, re.M)
    if match is None:
        raise ValueError(f"{root / 'pyproject.toml'}: set the course repository under [project.urls], e.g.\n"
                         'Repository = "https://github.com/your-name/tt-course"')
    return match.group(1)


def colab_url(repo: str, path: str) -> str:
    """Colab's address of notebooks/<path> in the repository's main branch."""
    return f"https://colab.research.google.com/github/{repo}/blob/main/notebooks/{path}"


def badge(repo: str, path: str) -> str:
    return f"[![Open In Colab]({BADGE_IMAGE})]({colab_url(repo, path)})"


def setup_cell(repo: str, name: str = "") -> str:
    return SETUP_CELL.format(repo=repo, extras=EXTRAS.get(name, ""))


def badge_table(repo: str) -> str:
    """The README's table: learners open the student version (exercises left to do); the solution is one link away."""
    rows = [f"| {name[:2]} | {title} | {badge(repo, 'student/' + name)} | [solution]({colab_url(repo, name)}) |"
            for name, title in NOTEBOOKS.items()]
    header = ["| # | notebook | open it on Colab (student version) | instructors |", "|---|---|---|---|"]
    return "\n".join([*header, *rows])


def synced_notebook(text: str, name: str, repo: str) -> str:
    """A notebook's JSON with its badge and its set-up cell (the cell tagged 'setup') written from `repo`."""
    import nbformat

    nb = nbformat.reads(text, as_version=4)
    title = nb.cells[0]
    if len(BADGE.findall(title.source)) != 1:
        raise ValueError(f"{name}: the first cell needs exactly one Colab badge: {badge(repo, name)}")
    title.source = BADGE.sub(lambda _: badge(repo, name), title.source)
    setups = [c for c in nb.cells if c.cell_type == "code" and "setup" in c.metadata.get("tags", [])
              and "google.colab" in c.source]  # the Colab cell (the imports and settings are tagged 'setup' too)
    if len(setups) != 1:
        raise ValueError(f"{name}: needs exactly one code cell tagged 'setup' that installs on Colab (found "
                         f"{len(setups)})")
    setups[0].source = setup_cell(repo, name)
    return nbformat.writes(nb) + "\n"


def synced_readme(text: str, repo: str) -> str:
    if TABLE_START not in text or TABLE_END not in text:
        raise ValueError(f"README.md: put {TABLE_START} and {TABLE_END} where the table of Colab badges goes")
    before, rest = text.split(TABLE_START, 1)
    after = rest.split(TABLE_END, 1)[1]
    return f"{before}{TABLE_START}\n{badge_table(repo)}\n{TABLE_END}{after}"


def sync(root: Path = ROOT, write: bool = True) -> list[str]:
    """Bring badges, set-up cells and the README table in step with pyproject.toml; return what was (or would be)
    changed. Raises ValueError for a notebook missing from NOTEBOOKS."""
    repo = repository(root)
    changed = []
    for path in sorted((root / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        if path.name not in NOTEBOOKS:
            raise ValueError(f"{path.name} is not in ttlib/course/notebooks.py's NOTEBOOKS: add it (name and title)")
        text = path.read_text()
        new = synced_notebook(text, path.name, repo)
        if new != text:
            changed.append(f"notebooks/{path.name}")
            if write:
                path.write_text(new)
    readme = root / "README.md"
    text = readme.read_text()
    new = synced_readme(text, repo)
    if new != text:
        changed.append("README.md")
        if write:
            readme.write_text(new)
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.colab", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if anything is out of step")
    parser.add_argument("--root", type=Path, default=ROOT, help="the repository checkout (default: this one)")
    args = parser.parse_args(argv)
    try:
        changed = sync(args.root, write=not args.check)
    except (OSError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    verb = "out of step with pyproject.toml" if args.check else "rewritten"
    for path in changed:
        print(f"{verb}: {path}")
    if not changed:
        print(f"everything names {repository(args.root)}")
    return 1 if args.check and changed else 0


if __name__ == "__main__":
    sys.exit(main())
