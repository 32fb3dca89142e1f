"""Colab: every badge, set-up cell and the README's table name the one repository in pyproject.toml, and the set-up
cell fails politely (it says what to set) when that repository is unset or cannot be reached."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import nbformat
import pytest

from tools import colab

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def test_badges_setup_cells_and_readme_agree_with_pyproject():
    assert colab.sync(ROOT, write=False) == [], "out of step with pyproject.toml: run `python -m tools.colab`"
    assert subprocess.run([sys.executable, "-m", "tools.colab", "--check"], cwd=ROOT, capture_output=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}).returncode == 0


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_badge_opens_the_notebook_itself_and_setup_names_the_same_repository(path):
    repo = colab.repository(ROOT)
    cells = nbformat.read(path, as_version=4).cells
    links = re.findall(r"\]\((https://colab\.research\.google\.com/github/[^)]+)\)", cells[0].source)
    assert links == [f"https://colab.research.google.com/github/{repo}/blob/main/notebooks/{path.name}"]
    assert f'os.environ.get("TTLIB_REPO", "{repo}")' in cells[1].source


def test_readme_badges_open_the_student_versions_and_link_the_solutions():
    readme = (ROOT / "README.md").read_text()
    table = readme.split(colab.TABLE_START)[1].split(colab.TABLE_END)[0]
    rows = re.findall(r"^\| (\d\d) \|.*colab-badge\.svg\)\]\([^)]*/notebooks/student/(\d\d)_[\w.-]+\.ipynb\) \| "
                      r"\[solution\]\([^)]*/notebooks/(\d\d)_[\w.-]+\.ipynb\) \|$", table, re.M)
    assert [a for a, b, c in rows if a == b == c] == [f"{i:02d}" for i in range(len(NOTEBOOKS))]
    for path in NOTEBOOKS:
        assert f"/notebooks/student/{path.name})" in table, f"{path.name}: no badge for its student version"
        assert (ROOT / "notebooks" / "student" / path.name).is_file(), f"{path.name} has no student version"


def test_the_ray_notebook_installs_ray_on_colab():
    """Colab has torch and numpy preinstalled, not Ray: the set-up cell of a notebook that uses Ray installs the
    ray extra, and only there."""
    for path in NOTEBOOKS:
        cells = nbformat.read(path, as_version=4).cells
        uses_ray = "RayEvaluator" in "".join(c.source for c in cells[2:] if c.cell_type == "code")
        assert ('checkout + "[ray]"' in cells[1].source) == uses_ray, path.name


def test_the_colab_path_for_real(tmp_path):
    """What Colab does, here: a notebook run from a folder outside the repository, in a fresh virtual environment
    without ttlib, on a machine where `google.colab` is importable. Its set-up cell clones the course (git's URL
    rewrite points github.com at a copy of this working tree), installs it *non-editably* and points TTLIB_ASSETS at
    the clone; then the notebook's own cell loads the shipped checkpoint, and every module of the repository's
    ttlib imports from the installed copy (a package left out of pyproject.toml's list fails only there). The rest
    of the notebook is what nbval runs. The fresh venv borrows this environment's other packages through a .pth
    file, so only ttlib is installed (PIP_NO_DEPS)."""
    repo = colab.repository(ROOT)
    source = tmp_path / "github" / repo  # a git repository holding this working tree, as GitHub would serve it
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True,
                           text=True, check=True).stdout.split()
    for name in files:
        if (ROOT / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, source / name)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(source)]
    for step in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "course"]):
        subprocess.run(git + step, check=True, capture_output=True)

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                          capture_output=True, text=True, check=True).stdout.strip()
    Path(site, "borrowed.pth").write_text(sysconfig.get_path("purelib") + "\n")
    fake = tmp_path / "fake" / "google" / "colab"  # `"google.colab" in sys.modules` is how the cell knows
    fake.mkdir(parents=True)
    (fake.parent / "__init__.py").write_text("")
    (fake / "__init__.py").write_text("")

    name = "07_vectorized_rollouts.ipynb"
    work = tmp_path / "content"
    work.mkdir()
    nb = nbformat.read(ROOT / "notebooks" / name, as_version=4)
    nb.cells[1].source = "import google.colab\n" + nb.cells[1].source
    setup = [c for c in nb.cells if c.cell_type == "code" and "setup" in c.metadata.get("tags", [])]
    loads = [c for c in nb.cells if c.cell_type == "code" and "default_checkpoint()" in c.source][:1]
    modules = sorted(".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
                     for p in (ROOT / "ttlib").rglob("*.py") if p.name != "__main__.py")
    nb.cells = [*setup, *loads, nbformat.v4.new_code_cell(
        f"import importlib, os, ttlib\nfor module in {modules!r}:\n    importlib.import_module(module)\n"
        "print('ttlib from', ttlib.__file__)\nprint('assets', os.environ['TTLIB_ASSETS'])")]
    assert nb.cells[0].source.startswith("import google.colab") and len(loads) == 1
    nbformat.write(nb, work / name)
    runner = ("import sys, nbformat, nbclient\n"
              "nb = nbformat.read(sys.argv[1], as_version=4)\n"
              "nbclient.NotebookClient(nb, timeout=600, kernel_name='python3',\n"
              "                        resources={'metadata': {'path': sys.argv[2]}}).execute()\n"
              "nbformat.write(nb, sys.argv[1])\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "fake"), "TTLIB_REPO": repo, "PIP_NO_DEPS": "1",
           "TTLIB_CHECKOUT": str(tmp_path / "checkout"), "TTLIB_FAST": "1", "GIT_CONFIG_COUNT": "1",
           "GIT_CONFIG_KEY_0": f"url.{tmp_path / 'github'}/.insteadOf", "GIT_CONFIG_VALUE_0": "https://github.com/"}
    env.pop("TTLIB_ASSETS", None)
    env.pop("VIRTUAL_ENV", None)
    result = subprocess.run([str(python), "-c", runner, str(work / name), str(work)], cwd=work, env=env,
                            capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    ran = nbformat.read(work / name, as_version=4)
    printed = lambda cell: "".join(o.get("text", "") for o in cell.outputs)  # noqa: E731
    assert "installed ttlib from https://github.com/" in printed(ran.cells[0]), printed(ran.cells[0])
    last = printed(ran.cells[-1])
    assert f"ttlib from {site}" in last, last  # the installed copy, not the repository's
    assert f"assets {tmp_path / 'checkout' / 'assets'}" in last, last


def test_no_cell_needs_a_display():
    for path in NOTEBOOKS:
        code = "\n".join(c.source for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code")
        for needs_a_screen in ("Xvfb", "pyvirtualdisplay", "DISPLAY", 'render_mode="human"', "plt.ion("):
            assert needs_a_screen not in code, f"{path.name}: {needs_a_screen} needs a display"


def run_setup_cell_on_fake_colab(tmp_path, repo: str) -> subprocess.CompletedProcess:
    """The set-up cell as Colab runs it (a `google.colab` module is loaded), with git unable to reach GitHub:
    https://github.com/ is redirected to a folder that does not exist, so nothing is fetched or installed."""
    fake = tmp_path / "fake" / "google"
    (fake / "colab").mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "colab" / "__init__.py").write_text("")
    cell = colab.setup_cell(colab.repository(ROOT))
    program = f"import google.colab\n{cell}\n"
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "fake"), "TTLIB_REPO": repo, "GIT_CONFIG_COUNT": "1",
           "GIT_CONFIG_KEY_0": f"url.{tmp_path / 'nowhere'}/.insteadOf", "GIT_CONFIG_VALUE_0": "https://github.com/"}
    return subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, env=env, timeout=120)


