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
# Set to 1 to rewrite existing files in place, keeping their inodes as sysfs does (the kernel
# changes what a file says, never the file). Only bench/agent_overhead.py uses it (its default),
# so that a reader keeping files open is measured as on a real node. A text that shrinks is
# still renamed (see put): no torn tail. Left: a read racing the single pwrite of a few bytes,
# which real sysfs (it regenerates the text per read) never shows.
IN_PLACE_ENV = "PODHEALTH_SIM_IN_PLACE"


class TreeWriter:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.tmp = root / TMP_DIR
        self.tmp.mkdir(parents=True, exist_ok=True)
        self._n = 0
        self.written = 0  # files actually replaced (unchanged ones are left alone)
        self.in_place = os.environ.get(IN_PLACE_ENV) == "1"

    def put(self, path: Path, text: str) -> None:
        """Write `text` to `path` atomically, unless it already holds exactly that."""
        data = text.encode()
        try:
            with open(path, "rb") as f:
                old = f.read(len(data) + 1)
                if old == data:
                    return
            # In place only when the text does not shrink (counters only grow): one pwrite, no
            # truncate, so a reader never sees the old text's tail after the new one. A shorter
            # text goes by rename; the directory's mtime changes and a reader keeping fds there
            # (collectors/infiniband.py) opens that directory's files again, as after a replug.
            if self.in_place and len(old) <= len(data):
                fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
                try:
                    os.pwrite(fd, data, 0)
                finally:
                    os.close(fd)
                self.written += 1
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
