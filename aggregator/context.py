"""What the leader's side work needs of it, and nothing more: the operator commands
(aggregator/overrides.py), evidence bundles (aggregator/bundles.py), the action runner and agent
liveness read the node mirror, commit, check that this replica still leads, and read the clock
through one of these, never through the whole `Aggregator`.

A takeover loads a new mirror and builds a new Context (`Aggregator.mem`'s setter); the parts
that outlive it hold `Aggregator.context`, a function that returns the current one, so no part
keeps a mirror that an election replaced.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Mapping, MutableMapping, Sequence

from podhealth.aggregator.model import Silence
from podhealth.aggregator.state import Memory
from podhealth.aggregator.store import Op


@dataclass(frozen=True)
class Context:
    mem: Memory  # this takeover's mirror of the store
    commit: Callable[[Sequence[Op]], Awaitable[None]]  # through the writer, in order
    # Raises OperatorError(503) unless this replica leads and its takeover is done: the leader's
    # mirror is the one decide() reads, and a follower's is not.
    require_leader: Callable[[], None]
    clock: Callable[[], float]  # wall time, stored and shown (the database's on PostgreSQL)
    poke: Callable[[], None]  # something changed: run decide() soon
    # operators' silences, (node, check) -> Silence: an input of decide(), loaded at each takeover
    silences: MutableMapping[tuple[str, str], Silence]
    # release podhealth's own fence on a node through the action runner (node, reason, who)
    release: Callable[[str, str, str], Awaitable[Mapping[str, Any]]]


__all__ = ["Context"]
