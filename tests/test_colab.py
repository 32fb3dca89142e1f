"""Colab: every badge, set-up cell and the README's table name the one repository in pyproject.toml, and the set-up
cell fails politely (it says what to set) when that repository is unset or cannot be reached."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from ttlib import colab

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def test_badges_setup_cells_and_readme_agree_with_pyproject():
    assert colab.sync(ROOT, write=False) == [], "out of step with pyproject.toml: run `python -m ttlib.colab`"
    assert subprocess.run([sys.executable, "-m", "ttlib.colab", "--check"], cwd=ROOT, capture_output=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}).returncode == 0


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_badge_opens_the_notebook_itself_and_setup_names_the_same_repository(path):
    repo = colab.repository(ROOT)
    cells = nbformat.read(path, as_version=4).cells
    links = re.findall(r"\]\((https://colab\.research\.google\.com/github/[^)]+)\)", cells[0].source)
    assert links == [f"https://colab.research.google.com/github/{repo}/blob/main/notebooks/{path.name}"]
    assert f'os.environ.get("TTLIB_REPO", "{repo}")' in cells[1].source


def test_readme_has_a_badge_for_every_notebook_00_to_08():
    readme = (ROOT / "README.md").read_text()
    table = readme.split(colab.TABLE_START)[1].split(colab.TABLE_END)[0]
    numbers = re.findall(r"^\| (\d\d) \|.*colab-badge\.svg.*/notebooks/(\d\d)_[\w.-]+\.ipynb\) \|$", table, re.M)
    assert [a for a, b in numbers if a == b] == [f"{i:02d}" for i in range(9)]
    for path in NOTEBOOKS:
        assert f"/notebooks/{path.name})" in table, f"{path.name} has no badge in the README"


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
    with pytest.raises(ValueError, match="99_new_notebook.ipynb is not in ttlib/colab.py's NOTEBOOKS"):
        colab.sync(tmp_path, write=False)