def test_setup_cell_without_a_repository_says_what_to_set(tmp_path):
    result = run_setup_cell_on_fake_colab(tmp_path, "")
    assert result.returncode == 0, result.stderr
    assert "Set REPO above" in result.stdout


def test_setup_cell_with_an_unreachable_repository_says_what_to_set(tmp_path):
    missing = "nobody-here/no-such-course-repository"
    result = run_setup_cell_on_fake_colab(tmp_path, missing)
    assert result.returncode == 0, result.stderr
    assert f"Could not install ttlib from https://github.com/{missing}" in result.stdout
    assert "Set REPO above" in result.stdout and "installed ttlib" not in result.stdout
    assert not Path("/content", missing.split("/")[1]).exists()


def test_repository_missing_from_pyproject_is_a_clear_error(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "ttlib"\n')
    with pytest.raises(ValueError, match=r"\[project.urls\]"):
        colab.repository(tmp_path)


def test_a_notebook_missing_from_the_table_is_a_clear_error(tmp_path):
    (tmp_path / "notebooks").mkdir()
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    shutil.copy(NOTEBOOKS[0], tmp_path / "notebooks" / "99_new_notebook.ipynb")
    with pytest.raises(ValueError, match="99_new_notebook.ipynb is not in ttlib/course/notebooks.py's NOTEBOOKS"):
        colab.sync(tmp_path, write=False)
