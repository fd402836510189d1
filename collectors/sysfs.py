"""Small sysfs attributes, read and parsed as every sysfs collector does (edac, pcie_aer, nvme).

Absent is None: the driver does not offer that file. A local fault (collectors/base.py
LOCAL_ERRNOS) fails the whole collection, so nothing is judged from what could not be opened.
Any other error is said in the collection's errors and reads as None for that one file.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, TypeVar, cast

from podhealth.collectors.base import raise_if_local

MAX_ATTR = 4096  # a sysfs attribute is one page at most
T = TypeVar("T")


def read_attr(path: Path | str, errors: list[str], encoding: str = "utf-8") -> str | None:
    """The attribute's text (at most MAX_ATTR bytes), or None when it is absent or unreadable."""
    try:
        # os.open/os.read: pcie_aer alone reads ~170 of these a cycle; open() adds its io stack
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            return os.read(fd, MAX_ATTR).decode(encoding, "replace")
        finally:
            os.close(fd)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise_if_local(e, str(path))
        errors.append(f"{path}: {e.strerror or e}")
        return None


def parse_count(text: str) -> int:
    """A count attribute (edac's ce_count, AER's aer_rootport_total_err_*): decimal digits only."""
    t = text.strip()
    if not re.fullmatch(r"[0-9]{1,20}", t, re.ASCII):
        raise ValueError(f"expected a count, got {t[:40]!r}")
    return int(t)


class ParseMemo:
    """What each file's last text parsed to (or why it did not), kept one collection: counter
    files rarely change, and parsing one (an AER file is ~20 lines) costs more than reading it.
    commit() at the end of each collection drops the files not read in it."""

    def __init__(self) -> None:
        self._last: dict[str, tuple[str, object]] = {}
        self._next: dict[str, tuple[str, object]] = {}

    def parse(self, key: str, text: str, parse: Callable[[str], T]) -> T:
        hit = self._last.get(key)
        if hit is None or hit[0] != text:
            try:
                value: object = parse(text)
            except ValueError as e:
                value = _Refused(str(e))
            hit = (text, value)
        self._next[key] = hit
        if isinstance(hit[1], _Refused):
            raise ValueError(hit[1].why)  # a new one each time: a kept one would grow its traceback
        return cast(T, hit[1])

    def commit(self) -> None:
        self._last, self._next = self._next, {}


@dataclass(frozen=True, slots=True)
class _Refused:
    why: str


def read_parsed(path: Path | str, parse: Callable[[str], T], errors: list[str], *, name: str = "",
                encoding: str = "utf-8", memo: ParseMemo | None = None) -> T | None:
    """read_attr, then `parse` (a pure *_parse function; through `memo` when given); text it
    refuses (ValueError) is said as `name: why` (name: the path, unless given) and reads as None,
    as an unreadable file does."""
    text = read_attr(path, errors, encoding)
    if text is None:
        return None
    try:
        return parse(text) if memo is None else memo.parse(str(path), text, parse)
    except ValueError as e:
        errors.append(f"{name or path}: {e}")
        return None
