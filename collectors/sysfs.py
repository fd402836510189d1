"""One small sysfs attribute, read as every sysfs collector reads it (edac, pcie_aer, nvme).

Absent is None: the driver does not offer that file. A local fault (collectors/base.py
LOCAL_ERRNOS) fails the whole collection, so nothing is judged from what could not be opened.
Any other error is said in the collection's errors and reads as None for that one file.
"""

from __future__ import annotations

from pathlib import Path

from podhealth.collectors.base import raise_if_local

MAX_ATTR = 4096  # a sysfs attribute is one page at most


def read_attr(path: Path, errors: list[str], encoding: str = "utf-8") -> str | None:
    """The attribute's text (at most MAX_ATTR bytes), or None when it is absent or unreadable."""
    try:
        with open(path, "rb") as f:
            return f.read(MAX_ATTR).decode(encoding, "replace")
    except FileNotFoundError:
        return None
    except OSError as e:
        raise_if_local(e, str(path))
        errors.append(f"{path}: {e.strerror or e}")
        return None
