"""Write files so that a crash never leaves half of one behind: write a temporary file, then rename it."""

from __future__ import annotations

import contextlib
import os
import tempfile

__all__ = ["atomic_path"]


@contextlib.contextmanager
def atomic_path(path: str):
    """Yield a temporary path next to `path`; when the block succeeds it is renamed to `path` in one step."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{os.path.basename(path)}.", suffix=".tmp")
    os.close(fd)
    try:
        yield tmp
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600 files; give the usual permissions
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
