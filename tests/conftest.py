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


@pytest.fixture
def minari_root(tmp_path, monkeypatch):
    """An empty Minari datasets folder for one test, so tests never touch ~/.minari/datasets."""
    root = tmp_path / "minari-datasets"
    root.mkdir()
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(root))
    return root
