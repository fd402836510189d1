"""Whole or not at all: a file replaced atomically, so a reader (or a crash) never sees half of it.

The data goes to a temporary file in the same directory (same filesystem, so the rename is
atomic), is flushed and fsynced, gets its mode, and is renamed over the target. On any failure
the temporary file is removed and the target is left as it was.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


def write_atomic(path: Path, data: bytes | str, *, mode: int = 0o644, fsync: bool = True) -> None:
    """Replace `path` with `data` (str is written as UTF-8). Raises OSError; the target is then unchanged."""
    body = data.encode("utf-8") if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(body)
            f.flush()
            if fsync:
                os.fsync(f.fileno())
            os.fchmod(f.fileno(), mode)  # mkstemp makes 0600
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
