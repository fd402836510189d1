"""Every passive check: a passing case, a failing case, an UNKNOWN case, and its evidence."""

from __future__ import annotations

import pytest

from podhealth.checks import profiles
from podhealth.checks.passive.engine import Evaluator
from podhealth.config import ChecksConfig, DampingConfig
from podhealth.snapshot import CollectorState, Snapshot
from podhealth.vocab import Action, CheckResult, Sample, Status

H100 = profiles.load("dgx-h100")
ALL = ("nvml", "nvlink", "infiniband", "nfs", "host", "kmsg", "pcie_aer", "edac", "nvme")


def gpu_samples(n: int = 8, **over: dict[int, dict[str, float]]) -> list[Sample]:
    out = [Sample.of("gpu_devices", n)]
    for i in range(n):
        lab = dict(gpu=i, uuid=f"GPU-{i:04d}", pci_bus_id=f"0000:{0x18 + i:02x}:00.0", model=H100.gpu_model)
        vals: dict[str, float] = {
            "gpu_up": 1, "gpu_lost": 0, "gpu_temperature_celsius": 35, "gpu_memory_temperature_celsius": 40,
            "gpu_pcie_link_gen": 5, "gpu_pcie_link_width": 16, "gpu_utilization_ratio": 0.0,
            "gpu_remapped_rows_pending": 0, "gpu_remapped_rows_failure": 0, "gpu_persistence_mode": 1,
            "gpu_fabric_state": 3, "gpu_fabric_healthy": 1, "gpu_pcie_replay": 0,
        }
        vals.update(over.get("gpu", {}).get(i, {}))
        out += [Sample.of(k, v, **lab) for k, v in vals.items()]
        out.append(Sample.of("gpu_ecc_errors", over.get("unc", {}).get(i, 0), type="uncorrected", scope="volatile", **lab))
        out.append(Sample.of("gpu_ecc_errors", 0, type="corrected", scope="volatile", **lab))
        out.append(Sample.of("gpu_remapped_rows", 0, type="uncorrectable", **lab))
        for reason in over.get("reasons", {}).get(i, []):
            out.append(Sample.of("gpu_clocks_event_active", 1, reason=reason, **lab))
        out.append(Sample.of("gpu_info", 1, driver_version=over.get("driver", "550.90.07"), **lab))
        links_up = over.get("links", {}).get(i, 18)
        out.append(Sample.of("nvlink_links_up", links_up, gpu=i, uuid=f"GPU-{i:04d}"))
        out.append(Sample.of("nvlink_links_expected", 18, gpu=i, uuid=f"GPU-{i:04d}"))
        for link in range(18):
            out.append(Sample.of("nvlink_up", 1 if link < links_up else 0, gpu=i, link=link))
    return out


