"""Write files so that a crash never leaves half of one behind: write a temporary file, then rename it."""

from __future__ import annotations

import contextlib
import os
import uuid

__all__ = ["atomic_path"]


@contextlib.contextmanager
def atomic_path(path: str):
    """Yield a temporary path next to `path`; when the block succeeds it is renamed to `path` in one step. However
    the block ends otherwise -- an error, Ctrl-C at any moment, the file's creation included -- the temporary file is
    removed."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    tmp = os.path.join(folder, f".{os.path.basename(path)}.{uuid.uuid4().hex[:12]}.tmp")  # named before it exists
    try:
        os.close(os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))  # ours alone, as mkstemp makes it
        yield tmp
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # a 0600 file so far; give it the usual permissions
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
