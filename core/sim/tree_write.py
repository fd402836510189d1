"""Atomic file writes for the simulated sysfs/procfs trees.

The agent (and node_exporter) read these trees while the simulator rewrites them, so a reader
must see either the old or the new content, never a torn file and never a temporary name inside
a directory it lists: temporaries live in one hidden directory at the tree's root and are renamed
into place (same filesystem, so rename is atomic).
"""

from __future__ import annotations

import os
from pathlib import Path

TMP_DIR = ".podhealth-tmp"


class TreeWriter:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.tmp = root / TMP_DIR
        self.tmp.mkdir(parents=True, exist_ok=True)
        self._n = 0
        self.written = 0  # files actually replaced (unchanged ones are left alone)

    def put(self, path: Path, text: str) -> None:
        """Write `text` to `path` atomically, unless it already holds exactly that."""
        data = text.encode()
        try:
            with open(path, "rb") as f:
                if f.read(len(data) + 1) == data:
                    return
        except OSError:
            path.parent.mkdir(parents=True, exist_ok=True)
        self._n += 1
        tmp = self.tmp / f"{os.getpid()}.{self._n}"
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
        self.written += 1

    def symlink(self, path: Path, target: str) -> None:
        """Point `path` at `target` atomically (a reader never finds it missing)."""
        try:
            if os.readlink(path) == target:
                return
        except OSError:
            pass
        self._n += 1
        tmp = self.tmp / f"{os.getpid()}.{self._n}.lnk"
        os.symlink(target, tmp)
        os.replace(tmp, path)

    def remove(self, path: Path) -> None:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