def ib_samples(down: str = "", rate_gbps: float = 400, link_downed: int = 0) -> list[Sample]:
    """A DGX H100's ports as the collector reports them: mlx5_0-7 single-port compute adapters,
    mlx5_8/mlx5_9 the two ports (PCI functions .0/.1) of one dual-port storage card."""
    out = []
    for d in range(10):
        dev = f"mlx5_{d}"
        active = dev != down
        pci = f"0000:{0x18 + 0x10 * d:02x}:00.0" if d < 8 else f"0000:a9:00.{d - 8}"
        out.append(Sample.of("infiniband_device_pci_info", 1, device=dev, pci_address=pci, numa_node=d // 4))
        out.append(Sample.of("infiniband_port_link_layer_info", 1, device=dev, port=1, link_layer="InfiniBand"))
        out.append(Sample.of("infiniband_port_state", 4 if active else 1, device=dev, port=1, state="ACTIVE" if active else "DOWN"))
        out.append(Sample.of("infiniband_port_physical_state", 5 if active else 3, device=dev, port=1, state="LinkUp" if active else "Disabled"))
        out.append(Sample.of("infiniband_port_rate_bytes_per_second", (rate_gbps if d == 3 else 400) * 1e9 / 8, device=dev, port=1))
        out.append(Sample.of("infiniband_port_stat", link_downed if d == 5 else 0, device=dev, port=1, counter="link_downed"))
    return out


def nfs_samples(present: bool = True, probe_ok: bool = True) -> list[Sample]:
    return [Sample.of("nfs_mount_present", 1 if present else 0, mountpoint="/home"),
            Sample.of("nfs_probe_ok", 1 if probe_ok else 0, mountpoint="/home"),
            Sample.of("nfs_probe_seconds", 0.002 if probe_ok else 5.0, mountpoint="/home")]


def host_samples(fm_state: str = "active") -> list[Sample]:
    return [Sample.of("systemd_unit_state_info", 1, unit="nvidia-fabricmanager.service", state=fm_state)]


def snap(samples: list[Sample], now: float = 1000.0, stale: tuple[str, ...] = ()) -> Snapshot:
    by: dict[str, list[Sample]] = {c: [] for c in ALL}
    for s in samples:
        c = ("nvlink" if s.name.startswith("nvlink") else "infiniband" if s.name.startswith("infiniband")
             else "nfs" if s.name.startswith("nfs") else "host" if s.name.startswith("systemd")
             else "pcie_aer" if s.name.startswith("pcie_aer") else "edac" if s.name.startswith("edac")
             else "nvme" if s.name.startswith("nvme") else "nvml")
        by[c].append(s)
    return Snapshot(now, {c: CollectorState(c, samples=tuple(v), stale=c in stale, last_success=now,
                                               last_attempt=now) for c, v in by.items()})


def evaluate(samples: list[Sample], stale: tuple[str, ...] = (), damped: bool = False, **kw: object) -> dict[tuple[str, str], CheckResult]:
    ev = Evaluator(H100, ChecksConfig(required_units=("nvidia-fabricmanager.service",), **kw))  # type: ignore[arg-type]
    return {(r.check, r.entity): r for r in ev.evaluate(snap(samples, stale=stale), 1000.0, damped=damped)}


def host_error_samples() -> list[Sample]:
    """A clean host: one AER function per GPU, one EDAC controller, one NVMe drive (tests/unit/
    test_host_errors.py judges the failing cases)."""
    out = [Sample.of("pcie_aer_devices", 8), Sample.of("edac_memory_controllers", 1),
           Sample.of("edac_mc_errors", 0, mc="mc0", type="ce"), Sample.of("edac_mc_errors", 0, mc="mc0", type="ue"),
           Sample.of("nvme_info", 1, controller="nvme0", model="m", serial="s", firmware="f", state="live", pci="")]
    out += [Sample.of("pcie_aer_errors", 0, pci=f"0000:{0x18 + i:02x}:00.0", severity=sev, kind="gpu")
            for i in range(8) for sev in ("correctable", "nonfatal", "fatal")]
    return out


def healthy() -> list[Sample]:
    return gpu_samples() + ib_samples() + nfs_samples() + host_samples() + host_error_samples()


def test_healthy_node_is_all_ok() -> None:
    res = evaluate(healthy())
    bad = [r for r in res.values() if r.status is not Status.OK]
    assert bad == []
    assert ("gpu_count", "node") in res and ("nvlink", "gpu7") in res and ("ib_port", "mlx5_9/1") in res
    assert ("nfs_mount", "/home") in res and ("systemd_unit", "nvidia-fabricmanager.service") in res


@pytest.mark.parametrize("samples, key, action, summary_part, evidence_key", [
    (gpu_samples(7) + ib_samples() + nfs_samples() + host_samples(), ("gpu_count", "node"), Action.REBOOT, "7 of 8", "visible"),
    (gpu_samples(gpu={3: {"gpu_up": 0, "gpu_lost": 1}}) + ib_samples(), ("gpu_lost", "gpu3"), Action.REBOOT, "fallen off", "pci_bus_id"),
    (gpu_samples(unc={1: 2}), ("ecc", "gpu1"), Action.RESET_GPU, "uncorrectable", "uncorrected_volatile"),
    (gpu_samples(gpu={2: {"gpu_remapped_rows_pending": 1}}), ("row_remap", "gpu2"), Action.RESET_GPU, "pending", "uncorrectable_remaps"),
    (gpu_samples(gpu={2: {"gpu_remapped_rows_failure": 1}}), ("row_remap", "gpu2"), Action.REPLACE, "failed", "uuid"),
    (gpu_samples(gpu={4: {"gpu_pcie_link_width": 8}}), ("pcie", "gpu4"), Action.DRAIN, "x8", "width"),
    (gpu_samples(gpu={4: {"gpu_pcie_link_gen": 4, "gpu_utilization_ratio": 0.9}}), ("pcie", "gpu4"), Action.DRAIN, "gen4", "gen"),
    (gpu_samples(reasons={6: ["hw_slowdown", "hw_thermal_slowdown"]}), ("clocks", "node"), Action.DRAIN,
     "GPU 6: HW thermal slowdown", "gpus"),
    (gpu_samples(reasons={5: ["hw_slowdown"]}), ("clocks", "node"), Action.DRAIN, "over-current", "hw_slowdown"),
    (gpu_samples(gpu={6: {"gpu_temperature_celsius": 93}}), ("temperature", "gpu6"), Action.DRAIN, "temperature", "gpu_c"),
    (gpu_samples(gpu={2: {"gpu_fabric_state": 2, "gpu_fabric_healthy": 0}}), ("fabric", "gpu2"), Action.REBOOT, "in progress", "state"),
    (gpu_samples(driver="525.60.13"), ("driver", "node"), Action.NONE, "below fleet minimum", "minimum"),
    (gpu_samples(links={0: 17}), ("nvlink", "gpu0"), Action.REBOOT, "17 of 18", "down"),
    (ib_samples(down="mlx5_3"), ("ib_port", "mlx5_3/1"), Action.DRAIN, "DOWN", "phys_state"),
    (ib_samples(rate_gbps=200), ("ib_port", "mlx5_3/1"), Action.DRAIN, "200 Gb/s", "expected_gbps"),
    (nfs_samples(present=False), ("nfs_mount", "/home"), Action.DRAIN, "missing", None),
    (nfs_samples(probe_ok=False), ("nfs_mount", "/home"), Action.DRAIN, "hung", "probe_seconds"),
    (host_samples("failed"), ("systemd_unit", "nvidia-fabricmanager.service"), Action.REBOOT, "failed", "state"),
])
def test_failing_cases(samples: list[Sample], key: tuple[str, str], action: Action, summary_part: str, evidence_key: str | None) -> None:
    r = evaluate(samples)[key]
    assert r.status is Status.FAIL, r
    assert r.action is action
    assert summary_part in r.summary
    if evidence_key:
        assert evidence_key in dict(r.evidence)


def test_warn_cases() -> None:
    res = evaluate(gpu_samples(gpu={1: {"gpu_persistence_mode": 0, "gpu_temperature_celsius": 86}},
                               reasons={2: ["sw_thermal_slowdown"]}))
    assert res[("persistence", "gpu1")].status is Status.WARN
    assert res[("temperature", "gpu1")].status is Status.WARN
    # SW thermal slowdown alone is reported, not judged: the temperature check judges heat.
    assert res[("clocks", "node")].status is Status.OK
    assert "sw_thermal_slowdown" in dict(res[("clocks", "node")].evidence)["reasons"]


@pytest.mark.parametrize("collector, checks", [
    ("nvml", ["gpu_count", "ecc", "pcie", "clocks", "driver"]),
    ("nvlink", ["nvlink"]), ("infiniband", ["ib_port", "ib_errors"]), ("nfs", ["nfs_mount"]), ("host", ["systemd_unit"]),
])
def test_stale_collector_makes_its_checks_unknown(collector: str, checks: list[str]) -> None:
    res = evaluate(gpu_samples(unc={1: 5}) + ib_samples(down="mlx5_1") + nfs_samples(present=False) + host_samples("failed"),
                   stale=(collector,))
    for c in checks:
        r = res[(c, "node")]
        assert r.status is Status.UNKNOWN and r.action is Action.NONE
        assert collector in r.summary
        assert not any(k[0] == c and k[1] != "node" for k in res), f"{c} must not judge stale data"


def test_lost_gpu_is_unknown_for_per_gpu_checks_not_ok() -> None:
    res = evaluate(gpu_samples(gpu={3: {"gpu_up": 0, "gpu_lost": 1}}))
    assert res[("ecc", "gpu3")].status is Status.UNKNOWN
    assert res[("gpu_lost", "gpu3")].status is Status.FAIL


def test_ib_link_downed_increase_is_a_flap_warning_that_ages_out() -> None:
    # One link down (and back) is not a fault by itself: network.flap_count downs within
    # network.flap_window_s are (tests/unit/test_ib_flaps.py); one shows as a WARN until it ages out.
    ev = Evaluator(H100, ChecksConfig(rate_window=60.0, damping=DampingConfig(fail_after=1, recover_after=1)))
    base = gpu_samples() + nfs_samples() + host_samples()
    r0 = {(r.check, r.entity): r for r in ev.evaluate(snap(base + ib_samples(link_downed=3)), 1000.0)}
    assert r0[("ib_flap", "mlx5_5/1")].status is Status.OK  # one point: no increase known yet
    r1 = {(r.check, r.entity): r for r in ev.evaluate(snap(base + ib_samples(link_downed=4), 1010.0), 1010.0)}
    assert r1[("ib_flap", "mlx5_5/1")].status is Status.WARN
    assert dict(r1[("ib_flap", "mlx5_5/1")].evidence)["downs"] == "1"
    assert r1[("ib_errors", "mlx5_5/1")].status is Status.OK
    window = H100.network.flap_window_s
    r2 = {(r.check, r.entity): r for r in ev.evaluate(snap(base + ib_samples(link_downed=4), 1011 + window), 1011 + window)}
    assert r2[("ib_flap", "mlx5_5/1")].status is Status.OK


def test_ecc_corrected_rate_threshold() -> None:
    ev = Evaluator(H100, ChecksConfig(rate_window=3600.0))

    def with_corrected(n: float) -> list[Sample]:
        return [s if not (s.name == "gpu_ecc_errors" and s.label("type") == "corrected" and s.label("gpu") == "0")
                else Sample(s.name, n, s.labels) for s in gpu_samples()]
    ev.evaluate(snap(with_corrected(0)), 0.0, damped=False)
    ok = {(r.check, r.entity): r for r in ev.evaluate(snap(with_corrected(100)), 360.0, damped=False)}
    assert ok[("ecc", "gpu0")].status is Status.OK  # 1000/h is the limit: 100 in 6 min is exactly 1000/h
    bad = {(r.check, r.entity): r for r in ev.evaluate(snap(with_corrected(400)), 720.0, damped=False)}
    assert bad[("ecc", "gpu0")].status is Status.WARN
    assert float(dict(bad[("ecc", "gpu0")].evidence)["corrected_per_hour"]) == pytest.approx(2000.0)


FABRIC_BAD = {"gpu": {1: {"gpu_fabric_state": 2, "gpu_fabric_healthy": 0}}}


def test_damping_fail_after_and_recover_after() -> None:
    # fabric has no rule in rules.yaml: it follows checks.damping.
    ev = Evaluator(H100, ChecksConfig(damping=DampingConfig(fail_after=2, recover_after=3)))
    seq = []
    for t, bad in enumerate([True, True, False, False, False, True]):
        s = snap(gpu_samples(**FABRIC_BAD) if bad else gpu_samples(), now=float(t))  # type: ignore[arg-type]
        res = {(r.check, r.entity): r for r in ev.evaluate(s, float(t))}
        seq.append(res[("fabric", "gpu1")].status)
    assert seq == [Status.OK, Status.FAIL, Status.FAIL, Status.FAIL, Status.OK, Status.OK]
    res = {(r.check, r.entity): r for r in ev.evaluate(snap(gpu_samples(**FABRIC_BAD), now=6.0), 6.0)}  # type: ignore[arg-type]
    assert res[("fabric", "gpu1")].status is Status.FAIL and res[("fabric", "gpu1")].since == 5.0


def test_damping_counts_new_collections_not_reevaluations() -> None:
    """Other collectors waking the evaluator must not count as more evidence about the GPUs."""
    ev = Evaluator(H100, ChecksConfig(damping=DampingConfig(fail_after=2, recover_after=2)))
    bad = snap(gpu_samples(**FABRIC_BAD), now=1.0)  # type: ignore[arg-type]
    for t in (1.0, 1.5, 2.0, 2.5):  # the same nvml collection judged four times
        res = {(r.check, r.entity): r for r in ev.evaluate(bad, t)}
        assert res[("fabric", "gpu1")].status is Status.OK
    res = {(r.check, r.entity): r for r in ev.evaluate(snap(gpu_samples(**FABRIC_BAD), now=3.0), 3.0)}  # type: ignore[arg-type]
    assert res[("fabric", "gpu1")].status is Status.FAIL


def test_retired_pages_only_where_reported() -> None:
    p100 = gpu_samples(1) + [Sample.of("gpu_retired_pages", 61, cause="sbe", gpu=0, uuid="GPU-0000"),
                              Sample.of("gpu_retired_pages", 0, cause="dbe", gpu=0, uuid="GPU-0000")]
    res = evaluate(p100)
    assert res[("retired_pages", "gpu0")].status is Status.FAIL and res[("retired_pages", "gpu0")].action is Action.REPLACE
    assert not any(k[0] == "retired_pages" for k in evaluate(gpu_samples()))


def test_what_checks_derive_together_is_made_once_per_snapshot_and_profile() -> None:
    """Context.derived: ib_port, ib_flap and the link history share one port_views; a profile
    swapped in (the engine's site-threshold comparison) gets its own."""
    import dataclasses

    from podhealth.checks.passive.context import Context
    from podhealth.checks.passive.rates import RateTracker

    ctx = Context(snapshot=Snapshot(0.0, {}), profile=H100, now=0.0, rates=RateTracker(60.0))
    made: list[object] = []

    def make() -> object:
        made.append(ctx.profile)
        return len(made)

    assert ctx.derived("k", make) == 1 and ctx.derived("k", make) == 1
    ctx.profile = dataclasses.replace(H100, thresholds=dict(H100.thresholds))
    assert ctx.derived("k", make) == 2
    assert made == [H100, ctx.profile]


def test_the_kept_index_is_the_one_context_makes_and_reindexes_only_what_changed() -> None:
    """SampleIndex (the Evaluator's): for every snapshot, the samples by name, in snapshot order,
    that Context makes itself; a collector state that is the same object keeps its index."""
    from podhealth.checks.passive.context import Context, SampleIndex
    from podhealth.checks.passive.rates import RateTracker

    def own(snap: Snapshot) -> dict[str, list[Sample]]:
        ctx = Context(snapshot=snap, profile=H100, now=0.0, rates=RateTracker(60.0))
        return {n: ctx.samples(n) for n in {s.name for s in snap.samples()}}

    a = CollectorState("a", samples=(Sample.of("x", 1, k="1"), Sample.of("y", 2), Sample.of("x", 3, k="2")))
    b = CollectorState("b", samples=(Sample.of("x", 4, k="3"), Sample.of("z", 5)))
    index = SampleIndex()
    first = index.of(Snapshot(0.0, {"a": a, "b": b}))
    assert first == own(Snapshot(0.0, {"a": a, "b": b})) and [s.value for s in first["x"]] == [1, 3, 4]
    b2 = CollectorState("b", samples=(Sample.of("z", 6),))
    second = index.of(Snapshot(1.0, {"a": a, "b": b2}))
    assert second == own(Snapshot(1.0, {"a": a, "b": b2}))
    assert second["y"] is first["y"]  # collector a did not run: its index is kept
    assert [s.value for s in first["x"]] == [1, 3, 4]  # what was handed out is never modified
    assert index.of(Snapshot(2.0, {"b": b2})) == {"z": [Sample.of("z", 6)]}
