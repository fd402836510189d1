"""False-positive control: per-check damping from rules.yaml, fatal facts that never wait, the boot
and driver grace, and clock-event reasons as one node-level finding."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from podhealth.checks import profiles
from podhealth.checks.passive import rules
from podhealth.checks.passive.damping import Damper, Grace
from podhealth.checks.passive.engine import CHECKS, Evaluator, check_rules
from podhealth.checks.passive.rules import RulesError
from podhealth.config import ChecksConfig, DampingConfig
from podhealth.snapshot import CollectorState, Snapshot
from podhealth.vocab import Action, CheckResult, Event, Sample, Status

pytestmark = pytest.mark.timeout(60)

H100 = profiles.load("dgx-h100")
T0 = 1_000_000.0


def pci(i: int) -> str:
    return f"0000:{0x18 + i:02x}:00.0"


def gpus(n: int = 8, over: dict[int, dict[str, float]] | None = None, reasons: dict[int, list[str]] | None = None,
         driver: str = "550.90.07") -> list[Sample]:
    out = [Sample.of("gpu_devices", n)]
    for i in range(n):
        lab = dict(gpu=i, uuid=f"GPU-{i:04d}", pci_bus_id=pci(i), model=H100.gpu_model)
        vals: dict[str, float] = {
            "gpu_up": 1, "gpu_lost": 0, "gpu_temperature_celsius": 35, "gpu_memory_temperature_celsius": 40,
            "gpu_pcie_link_gen": 5, "gpu_pcie_link_width": 16, "gpu_utilization_ratio": 0.0,
            "gpu_remapped_rows_pending": 0, "gpu_remapped_rows_failure": 0, "gpu_persistence_mode": 1,
            "gpu_fabric_state": 3, "gpu_fabric_healthy": 1,
        }
        vals.update((over or {}).get(i, {}))
        unc = vals.pop("unc", 0)
        out += [Sample.of(k, v, **lab) for k, v in vals.items()]
        out.append(Sample.of("gpu_ecc_errors", unc, type="uncorrected", scope="volatile", **lab))
        out.append(Sample.of("gpu_info", 1, driver_version=driver, **lab))
        for r in (reasons or {}).get(i, []):
            out.append(Sample.of("gpu_clocks_event_active", 1, reason=r, **lab))
    return out


def snap(nvml: list[Sample], now: float, uptime: float | None = 30 * 86400.0,
         events: tuple[Event, ...] = ()) -> Snapshot:
    host = (Sample.of("host_uptime_seconds", uptime),) if uptime is not None else ()
    cols = {
        "nvml": CollectorState("nvml", samples=tuple(nvml), stale=False, last_success=now, last_attempt=now),
        "host": CollectorState("host", samples=host, stale=False, last_success=now, last_attempt=now),
        "kmsg": CollectorState("kmsg", samples=(), stale=False, last_success=now, last_attempt=now),
    }
    return Snapshot(now, cols, events)


def evaluator(fail_after: int = 1, grace: float = 300.0) -> Evaluator:
    return Evaluator(H100, ChecksConfig(damping=DampingConfig(fail_after=fail_after, recover_after=1), grace=grace),
                     enabled=["nvml", "host", "kmsg"])


def by_key(res: tuple[CheckResult, ...]) -> dict[tuple[str, str], CheckResult]:
    return {(r.check, r.entity): r for r in res}


# ---- rules.yaml --------------------------------------------------------------------------------

def test_shipped_rules_name_real_checks_and_mark_every_fatal_kind_immediate() -> None:
    r = rules.load()
    check_rules(r)
    assert set(r.damping) <= set(CHECKS)
    for fatal in ("xid", "gpu_lost", "ecc", "row_remap"):
        assert r.damp(fatal).immediate, fatal
    for noisy, n in (("temperature", 3), ("clocks", 3), ("pcie", 5)):
        assert r.damp(noisy).consecutive == n and not r.damp(noisy).immediate
    assert r.clock_reasons["sw_power_cap"].status is Status.OK


@pytest.mark.parametrize("text, where", [
    ("damping:\n  pcie: {consecutive: 0}\n", ":2: damping.pcie.consecutive: expected a whole number >= 1, got 0"),
    ("damping:\n  pcie: {consecutive: five}\n", ":2: damping.pcie.consecutive: expected a whole number"),
    ("damping:\n  pcie: {consecutive: true}\n", ":2: damping.pcie.consecutive"),
    ("damping:\n  pcie:\n    consecutive: 3\n    consecutve: 4\n", ":4: damping.pcie.consecutve: unknown key"),
    ("damping:\n  xid: {immediate: yes please}\n", ":2: damping.xid.immediate: expected true or false"),
    ("damping:\n  xid: {immediate: true, consecutive: 2}\n", ":2: damping.xid: immediate and consecutive contradict"),
    ("damping:\n  xid: {}\n", ":2: damping.xid: give immediate: true or consecutive: N"),
    ("damping:\n  xid: {immediate: true}\n  xid: {immediate: false}\n", ":3: damping.xid: given twice"),
    ("dampning:\n  xid: {immediate: true}\n", ":1: dampning: unknown section"),
    ("clock_reasons:\n  hw_slowdown: {status: BAD, means: x}\n", ":2: clock_reasons.hw_slowdown.status: expected OK, WARN or FAIL"),
    ("clock_reasons:\n  hw_slowdown: {status: WARN, action: DRAIN, means: x}\n", "only a FAIL asks for an action"),
    ("clock_reasons:\n  hw_slowdown: {status: FAIL, action: NUKE, means: x}\n", "clock_reasons.hw_slowdown.action: expected one of"),
    ("clock_reasons:\n  hw_slowdown: {status: FAIL, means: x, explained_by: [nope]}\n", "'nope' is not a listed reason"),
    ("damping: [\n", "not valid YAML"),
])
def test_bad_rules_are_clear_errors_with_file_line_and_key(text: str, where: str) -> None:
    with pytest.raises(RulesError) as e:
        rules.parse(text, "site-rules.yaml")
    assert str(e.value).startswith("site-rules.yaml"), e.value
    assert where in str(e.value), e.value


def test_rules_naming_an_unknown_check_are_refused() -> None:
    with pytest.raises(RulesError, match="unknown checks temprature"):
        check_rules(rules.parse("damping:\n  temprature: {consecutive: 3}\n", "x.yaml"))


# ---- consecutive readings per rule --------------------------------------------------------------

def test_noisy_values_need_their_consecutive_readings() -> None:
    """fail_after 1 at the site, yet a hot GPU needs 3 readings and a narrow PCIe link 5."""
    ev = evaluator(fail_after=1)
    bad = gpus(over={2: {"gpu_temperature_celsius": 93, "gpu_pcie_link_width": 8}})
    seen = []
    for k in range(5):
        res = by_key(ev.evaluate(snap(bad, T0 + k), T0 + k))
        seen.append((res[("temperature", "gpu2")].status, res[("pcie", "gpu2")].status))
    assert [t for t, _ in seen] == [Status.OK, Status.OK, Status.FAIL, Status.FAIL, Status.FAIL]
    assert [p for _, p in seen] == [Status.OK] * 4 + [Status.FAIL]
    # A healthy reading in between starts the count again: one hot reading is not a trend.
    ev2 = evaluator(fail_after=1)
    for k, hot in enumerate([True, True, False, True, True]):
        res = by_key(ev2.evaluate(snap(gpus(over={2: {"gpu_temperature_celsius": 93}}) if hot else gpus(), T0 + k), T0 + k))
        assert res[("temperature", "gpu2")].status is Status.OK, k


def test_site_fail_after_above_the_rule_wins() -> None:
    d = Damper(4, 1, rules.load().damping)
    r = CheckResult("temperature", Status.FAIL, "gpu1", action=Action.DRAIN)
    assert [d.apply(r, float(t)).status for t in range(4)] == [Status.OK] * 3 + [Status.FAIL]


# ---- fatal facts never wait ----------------------------------------------------------------------

FATAL = {
    "xid79": (lambda: gpus(), (Event(kind="xid", code=79, time=T0 - 1, pci_bus_id=pci(3),
                                     text="NVRM: Xid (PCI:0000:1b:00): 79, pid=0, GPU has fallen off the bus."),),
              ("xid", "gpu3"), Action.REBOOT),
    "dbe": (lambda: gpus(over={1: {"unc": 2}}), (), ("ecc", "gpu1"), Action.RESET_GPU),
    "row_remap_failure": (lambda: gpus(over={2: {"gpu_remapped_rows_failure": 1}}), (), ("row_remap", "gpu2"), Action.REPLACE),
    "gpu_lost": (lambda: gpus(over={4: {"gpu_up": 0, "gpu_lost": 1}}), (), ("gpu_lost", "gpu4"), Action.REBOOT),
}


@pytest.mark.parametrize("kind", sorted(FATAL))
def test_fatal_kind_fences_at_first_reading_even_in_boot_grace(kind: str) -> None:
    samples, events, key, action = FATAL[kind]
    ev = evaluator(fail_after=5)
    res = by_key(ev.evaluate(snap(samples(), T0, uptime=20.0, events=events), T0))
    r = res[key]
    assert r.status is Status.FAIL and r.action is action, r
    assert "grace" not in dict(r.evidence)


# ---- boot and driver grace -----------------------------------------------------------------------

FABRIC_BAD: dict[int, dict[str, float]] = {5: {"gpu_fabric_state": 2, "gpu_fabric_healthy": 0}}


def test_recent_boot_holds_a_non_fatal_fail_as_warn_until_the_grace_ends() -> None:
    ev = evaluator(fail_after=1, grace=300.0)
    boot = T0 - 60.0
    res = by_key(ev.evaluate(snap(gpus(over=FABRIC_BAD), T0, uptime=60.0), T0))
    r = res[("fabric", "gpu5")]
    assert r.status is Status.WARN and r.action is Action.NONE
    ev_ = dict(r.evidence)
    assert ev_["grace"].startswith("in boot grace until ") and ev_["held"] == "FAIL REBOOT"
    assert "held as WARN: in boot grace until" in r.summary
    # Same nvml collection judged after the grace: the held FAIL shows without waiting for new data.
    later = boot + 301.0
    res = by_key(ev.evaluate(snap(gpus(over=FABRIC_BAD), T0, uptime=60.0), later))
    assert res[("fabric", "gpu5")].status is Status.FAIL and res[("fabric", "gpu5")].action is Action.REBOOT
    assert "grace" not in dict(res[("fabric", "gpu5")].evidence)


def test_long_uptime_or_unknown_boot_time_gives_no_grace() -> None:
    for uptime in (30 * 86400.0, None):
        ev = evaluator(fail_after=1)
        res = by_key(ev.evaluate(snap(gpus(over=FABRIC_BAD), T0, uptime=uptime), T0))
        assert res[("fabric", "gpu5")].status is Status.FAIL, uptime


def test_grace_zero_turns_it_off() -> None:
    ev = evaluator(fail_after=1, grace=0.0)
    res = by_key(ev.evaluate(snap(gpus(over=FABRIC_BAD), T0, uptime=10.0), T0))
    assert res[("fabric", "gpu5")].status is Status.FAIL


def test_driver_version_change_starts_a_grace_the_first_sighting_does_not() -> None:
    ev = evaluator(fail_after=1)
    res = by_key(ev.evaluate(snap(gpus(driver="535.104.05"), T0), T0))
    assert all(r.status is Status.OK for r in res.values() if r.check != "driver")
    res = by_key(ev.evaluate(snap(gpus(over=FABRIC_BAD, driver="550.90.07"), T0 + 10), T0 + 10))
    r = res[("fabric", "gpu5")]
    assert r.status is Status.WARN and "driver change 535.104.05 -> 550.90.07 grace" in dict(r.evidence)["grace"]
    res = by_key(ev.evaluate(snap(gpus(over=FABRIC_BAD, driver="550.90.07"), T0 + 400), T0 + 400))
    assert res[("fabric", "gpu5")].status is Status.FAIL


def test_held_evidence_stays_bounded() -> None:
    r = CheckResult("fabric", Status.FAIL, "gpu1", tuple((f"k{i}", "v") for i in range(16)), Action.REBOOT)
    out = Damper(1, 1).apply(r, 10.0, grace=Grace(100.0, "boot"))
    assert out.status is Status.WARN and len(out.evidence) == 16 and out.evidence[0][0] == "grace"


# ---- clocks: one node-level finding ----------------------------------------------------------------

def clocks(reasons: dict[int, list[str]], n: int = 8) -> CheckResult:
    ev = evaluator(fail_after=1)
    res = by_key(ev.evaluate(snap(gpus(n, reasons=reasons), T0), T0, damped=False))
    assert not any(k[0] == "clocks" and k[1] != "node" for k in res), "one finding, not one per GPU"
    return res[("clocks", "node")]


def test_power_brake_on_every_gpu_is_one_node_warning_naming_them() -> None:
    r = clocks({i: ["hw_slowdown", "hw_power_brake_slowdown", "sw_power_cap"] for i in range(8)})
    assert r.status is Status.WARN and r.action is Action.NONE
    ev = dict(r.evidence)
    assert ev["gpus"] == "0,1,2,3,4,5,6,7" and ev["hw_power_brake_slowdown"] == "0,1,2,3,4,5,6,7"
    assert "hw_slowdown" not in ev            # explained by the power brake: no separate FAIL
    assert "(8 of 8)" in r.summary and "PSU" in r.summary


def test_sw_power_cap_and_sw_thermal_alone_never_fail() -> None:
    r = clocks({i: ["sw_power_cap"] for i in range(8)} | {3: ["sw_power_cap", "sw_thermal_slowdown"]})
    assert r.status is Status.OK and "sw_power_cap" in dict(r.evidence)["reasons"]


def test_thermal_slowdown_on_one_gpu_drains_naming_it_with_the_brake_also_listed() -> None:
    r = clocks({6: ["hw_slowdown", "hw_thermal_slowdown"], 0: ["hw_slowdown", "hw_power_brake_slowdown"]})
    assert r.status is Status.FAIL and r.action is Action.DRAIN
    assert dict(r.evidence)["gpus"] == "0,6" and r.summary.startswith("GPU 6: HW thermal slowdown")
    assert "GPU 0: HW power brake" in r.summary


def test_unexplained_hw_slowdown_fails() -> None:
    r = clocks({2: ["hw_slowdown"]})
    assert r.status is Status.FAIL and dict(r.evidence)["hw_slowdown"] == "2"


_REASON_NAMES = {"SW Power Cap": "sw_power_cap", "HW Slowdown": "hw_slowdown",
                 "HW Thermal Slowdown": "hw_thermal_slowdown", "HW Power Brake Slowdown": "hw_power_brake_slowdown",
                 "SW Thermal Slowdown": "sw_thermal_slowdown", "Idle": "gpu_idle"}


def _capture_reasons(text: str) -> dict[int, list[str]]:
    """Active clocks-event reasons per GPU from `nvidia-smi -q` (test helper, not a parser we ship)."""
    out: dict[int, list[str]] = {}
    for i, block in enumerate(re.split(r"\n    Clocks (?:Event|Throttle) Reasons\n", text)[1:]):
        active = []
        for line in block.splitlines():
            m = re.match(r"^\s{8,}(.+?)\s+:\s+(Active|Not Active)\s*$", line)
            if not m:
                break
            if m.group(2) == "Active" and m.group(1) in _REASON_NAMES:
                active.append(_REASON_NAMES[m.group(1)])
        out[i] = active
    return out


def test_real_healthy_h100_capture_gets_no_clocks_fail(shared_fixtures: Path) -> None:
    text = (shared_fixtures / "nvidia_smi" / "nvidia-smi-q_h100_8gpu_gpud_535.183.01.out.0.valid.txt").read_text()
    reasons = _capture_reasons(text)
    assert len(reasons) == 8 and "sw_power_cap" in reasons[2] and "sw_thermal_slowdown" in reasons[2]
    r = clocks(reasons)
    assert r.status is not Status.FAIL, r
