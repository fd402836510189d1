"""Every history and cache the agent keeps across evaluations stays bounded over a long run
(issue 32 §6): counted in entries, never bytes or time. The runs are synthetic and given their
times, with series that come and go (ports renamed, mounts gone, ever-new event ids), which is
what makes a keyed history grow without bound when nothing forgets."""

from __future__ import annotations

from podhealth.checks import profiles
from podhealth.checks.passive.engine import Evaluator
from podhealth.checks.passive.ib_links import MAX_EVENTS, LinkTracker
from podhealth.checks.passive.rates import RateTracker
from podhealth.config import ChecksConfig
from podhealth.snapshot import CollectorState, Snapshot
from podhealth.vocab import Event, Sample

T0 = 1_700_000_000.0
STEP = 10.0  # the default collector interval


def test_counter_history_forgets_series_that_went_away_and_caps_the_rest() -> None:
    r = RateTracker(window=300.0)
    stable = [("stat", (("device", f"mlx5_{i}"),)) for i in range(100)]
    biggest = 0
    for step in range(3000):  # 8 h at 10 s
        t = T0 + step * STEP
        for k in stable:
            r.observe(k, t, float(step))
        # 20 series that live three steps each (a job's labels, a mount that comes and goes)
        for j in range(20):
            r.observe(("gone", (("n", f"{step}-{j}"),)), t, 1.0)
        biggest = max(biggest, len(r))
    # Held: the stable ones plus at most forget_after (+ a sweep period) of the passing ones.
    passing = 20 * int((r.forget_after * 1.25) / STEP + 2)
    assert biggest <= len(stable) + passing, (biggest, passing)
    assert r.forgotten > 20 * 2900
    assert all(r.history_len(k) <= r.max_points for k in stable)
    assert all(r.rate(k, T0 + 2999 * STEP) is not None for k in stable)

    capped = RateTracker(window=300.0, max_series=150)
    for step in range(200):
        t = T0 + step * STEP
        for k in stable:
            capped.observe(k, t, float(step))
        for j in range(20):
            capped.observe(("new", (("n", f"{step}-{j}"),)), t, 1.0)
        assert len(capped) <= 150
    # The longest unseen go first: the series seen every step keep their history.
    assert all(capped.rate(k, T0 + 199 * STEP) is not None for k in stable)


def test_link_history_is_capped_per_port_and_in_ports() -> None:
    links = LinkTracker(max_ports=64)
    for step in range(2000):
        t = T0 + step * STEP
        links.observe(("mlx5_0", "1"), t, step % 2 == 0)  # flapping every step
        links.observe((f"renamed{step}", "1"), t, True)  # a device name never seen again
        assert len(links) <= 64
    n, events = links.downs(("mlx5_0", "1"), t, 1e9)
    assert len(events) <= MAX_EVENTS and n > 0  # the port seen every step is kept


def _snapshot(step: int, t: float) -> Snapshot:
    ib = tuple(Sample.of("infiniband_port_stat", float(step), device=f"mlx5_{d}", port="1", counter="symbol_error")
               for d in range(4))
    # A port whose name changes every hour (a renamed HCA): its series go away.
    churn = Sample.of("infiniband_port_stat", 1.0, device=f"ib{step // 360}", port="1", counter="symbol_error")
    ev = Event(kind="xid", code=13, time=t, id=f"ev{step}")  # a new event every step
    states = {
        "infiniband": CollectorState("infiniband", samples=(*ib, churn), stale=False, last_success=t, last_attempt=t),
        "kmsg": CollectorState("kmsg", samples=(), stale=False, last_success=t, last_attempt=t),
    }
    return Snapshot(t, states, events=(ev,))


def test_the_evaluators_histories_stay_bounded_over_a_long_run() -> None:
    ev = Evaluator(profiles.load("dgx-h100"), ChecksConfig(max_series=50), keep_events=100)
    sizes: list[tuple[int, int, int, int]] = []
    for step in range(2000):
        t = T0 + step * STEP
        ev.evaluate(_snapshot(step, t), t)
        sizes.append((len(ev.rates), len(ev.links), len(ev._events), len(ev.damper._t)))
    assert max(s[0] for s in sizes) <= 50
    assert max(s[1] for s in sizes) <= 50
    assert max(s[2] for s in sizes) <= 100
    # Damping holds one track per (check, entity) judged last: flat once the run has settled.
    assert max(s[3] for s in sizes[1000:]) == max(s[3] for s in sizes[1900:])


def test_render_caches_follow_what_is_exported_under_label_churn() -> None:
    from types import MappingProxyType

    from podhealth.agent.metrics.blocks import BlockEncoder
    from podhealth.agent.metrics.encode import cache_bound
    from podhealth.agent.metrics.exposition import MAX_CHECKED_LABELS, RenderContext, checked
    from podhealth.vocab import MetricSpec

    spec = {"nvml": {"gpu_reason": MetricSpec("gpu_reason", "gauge", "A label that changes every render.")}}
    c = RenderContext(node="dgx01", version="0", profile="dgx-h100", specs=spec)  # type: ignore[arg-type]
    enc = BlockEncoder("dgx01")
    biggest = 0
    for step in range(400):
        samples = tuple(Sample.of("gpu_reason", 1.0, gpu=g, reason=f"r{step}") for g in range(100))
        st = CollectorState("nvml", samples=samples, stale=False, last_success=T0, last_attempt=T0)
        enc.render(Snapshot(T0, MappingProxyType({"nvml": st})), c, False)
        biggest = max(biggest, len(enc._prefix))
    # 40,000 label sets went by; the caches hold a bounded multiple of the 100 exported now.
    assert biggest <= cache_bound(100) + 100
    assert len(checked.labels) <= MAX_CHECKED_LABELS + 1
