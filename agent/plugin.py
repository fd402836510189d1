"""The agent's plug-in seam: a Plugin is a part of the agent that runs on its event loop.

The judge (agent/health.py: verdicts, /health, the handover suite), the job map (agent/jobmap.py),
the GPU-reset and evidence-bundle endpoints (agent/gpureset.py, agent/bundle.py) and the
dcgm-exporter names (`--compat`) are plugins, handed to `Agent.add_plugin()` before the agent
starts, each built with only what it needs (an `AgentView`, its config section, the judge), never
the whole Agent. One list, in the order they were added, and for each snapshot the agent calls:

- `on_snapshot(snap)` once a burst of changes is over: when no collection is in flight any more
  (collectors that start together finish one after the other), or HOOK_MAX_DELAY (agent.py)
  after the first change of the burst, whichever comes first. So the judge sees a cycle's data
  once, not once per collector that finished. Plugins see it before the sinks do.
- `on_events(events)` with only the newly seen kernel-log events (XID, SXid), before the sinks.
- `routes()` once, at start: the plugin's HTTP routes; a handler that changes something must be
  wrapped in `webguard.same_site_only` (server.py refuses the app otherwise).
- `families(snap)` with every render of /metrics (in the render thread: read immutable state
  only); `AgentView.invalidate()` re-renders when a plugin's data changed without a new snapshot.

Unlike a sink (agent/sink.py: somewhere the agent sends what it sees, through its own queue), a
plugin is called in line on the loop: keep `on_snapshot`/`on_events` cheap (no I/O; start a task
or a worker for work). One that raises is logged and the others go on (agent/store.py call_each).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Collection, Iterable, Mapping, Protocol

from aiohttp import web

from podhealth.agent.metrics.family import Family, MetricSource
from podhealth.agent.nodeauth import NodeAuth
from podhealth.config import Config
from podhealth.snapshot import Snapshot
from podhealth.vocab import Event


class Plugin(Protocol):
    """What the agent calls. A plugin may subclass it to inherit the defaults (they do nothing) of
    the members it does not need; a structural match without subclassing is a Plugin as well."""

    name: str  # what the plugin is ("health", "jobmap"): for a reader of Agent.plugins

    def on_snapshot(self, snap: Snapshot) -> None:
        """The latest snapshot, once a burst of collections is over (on the loop: cheap)."""
        return None

    def on_events(self, events: tuple[Event, ...]) -> None:
        """Kernel-log events (XID, SXid) the agent had not seen before (on the loop: cheap)."""
        return None

    def routes(self) -> Iterable[web.AbstractRouteDef]:
        """HTTP routes to serve; read once, when the agent starts."""
        return ()

    def families(self, snap: Snapshot) -> Iterable[Family]:
        """Metric families to render with `snap`; runs in the render thread: read immutable state only."""
        return ()


@dataclass(frozen=True)
class AgentView:
    """What a plugin may use of the agent (`Agent.view()`), as a sink gets its config section and
    read functions: the functions read the agent live, on the loop."""

    cfg: Config
    node: str
    version: str
    seams: Mapping[str, Mapping[str, Any]]  # by collector name (agent/simmode.py fills some)
    auth: NodeAuth  # signed requests to the protected routes, proven answers
    snapshot: Callable[[], Snapshot]  # the latest
    store_version: Callable[[], int]  # how many changes the store has seen: orders two snapshots
    collectors: Callable[[], Collection[str]]  # the collectors built (known once the agent started)
    collect_now: Callable[[], Awaitable[Snapshot]]  # every collector afresh (the handover suite)
    invalidate: Callable[[], None]  # re-render /metrics: a plugin's families changed


class Families(Plugin):
    """A plugin that only adds metric families (the dcgm-exporter names of `--compat`)."""

    def __init__(self, name: str, source: MetricSource) -> None:
        self.name = name
        self.source = source

    def families(self, snap: Snapshot) -> Iterable[Family]:
        return self.source(snap)
