"""Shared pytest fixtures."""

import os

import pytest
import torch

# Under pytest-xdist every worker is its own process: two workers with two OpenMP threads each on two cores
# spin-wait on each other and run many times slower. One thread per worker keeps the cores busy, not fighting;
# the notebook kernels nbval starts from a worker inherit the setting through the environment.
if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)
    os.environ["OMP_NUM_THREADS"] = "1"


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
