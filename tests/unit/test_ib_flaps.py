"""Link flaps and down time: checks/ib_links.LinkTracker with explicit times, and the rules that
read it (ib_flap, ib_port's down_max_s). No sleeps: every time is given."""

from __future__ import annotations

from pathlib import Path

from podhealth.checks.passive import ib
from podhealth.checks import profiles
from podhealth.checks.passive.context import Context
from podhealth.checks.passive.ib_links import LinkTracker
from podhealth.checks.profiles import Profile
from podhealth.checks.passive.rates import RateTracker
from podhealth.snapshot import CollectorState, Snapshot
from podhealth.vocab import Action, CheckResult, Sample, Status
from tests.harness.ibtree import dgx_h100, write_tree

H100 = profiles.load("dgx-h100")
T0 = 1_700_000_000.0
KEY = ("mlx5_0", "1")


def test_state_cycles_are_counted_with_their_times() -> None:
    tr = LinkTracker()
    tr.observe(KEY, T0, True)
    for i in range(3):
        tr.observe(KEY, T0 + 100 * i + 10, False)
        tr.observe(KEY, T0 + 100 * i + 20, True)
    n, events = tr.downs(KEY, T0 + 300, 43200)
    assert n == 3
    assert [(e.t - T0, e.kind) for e in events] == [(10, "down"), (20, "up"), (110, "down"), (120, "up"), (210, "down"), (220, "up")]
    assert tr.down_for(KEY, T0 + 300) is None


def test_link_downed_catches_flaps_between_looks_without_double_counting() -> None:
    tr = LinkTracker()
    tr.observe(KEY, T0, True, link_downed=4)
    tr.observe(KEY, T0 + 30, True, link_downed=6)  # two flaps shorter than the interval
    tr.observe(KEY, T0 + 60, False, link_downed=7)  # seen going down: one down, not two
    tr.observe(KEY, T0 + 90, True, link_downed=7)
    n, events = tr.downs(KEY, T0 + 90, 43200)
    assert n == 3
    assert [(e.kind, e.downs, e.source) for e in events] == [("down", 2, "link_downed"), ("down", 1, "state"), ("up", 0, "state")]


def test_saturated_or_cleared_link_downed_adds_nothing() -> None:
    tr = LinkTracker()
    tr.observe(KEY, T0, True, link_downed=255, link_downed_saturated=True)
    tr.observe(KEY, T0 + 30, True, link_downed=255, link_downed_saturated=True)
    tr.observe(KEY, T0 + 60, True, link_downed=0)  # perfquery -R: a new baseline
    tr.observe(KEY, T0 + 90, True, link_downed=1)
    assert tr.downs(KEY, T0 + 90, 43200)[0] == 1


def test_downs_age_out_of_the_window() -> None:
    tr = LinkTracker()
    tr.observe(KEY, T0, True)
    tr.observe(KEY, T0 + 10, False)
    tr.observe(KEY, T0 + 20, True)
    assert tr.downs(KEY, T0 + 100, 3600)[0] == 1
    assert tr.downs(KEY, T0 + 3611, 3600)[0] == 0


def test_down_time_counts_from_the_first_down_look() -> None:
    tr = LinkTracker()
    tr.observe(KEY, T0, False)  # down at first sight
    tr.observe(KEY, T0 + 100, False)
    assert tr.down_for(KEY, T0 + 100) == 100
    tr.observe(KEY, T0 + 200, True)
    assert tr.down_for(KEY, T0 + 200) is None


# --- the rules over a tracker ------------------------------------------------------------------


def _samples(tmp: Path, down: tuple[str, ...] = (), link_downed: dict[str, int] | None = None) -> tuple[Sample, ...]:
    from podhealth.collectors.infiniband import InfinibandCollector

    hcas = dgx_h100("ib")
    for h in hcas:
        if h.name in down:
            h.ports[1].state, h.ports[1].phys_state = "1: DOWN", "2: Polling"
        if link_downed and h.name in link_downed:
            h.ports[1].counters["link_downed"] = link_downed[h.name]
    root = tmp / f"t{len(list(tmp.iterdir()))}"
    return InfinibandCollector(write_tree(root / "sys", hcas)).collect().samples


def _ctx(samples: tuple[Sample, ...], now: float, links: LinkTracker, profile: Profile = H100) -> Context:
    st = CollectorState("infiniband", samples=samples, stale=False, last_success=now, last_attempt=now)
    return Context(snapshot=Snapshot(now, {"infiniband": st}), profile=profile, now=now, rates=RateTracker(300),
                   ib_links=links)


def _run(tmp: Path, steps: list[tuple[float, tuple[str, ...]]], check: str = "ib_flap",
         profile: Profile = H100) -> dict[str, CheckResult]:
    links = LinkTracker()
    out: list[CheckResult] = []
    for t, down in steps:
        ctx = _ctx(_samples(tmp, down), t, links, profile)
        ib.observe_links(links, ctx)
        out = ib.ib_flap(ctx) if check == "ib_flap" else ib.ib_port(ctx)
    return {r.entity: r for r in out}


