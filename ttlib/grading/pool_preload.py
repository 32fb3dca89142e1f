"""Imported once, by the fork server that the pool processes of `ttlib grade autograde` are forked from
(`layouts.on_this_machine`): the libraries every pool process needs -- those its zygote shares with the hidden
tests and kernels (PyTorch, IPython, ttlib: `zygote.PRELOAD`) and nbgrader's. A pool of N processes then pays for
these imports once instead of N times (about 8 CPU seconds each), and its processes share the pages they fill.
Imported by that fork server only: importing it ties the importing process's life to its parent's."""

import signal

from ttlib.grading.linux import LINUX, PR_SET_PDEATHSIG, prctl
from ttlib.grading.worker import skip_unused_imports

__all__: list[str] = []

if LINUX:  # the fork server ends with the grading process that started it, and the pool processes (its children,
    prctl(PR_SET_PDEATHSIG, signal.SIGTERM)  # each with the same setting) with it: even a killed grader leaves none
skip_unused_imports()  # before nbgrader is imported

from nbgrader.converters import Autograde  # noqa: E402, F401 (what grade_one imports)
from traitlets.config import Config  # noqa: E402, F401

import ttlib.grading.plugins  # noqa: E402, F401 (the course's nbgrader configuration loads it)
from ttlib.grading.zygote import preload_libraries  # noqa: E402

preload_libraries()
