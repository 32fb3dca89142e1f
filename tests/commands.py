"""Running the `ttlib` command in tests, two ways.

- `ttlib(...)`: as a command of its own, `python -m ttlib ...` in a fresh process -- what a terminal shows, imports
  and all (a few CPU seconds each, most of them importing PyTorch);
- `in_process(...)`: the same command through `ttlib.cli.main.main`, the function `python -m ttlib` calls, in the
  test's process, with its output captured and warnings shown as a terminal shows them (Python's default filters),
  for the many checks of one command's options: each costs what the check costs, not the imports.

A test file that checks many bad inputs runs one of them as a command of its own, the rest in process.
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
import warnings
from unittest import mock

from ttlib.cli.main import main

QUIET_BY_DEFAULT = (DeprecationWarning, PendingDeprecationWarning, ImportWarning, ResourceWarning)  # Python hides
# these outside __main__ unless asked (-W, -X dev); everything else prints to stderr, once per place


def ttlib(*args, env=None, timeout=300) -> subprocess.CompletedProcess:
    """`python -m ttlib *args` in a fresh process, one torch thread (as under pytest-xdist)."""
    return subprocess.run([sys.executable, "-m", "ttlib", *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})


def in_process(*args, env: dict | None = None, cwd=None) -> subprocess.CompletedProcess:
    """`ttlib *args` through its main function in this process: (exit status, stdout, stderr) as the command
    would give them. `env` (the whole environment, as subprocess takes it) and `cwd` hold while it runs."""
    stdout, stderr = io.StringIO(), io.StringIO()
    environment = contextlib.nullcontext() if env is None else mock.patch.dict(os.environ, env, clear=True)
    with warnings.catch_warnings(record=True) as caught, environment, folder(cwd):
        warnings.resetwarnings()
        for category in QUIET_BY_DEFAULT:
            warnings.filterwarnings("ignore", category=category)
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            try:
                code = main(list(args))
            except SystemExit as e:  # argparse's own errors (usage, exit 2)
                code = e.code if isinstance(e.code, int) else 1
    shown = "".join(warnings.formatwarning(w.message, w.category, w.filename, w.lineno, w.line) for w in caught)
    return subprocess.CompletedProcess(["ttlib", *args], code, stdout.getvalue(), shown + stderr.getvalue())


@contextlib.contextmanager
def folder(path):
    """The current folder is `path` inside (None: left alone)."""
    saved = os.getcwd()
    os.chdir(path or saved)
    try:
        yield
    finally:
        os.chdir(saved)


def one_line_error(result: subprocess.CompletedProcess, *parts) -> str:
    """The command failed (exit 2) with exactly one line on stderr that holds every part; -> that line."""
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr[-2000:]
    for part in parts:
        assert part in lines[0], lines[0]
    return lines[0]