def test_three_downs_in_twelve_hours_is_flapping_drain_on_compute_warn_on_storage(tmp_path: Path) -> None:
    steps: list[tuple[float, tuple[str, ...]]] = [(T0, ())]
    for i in range(3):
        steps += [(T0 + 3600 * i + 60, ("mlx5_0", "mlx5_3")), (T0 + 3600 * i + 120, ())]
    res = _run(tmp_path, steps)
    r = res["mlx5_0/1"]
    assert r.status is Status.FAIL and r.action is Action.DRAIN and "FLAPPING" in r.summary
    ev = dict(r.evidence)
    assert ev["downs"] == "3" and ev["transitions"].count("down") == 3 and "2023-11-14T22:14:20Z down" in ev["transitions"]
    assert res["mlx5_3/1"].status is Status.WARN  # storage: its role's port_fault is warn
    assert res["mlx5_1/1"].status is Status.OK


def test_two_downs_warn_and_thresholds_come_from_the_profile(tmp_path: Path) -> None:
    steps = [(T0, ()), (T0 + 60, ("mlx5_0",)), (T0 + 90, ()), (T0 + 120, ("mlx5_0",)), (T0 + 150, ())]
    assert _run(tmp_path, steps)["mlx5_0/1"].status is Status.WARN
    strict = profiles.load("dgx-h100", {"network.flap_count": 2})
    assert _run(tmp_path, steps, profile=strict)["mlx5_0/1"].status is Status.FAIL


def test_short_down_warns_long_down_drains(tmp_path: Path) -> None:
    limit = H100.network.down_max_s
    short = _run(tmp_path, [(T0, ()), (T0 + 60, ("mlx5_0",)), (T0 + 60 + limit - 1, ("mlx5_0",))], "ib_port")
    assert short["mlx5_0/1"].status is Status.WARN and dict(short["mlx5_0/1"].evidence)["down_s"] == str(int(limit - 1))
    long = _run(tmp_path, [(T0, ()), (T0 + 60, ("mlx5_0",)), (T0 + 60 + limit, ("mlx5_0",))], "ib_port")
    assert long["mlx5_0/1"].status is Status.FAIL and long["mlx5_0/1"].action is Action.DRAIN


def test_one_shot_check_has_no_flap_verdicts(tmp_path: Path) -> None:
    st = CollectorState("infiniband", samples=_samples(tmp_path), stale=False, last_success=T0, last_attempt=T0)
    ctx = Context(snapshot=Snapshot(T0, {"infiniband": st}), profile=H100, now=T0, rates=RateTracker(300))
    assert ib.ib_flap(ctx) == []


def test_link_downed_jump_between_looks_is_a_flap(tmp_path: Path) -> None:
    links = LinkTracker()
    for t, n in ((T0, 2), (T0 + 30, 5)):
        ctx = _ctx(_samples(tmp_path, link_downed={"mlx5_5": n}), t, links)
        ib.observe_links(links, ctx)
    r = {x.entity: x for x in ib.ib_flap(ctx)}["mlx5_5/1"]
    assert r.status is Status.FAIL and "link_downed" in dict(r.evidence)["transitions"]


def test_saturated_link_downed_is_said_in_flap_evidence(tmp_path: Path) -> None:
    links = LinkTracker()
    ctx = _ctx(_samples(tmp_path, link_downed={"mlx5_5": 255}), T0, links)
    ib.observe_links(links, ctx)
    r = {x.entity: x for x in ib.ib_flap(ctx)}["mlx5_5/1"]
    assert r.status is Status.OK and "state transitions only" in dict(r.evidence)["link_downed"]


def test_simulated_ib_flap_fault_becomes_flapping_through_the_evaluator(tmp_path: Path) -> None:
    """The simulator's `fault=ib-flap` (3 cycles of 60 s, down for the first half) read by the real
    collector every 10 s and judged by the agent's Evaluator: FLAPPING, DRAIN, on that port only."""
    from podhealth.checks.passive.engine import Evaluator
    from podhealth.collectors.infiniband import InfinibandCollector
    from podhealth.config import ChecksConfig, DampingConfig
    from podhealth.sim import tree_ib
    from podhealth.sim.state import Fault, default_state

    st = default_state("dgx01", "dgx-h100", now=T0).with_fault(Fault("ib-flap", T0 + 100, device="mlx5_4", count=3, period=60.0))
    ev = Evaluator(H100, ChecksConfig(damping=DampingConfig(fail_after=1, recover_after=1)))
    res: dict[tuple[str, str], CheckResult] = {}
    for i, t in enumerate(range(int(T0) + 60, int(T0) + 400, 10)):
        root = tmp_path / str(i) / "sys"
        tree_ib.write(st, root, float(t))
        c = InfinibandCollector(root).collect()
        snap = Snapshot(float(t), {"infiniband": CollectorState("infiniband", samples=c.samples, stale=False,
                                                                 last_success=float(t), last_attempt=float(t))})
        res = {(r.check, r.entity): r for r in ev.evaluate(snap, float(t))}
    r = res[("ib_flap", "mlx5_4/1")]
    assert r.status is Status.FAIL and r.action is Action.DRAIN and dict(r.evidence)["downs"] == "3", r
    assert [e for (c, e), x in res.items() if c == "ib_flap" and x.status is not Status.OK] == ["mlx5_4/1"]
    assert res[("ib_port", "mlx5_4/1")].status is Status.OK  # the link is up again
