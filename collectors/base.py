"""What a collector is: a name, its metrics, and a blocking `collect()` returning typed samples.

Collectors never build Prometheus objects and never interpret values (what an XID or a counter
means belongs to checks/). `collect()` is blocking by design: the agent's scheduler runs it off
the event loop with a timeout, so a hung source makes only its own collector stale.
"""

from __future__ import annotations

import errno
from dataclasses import dataclass
from typing import ClassVar, Mapping, Protocol

from podhealth.vocab import Event, MetricSpec, ProgramReport, Sample


@dataclass(frozen=True, slots=True)
class Collection:
    """One collection's output. `errors` are per-entity problems that did not fail the collector."""

    samples: tuple[Sample, ...]
    events: tuple[Event, ...] = ()
    errors: tuple[str, ...] = ()
    reports: tuple[ProgramReport, ...] = ()  # what a site check's program said (collectors/site.py)


class Collector(Protocol):
    name: ClassVar[str]
    metrics: ClassVar[Mapping[str, MetricSpec]]

    def collect(self) -> Collection: ...

    def close(self) -> None: ...


class CollectorDisabled(Exception):
    """Raised by a factory when its source is absent (no DCGM bindings, no HCA): the reason is exported."""


# Errors that say "this host could not read", not "the thing is not there": out of file
# descriptors (an fd leak or a connection flood), out of memory or kernel buffers, no permission
# (a hardened unit, an LSM), a timeout, no process slots for a helper. A count of what is present
# made from such a read is a count of what could be opened, so it must never become a verdict.
LOCAL_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS, errno.EACCES, errno.EPERM,
                          errno.ETIMEDOUT, errno.EAGAIN})


class SourceUnreadable(Exception):
    """A source could not be read for a local reason (LOCAL_ERRNOS): the whole collection fails,
    so every check over this collector says UNKNOWN instead of judging what looks missing."""


def local_fault(e: BaseException) -> bool:
    """Whether `e` is this host failing to read (see LOCAL_ERRNOS), not the source answering."""
    if isinstance(e, (MemoryError, TimeoutError, SourceUnreadable)):
        return True
    return isinstance(e, OSError) and e.errno in LOCAL_ERRNOS


def raise_if_local(e: BaseException, where: str) -> None:
    """Re-raise a local fault as SourceUnreadable (naming what could not be read); else return,
    and the caller records the problem for that one entity as before."""
    if isinstance(e, SourceUnreadable):
        raise e
    if local_fault(e):
        why = (e.strerror if isinstance(e, OSError) else None) or type(e).__name__
        raise SourceUnreadable(f"{where}: {why}") from e


def specs(*items: MetricSpec) -> Mapping[str, MetricSpec]:
    return {m.name: m for m in items}
