"""The handover suite: every passive check on freshly collected data, profile conformance, and
(when the node can run them) the short active tests.

It runs inside the agent (POST /v1/handover) or, with no agent running, in the `podhealth check`
process itself (LocalCollector). Either way the data is collected now, not taken from the last
cycle, and judged without damping: a node is handed back on what it shows at handover time.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Protocol

from podhealth.checks import profiles
from podhealth.collectors.runtime import Runner, all_factories, build, collector_config, factory_timeout, outcome_state
from podhealth.checks.passive.engine import Evaluator
from podhealth.checks.handover.report import SuiteReport
from podhealth.checks.passive.result import unknown
from podhealth.config import Config
from podhealth.snapshot import CollectorState, Snapshot
from podhealth.vocab import CheckResult, Event

CLOSE_TIMEOUT = 2.0

Progress = Callable[[str, int, int], None]


class FreshSource(Protocol):
    async def collect_now(self) -> Snapshot: ...


@dataclass(frozen=True)
class ActiveTest:
    name: str
    run: Callable[[], Awaitable[list[CheckResult]]]


class LocalCollector:
    """Collects every enabled collector once, through the agent's collector runtime
    (collectors/runtime.py: each factory and each collect() off the loop with its own timeout).

    Used when no agent runs on the node. A collector that hangs is abandoned (its thread stays
    blocked, as a hung NVML call would) and reported stale, so the suite still finishes.
    """

    def __init__(self, cfg: Config, seams: dict[str, dict[str, Any]] | None = None,
                 only: tuple[str, ...] | None = None, timeout_cap: float | None = None) -> None:
        self.cfg = cfg
        self.seams = profiles.collector_seams(cfg, seams)  # the profile facts collectors need
        self.only = only
        self.timeout_cap = timeout_cap
        self.factories = all_factories(cfg)  # the registry's and the site's checks (collectors/site.py)

    def _enabled(self) -> list[str]:
        names = []
        for name in self.factories:
            if not collector_config(self.cfg, name).enabled:
                continue
            if self.only is not None and name not in self.only:
                continue
            names.append(name)
        return names

    def _timeout(self, name: str) -> float:
        timeout = collector_config(self.cfg, name).timeout
        return min(timeout, self.timeout_cap) if self.timeout_cap is not None else timeout

    async def collect_now(self) -> Snapshot:
        names = self._enabled()
        built = await asyncio.gather(*(
            build(n, self.factories[n], self.cfg, self.seams.get(n, {}), factory_timeout(collector_config(self.cfg, n)))
            for n in names))
        states: dict[str, CollectorState] = {}
        runners = []
        for name, (col, reason) in zip(names, built):
            if col is None:
                states[name] = CollectorState(name, enabled=False, disabled_reason=reason)
            else:
                runners.append(Runner(name, col, self._timeout(name)))
        outcomes = await asyncio.gather(*(r.collect_once() for r in runners))
        events: list[Event] = []
        for runner, out in zip(runners, outcomes):
            states[runner.name] = outcome_state(CollectorState(runner.name), out, time.time())
            if out.collection is not None:
                events.extend(out.collection.events)
        await asyncio.gather(*(r.close(CLOSE_TIMEOUT) for r in runners))  # a hung one is left alone
        return Snapshot(time.time(), {n: states[n] for n in names}, tuple(events))

    def collect_sync(self) -> Snapshot:
        """collect_now() for a caller with no event loop running (`podhealth profile`)."""
        return asyncio.run(self.collect_now())


async def run_suite(cfg: Config, source: FreshSource, node: str, progress: Progress | None = None,
                    active: list[ActiveTest] | None = None) -> SuiteReport:
    """Collect fresh data, judge every passive check undamped, then run the active tests."""
    active = active or []
    profile = profiles.of_config(cfg)
    ev = Evaluator(profile, cfg.checks, mounts=[m.path for m in cfg.collectors.nfs.mounts])
    total = 1 + len(ev.checks) + len(active)
    step = 0

    def tick(what: str) -> None:
        nonlocal step
        step += 1
        if progress:
            progress(what, step, total)

    started = time.time()
    t0 = time.monotonic()
    snap = await source.collect_now()
    tick("collect")
    collect_s = time.monotonic() - t0
    enabled = [n for n, st in snap.collectors.items() if st.enabled]
    ev.enabled = tuple(enabled)
    results: list[CheckResult] = []
    durations: list[tuple[str, float]] = [("collect", collect_s)]
    for name in ev.checks:
        t1 = time.monotonic()
        results.extend(ev.evaluate(snap, time.time(), damped=False, only=[name]))
        durations.append((name, time.monotonic() - t1))
        tick(name)
    notes: list[str] = []
    disabled = [f"{n}: {st.disabled_reason}" for n, st in snap.collectors.items() if not st.enabled]
    notes += [f"collector disabled — {d}" for d in disabled]
    for test in active:
        t1 = time.monotonic()
        try:
            results.extend(await test.run())
        except Exception as e:  # noqa: BLE001 - an active test that crashes could not decide
            results.append(unknown(test.name, "node", f"{type(e).__name__}: {e}"))
        durations.append((test.name, time.monotonic() - t1))
        tick(test.name)
    return SuiteReport(node=node, profile=profile.name, results=tuple(results), durations=tuple(durations),
                       started=started, finished=time.time(), notes=tuple(notes))
