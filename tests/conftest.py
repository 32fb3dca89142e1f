"""Shared pytest fixtures, and the record of how long the README's whole test command took (tools/suite_time.py)."""

import os
import time
from pathlib import Path

import pytest
import torch

from tools import suite_time
from ttlib.course import threads

# Under pytest-xdist every worker is its own process: two workers with two OpenMP threads each on two cores
# spin-wait on each other and run many times slower. One thread per worker keeps the cores busy, not fighting;
# the notebook kernels nbval starts from a worker inherit the setting through the environment.
# In one process, the session is the entry point that fits torch's threads to the cores others leave free (ttlib's
# library never changes them: ttlib.course.threads).
if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)
    os.environ["OMP_NUM_THREADS"] = "1"
else:
    threads.fit()


@pytest.fixture(scope="session")
def device():
    """Where the tests marked `exactness` run: the CPU, unless TTLIB_TEST_DEVICE names another device --
    tools/gpu-check runs them there (`cuda`), so that the claims of docs/RESULTS.md's "What is exact" are checked
    on the GPU by these very tests."""
    name = os.environ.get("TTLIB_TEST_DEVICE", "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        pytest.fail(f"TTLIB_TEST_DEVICE={name}, but PyTorch sees no CUDA device")
    return torch.device(name)


@pytest.fixture
def minari_root(tmp_path, monkeypatch):
    """An empty Minari datasets folder for one test, so tests never touch ~/.minari/datasets."""
    root = tmp_path / "minari-datasets"
    root.mkdir()
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(root))
    return root


# The files that take longest (docs/TESTING.md's whole run), run first. Under `--dist loadfile` pytest-xdist hands a
# worker the next file, in collection order, when the file it runs is nearly done: long files started early leave
# short ones to fill the end, instead of one long file running alone on one core while the other idles. Order
# only: every test runs either way. (pytest-xdist would order the files by their number of tests; pytest_configure
# turns that off, as its --no-loadscope-reorder does.)
SLOWEST_FIRST = [  # every file of 40 s or more in the measured run (docs/TESTING.md), longest first
    "tests/test_grading.py", "tests/test_browser.py", "notebooks/08_scaling_out_with_ray.ipynb",
    "tests/test_distributed.py", "tests/test_grading_sandbox.py", "tests/test_exercises.py",
    "notebooks/06_critic.ipynb", "tests/test_data_parallel.py", "tests/test_sandbox.py", "tests/test_cli.py",
    "tests/test_gpu_check.py", "notebooks/07_vectorized_rollouts.ipynb", "notebooks/03_trajectory_gpt.ipynb",
    "tests/test_challenge.py", "notebooks/10_beat_pbc.ipynb", "tests/test_user_datasets.py", "tests/test_critic.py",
    "tests/test_data.py", "notebooks/09_decision_transformer.ipynb",
    "notebooks/00_offline_rl_as_sequence_modeling.ipynb", "notebooks/05_beam_search.ipynb", "tests/test_train.py",
    "tests/test_baselines.py"]


def pytest_configure(config):
    if getattr(config.option, "loadscopereorder", None):  # pytest-xdist's scheduler reads it when it starts
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(session, config, items):
    rank = {name: i for i, name in enumerate(SLOWEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))  # stable: the rest as collected


_STARTED = pytest.StashKey[tuple]()  # (when the session started, the 1-minute load average then)


def pytest_sessionstart(session):
    session.config.stash[_STARTED] = (time.monotonic(), os.getloadavg()[0])


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """After the README's whole command (not in pytest-xdist's workers): its time beside the README's figure, and,
    when every test passed, the run recorded in pytest's cache (tools/suite_time.py judges it)."""
    if hasattr(config, "workerinput") or _STARTED not in config.stash:
        return
    other = any(config.getoption(name, None) for name in ("keyword", "markexpr", "deselect", "lf", "maxfail",
                                                         "collectonly")) or not (
        config.getoption("nbval_lax", False) and config.getoption("numprocesses", None) == 2
        and config.getoption("dist", None) == "loadfile")  # not the README's command: not its time either
    if not suite_time.is_whole_run(config.args, Path(config.invocation_params.dir), other):
        return
    started, load = config.stash[_STARTED]
    run = suite_time.record(time.monotonic() - started, len(terminalreporter.stats.get("passed", [])), load)
    if exitstatus == 0 and run["passed"]:
        config.cache.set(suite_time.CACHE_KEY, run)
    terminalreporter.write_line(suite_time.verdict(run, *suite_time.readme_claim())[1])
