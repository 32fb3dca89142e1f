"""`ttlib lab`: JupyterLab as a learner meets it -- the student notebooks, and no instructor tools.

nbgrader comes with the course's dev extra (the tests grade submissions with it), and it adds its Formgrader,
Validate button, Nbgrader menu and Create Assignment panel to every JupyterLab in that environment. A learner has no
use for them, so `ttlib lab` starts JupyterLab with the configuration in `learner_jupyter/` first on
JUPYTER_CONFIG_PATH: nbgrader's lab extension and server extensions off, for this server only. Instructors start
`jupyter lab` from the repository's root as usual and have all of nbgrader.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from ttlib.errors import UnavailableError

__all__ = ["LEARNER_CONFIG", "course_notebooks", "learner_env", "main"]

LEARNER_CONFIG = Path(__file__).resolve().parent / "learner_jupyter"


def course_notebooks() -> Path:
    """notebooks/student/ of the repository this ttlib was installed from (pip install -e)."""
    repo = Path(__file__).resolve().parents[2]
    student = repo / "notebooks" / "student"
    if not student.is_dir():
        raise UnavailableError(f"no notebooks/student/ next to ttlib in {repo}: `ttlib lab` opens the course from "
                               "a clone of its repository (python -m pip install -e . there)")
    return student


def learner_env(env: dict | None = None) -> dict:
    """The environment of a learner's JupyterLab: the learner configuration before any other."""
    env = dict(os.environ if env is None else env)
    env["JUPYTER_CONFIG_PATH"] = os.pathsep.join(filter(None, [str(LEARNER_CONFIG), env.get("JUPYTER_CONFIG_PATH")]))
    return env


def main(extra: list[str]) -> int:
    """Run JupyterLab on the student notebooks until it is stopped; `extra` goes to `jupyter lab` as it is."""
    root = course_notebooks()
    command = [sys.executable, "-m", "jupyterlab", f"--ServerApp.root_dir={root}", *extra]
    print(f"JupyterLab on {root} (the exercises are yours to fill in; stop it with Ctrl-C)", flush=True)
    if os.name == "posix":  # JupyterLab takes this process's place: whatever stops `ttlib lab` stops the server
        os.execve(sys.executable, command, learner_env())
    try:
        return subprocess.call(command, env=learner_env())
    except KeyboardInterrupt:
        return 130
