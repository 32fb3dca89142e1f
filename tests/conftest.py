"""Shared pytest fixtures."""

import pytest


@pytest.fixture
def minari_root(tmp_path, monkeypatch):
    """An empty Minari datasets folder for one test, so tests never touch ~/.minari/datasets."""
    root = tmp_path / "minari-datasets"
    root.mkdir()
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(root))
    return root
