"""`ttlib lab` -- the README's first command -- opens the student notebooks in JupyterLab without nbgrader's
instructor tools; `jupyter lab` from the repository root (what instructors run) still has them.

Both servers run for real on 127.0.0.1 with no token; what the browser would load is read over HTTP: the page
config's disabled extensions, nbgrader's Formgrader page, and the folder the file browser shows.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from test_browser import free_port, stop, wait_for_server  # tests/ is on sys.path under pytest

ROOT = Path(__file__).resolve().parents[1]
NO_TOKEN = ["--no-browser", "--ip=127.0.0.1", "--ServerApp.port_retries=0", "--ServerApp.token=",
            "--IdentityProvider.token=", "--ServerApp.password=", "--LabApp.news_url=None",
            "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"]


def status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


def disabled_extensions(url: str) -> list[str]:
    with urllib.request.urlopen(url + "lab", timeout=30) as response:
        page = response.read().decode()
    config = json.loads(re.search(r'<script id="jupyter-config-data" type="application/json">(.*?)</script>',
                                  page, re.S).group(1))
    disabled = config.get("disabledExtensions", [])
    return list(disabled) if isinstance(disabled, (list, dict)) else []


def serve(command: list[str], tmp_path: Path, name: str):
    port = free_port()
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(tmp_path / f"{name}-config"),
           "JUPYTER_RUNTIME_DIR": str(tmp_path / f"{name}-runtime"),
           "JUPYTERLAB_SETTINGS_DIR": str(tmp_path / f"{name}-settings")}
    extra = ["--allow-root"] if hasattr(os, "geteuid") and os.geteuid() == 0 else []
    log = tmp_path / f"{name}.log"
    with open(log, "w") as out:
        process = subprocess.Popen([*command, f"--port={port}", *NO_TOKEN, *extra], cwd=ROOT, env=env, stdout=out,
                                   stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/"
    wait_for_server(url, process, log)
    return process, url


def test_learners_get_the_student_notebooks_without_instructor_tools(tmp_path):
    start = time.monotonic()
    learner, url = serve([sys.executable, "-m", "ttlib", "lab"], tmp_path, "learner")
    try:
        assert "@jupyter/nbgrader" in disabled_extensions(url)
        assert status(url + "formgrader") == 404, "no Formgrader for learners"
        with urllib.request.urlopen(url + "api/contents", timeout=30) as response:
            names = {item["name"] for item in json.load(response)["content"]}
        assert "01_attention.ipynb" in names and "conftest.py" not in names and "student" not in names
    finally:
        stop(learner)
    with pytest.raises(urllib.error.URLError):  # stopping `ttlib lab` stopped its server: none is left behind
        urllib.request.urlopen(url + "api", timeout=10)
    instructor, url = serve([sys.executable, "-m", "jupyter", "lab"], tmp_path, "instructor")
    try:
        assert "@jupyter/nbgrader" not in disabled_extensions(url)
        assert status(url + "formgrader") == 200, "instructors keep nbgrader's Formgrader"
    finally:
        stop(instructor)
    print(f"both servers: {time.monotonic() - start:.1f} s")
