"""Site XID/SXid and threshold policy (issue 28 §3): refused with file:line when malformed,
applied to the verdict, named in the evidence of every verdict it changed, and shown by
`podhealth config show --effective`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from podhealth import config, configload
from podhealth.checks import profiles
from podhealth.checks.passive import xid
from podhealth.checks.passive.engine import Evaluator
from podhealth.config_policy import CodePolicy, PolicyConfig, apply_code
from podhealth.snapshot import CollectorState, Snapshot
from podhealth.vocab import Action, CheckResult, Event, Status
from tests.unit.test_checks_passive import gpu_samples

pytestmark = pytest.mark.timeout(60)
H100 = profiles.load("dgx-h100")
GPUS = {"0000:18:00.0": (0, "GPU-0"), "0000:19:00.0": (1, "GPU-1")}


def xid_event(code: int, t: float, pci: str = "0000:18:00.0") -> Event:
    return Event("xid", code, t, f"NVRM: Xid (PCI:{pci}): {code}, pid=1, name=python3, test", pci_bus_id=pci)


def gpu0(events: list[Event], pol: PolicyConfig | None = None, now: float = 1000.0, window: float = 300.0) -> CheckResult:
    [r] = [r for r in xid.evaluate_xids(events, xid.load_catalog(), now, window, GPUS, policy=pol)
           if r.entity == "gpu0"]
    return r


def policy(text: str) -> PolicyConfig:
    return config.loads(text).checks.policy


def test_without_policy_the_catalog_decides() -> None:
    assert gpu0([xid_event(31, 990.0)]).status is Status.WARN
    r = gpu0([xid_event(79, 990.0)])
    assert (r.status, r.action) == (Status.FAIL, Action.REBOOT) and "policy" not in dict(r.evidence)


def test_fence_now_fails_at_the_first_incident_and_says_why() -> None:
    pol = policy("checks:\n  policy:\n    xid:\n      31: {fence: now, action: DRAIN}\n")
    r = gpu0([xid_event(31, 990.0)], pol)
    ev = dict(r.evidence)
    assert (r.status, r.action) == (Status.FAIL, Action.DRAIN)
    assert ev["policy"].startswith("checks.policy.xid.31: fence now, action DRAIN")
    assert "catalog: RESTART_APP warning" in ev["policy"] and ev["without_policy"] == "WARN RESTART_APP"


def test_never_fence_caps_a_critical_code_at_warn() -> None:
    pol = policy("checks:\n  policy:\n    xid:\n      79: {fence: never}\n")
    r = gpu0([xid_event(79, 990.0)], pol)
    assert (r.status, r.action) == (Status.WARN, Action.REBOOT)
    assert dict(r.evidence)["without_policy"] == "FAIL REBOOT"


def test_action_alone_replaces_the_catalogs_action() -> None:
    pol = policy("checks:\n  policy:\n    xid:\n      79: {action: REPLACE}\n")
    r = gpu0([xid_event(79, 990.0)], pol)
    assert (r.status, r.action) == (Status.FAIL, Action.REPLACE) and "action REPLACE" in dict(r.evidence)["policy"]


def test_count_and_window() -> None:
    pol = policy("checks:\n  policy:\n    xid:\n      31: {count: 3, window: 3600, action: RESET_GPU}\n")
    # incidents are bursts (incident_gap_s apart): 3 incidents over an hour, beyond the 300 s rate window
    two = [xid_event(31, t) for t in (-1000.0, 500.0)]
    r = gpu0(two, pol)
    assert (r.status, r.action) == (Status.WARN, Action.RESET_GPU) and "2 incidents" in dict(r.evidence)["policy"]
    r = gpu0(two + [xid_event(31, 990.0)], pol)
    assert (r.status, r.action) == (Status.FAIL, Action.RESET_GPU)
    # an incident older than the window does not count
    assert gpu0([xid_event(31, t) for t in (-3000.0, 500.0, 990.0)], pol).status is Status.WARN
    # a burst of lines is one incident
    assert gpu0([xid_event(31, 990.0 + i * 0.01) for i in range(5)], pol).status is Status.WARN


def test_sxid_policy() -> None:
    e = Event("sxid", 20034, 990.0, "nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 20034, Fatal, Link 30 LTSSM Fault Up",
              device="nvswitch3")
    [r] = xid.evaluate_xids([e], xid.load_catalog(), 1000.0, 300.0)
    assert r.status is Status.FAIL
    [r] = xid.evaluate_xids([e], xid.load_catalog(), 1000.0, 300.0,
                            policy=policy("checks:\n  policy:\n    sxid:\n      20034: {fence: never}\n"))
    assert r.status is Status.WARN and dict(r.evidence)["policy"].startswith("checks.policy.sxid.20034: fence never")


def test_apply_code_table() -> None:
    assert apply_code("RESTART_APP", "warning", CodePolicy(fence="now"), 1) == ("RESTART_APP", "critical")
    assert apply_code("NONE", "info", CodePolicy(fence="now"), 1) == ("DRAIN", "critical")
    assert apply_code("REBOOT", "critical", CodePolicy(fence="never"), 9) == ("REBOOT", "warning")
    assert apply_code("NONE", "info", CodePolicy(count=2), 2) == ("DRAIN", "critical")
    assert apply_code("REBOOT", "critical", CodePolicy(count=2), 1) == ("REBOOT", "warning")
    assert apply_code("REBOOT", "critical", CodePolicy(action="DRAIN"), 1) == ("DRAIN", "critical")


BAD = """\
checks:
  policy:
    xid:
      31: {fence: sometimes}
      48: {}
      79: {fence: never, count: 2}
      94: {action: FENCE}
      95: {window: 60}
    sxid:
      12345: {fence: never}
    thresholds: {gpu_temp_warn_c: 80}
"""


def test_malformed_policy_is_refused_with_file_line_and_key() -> None:
    errors = [str(e) for e in configload.check_text(config.Config, BAD, "site.yaml")]
    assert errors == [
        "site.yaml:4: checks.policy.xid.31.fence: expected one of 'catalog', 'never', 'now', got \"sometimes\"",
        "site.yaml:5: checks.policy.xid.48.action: states nothing: give action, fence or count",
        "site.yaml:6: checks.policy.xid.79.count: fence: never and a count contradict each other: give one",
        "site.yaml:7: checks.policy.xid.94.action: expected one of 'NONE', 'RESTART_APP', 'RESET_GPU', 'DRAIN', "
        "'REBOOT', 'REPLACE', got \"FENCE\"",
        "site.yaml:8: checks.policy.xid.95.window: a window needs a count",
    ]
    unknown = "checks:\n  policy:\n    xid:\n      31: {fence: now}\n      9999: {fence: never}\n"
    assert [str(e) for e in configload.check_text(config.Config, unknown, "s.yaml")] == [
        "s.yaml:5: checks.policy.xid.9999: XID 9999 is not in the shipped catalog (checks/data/xid_catalog.yaml)"]
    sx = "checks:\n  policy:\n    sxid:\n      12345: {fence: never}\n"
    assert "s.yaml:4: checks.policy.sxid.12345: SXid 12345 is not in the shipped catalog" in str(
        configload.check_text(config.Config, sx, "s.yaml")[0])
    th = "checks:\n  policy:\n    thresholds:\n      gpu_temp_warn: 80\n"
    assert str(configload.check_text(config.Config, th, "s.yaml")[0]).startswith(
        "s.yaml:4: checks.policy.thresholds.gpu_temp_warn: unknown threshold (known: ")
    dup = "checks:\n  policy:\n    xid:\n      31: {fence: now}\n      31: {fence: never}\n"
    assert [str(e) for e in configload.check_text(config.Config, dup, "s.yaml")] == [
        "s.yaml:5: checks.policy.xid.31: duplicate key"]


def temps(core: float) -> Snapshot:
    samples = gpu_samples(8, gpu={0: {"gpu_temperature_celsius": core}})
    st = CollectorState("nvml", samples=tuple(samples), last_success=1000.0, last_attempt=1000.0, stale=False)
    return Snapshot(1000.0, {"nvml": st})


def temperature(text: str, core: float) -> CheckResult:
    cfg = config.loads(text).checks
    ev = Evaluator(H100, cfg, enabled=["nvml"])
    [r] = [r for r in ev.evaluate(temps(core), 1000.0, damped=False, only=["temperature"]) if r.entity == "gpu0"]
    return r


def test_a_site_threshold_is_named_in_the_verdicts_it_changed() -> None:
    site = "checks:\n  policy:\n    thresholds: {gpu_temp_warn_c: 80}\n"
    assert temperature("", 82).status is Status.OK
    r = temperature(site, 82)
    ev = dict(r.evidence)
    assert r.status is Status.WARN
    assert ev["policy"] == "checks.policy.thresholds: gpu_temp_warn_c=80 (profile 85)"
    assert ev["without_policy"] == "OK NONE"
    # a verdict the threshold did not change says nothing of it
    assert "policy" not in dict(temperature(site, 70).evidence)
    assert "policy" not in dict(temperature(site, 88).evidence)  # WARN either way


def podhealth(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "podhealth", *args], capture_output=True, text=True, timeout=60)


def test_config_show_effective(tmp_path: Path) -> None:
    f = tmp_path / "site.yaml"
    f.write_text("publish: {token: abcdefghijklmnopqrstuvwxyz0123456789}\n"
                 "checks:\n  site:\n    peermem: {argv: [/opt/peermem], action: DRAIN, env: {API_TOKEN: s3cr3t-value}}\n"
                 "  policy:\n    xid:\n      31: {count: 3, window: 3600, action: RESET_GPU}\n"
                 "      79: {fence: never}\n    thresholds: {gpu_temp_warn_c: 80}\n")
    r = podhealth("config", "show", "--effective", str(f))
    assert r.returncode == 0, r.stderr
    import yaml
    eff = yaml.safe_load(r.stdout)["effective"]
    assert eff["xid"][31] == {"catalog": "RESTART_APP warning", "site": "3 in 3600s, action RESET_GPU",
                              "effective": "RESET_GPU critical from 3 incidents, else RESET_GPU warning"}
    assert eff["xid"][79]["effective"] == "REBOOT warning"
    assert eff["thresholds"]["gpu_temp_warn_c"] == {"profile": 85, "site": 80.0}
    assert eff["site_checks"]["site_peermem"]["a FAIL asks for"] == "DRAIN"
    shown = podhealth("config", "show", str(f))
    assert shown.returncode == 0 and "abcdefghijklmnopqrstuvwxyz" not in shown.stdout and "<hidden>" in shown.stdout
    assert "s3cr3t-value" not in shown.stdout
    assert config.loads(shown.stdout.replace("<hidden>", "abcdefghijklmnopqrstuvwxyz0123456789")).checks.policy.xid[31].count == 3
    f.write_text("checks:\n  policy:\n    xid:\n      9999: {fence: never}\n")
    bad = podhealth("config", "show", "--effective", str(f))
    assert bad.returncode == 2 and "site.yaml:4: checks.policy.xid.9999" in bad.stderr and bad.stdout == ""


def test_site_thresholds_reach_every_user_of_the_profile() -> None:
    from podhealth.checks import policy as site_policy
    cfg = config.loads("checks:\n  policy:\n    thresholds: {nccl_allreduce_busbw_gbps: 250, gpu_temp_warn_c: 80}\n")
    prof = profiles.of_config(cfg)  # what burn-in, NCCL and the agent's limits read
    assert prof.threshold("nccl_allreduce_busbw_gbps") == 250.0 and prof.thresholds["gpu_temp_warn_c"] == 80.0
    assert site_policy.base(prof).thresholds["gpu_temp_warn_c"] == 85
    assert site_policy.apply(prof, cfg.checks.policy) == prof  # applying twice changes nothing
    assert dict(site_policy.site_values(prof)) == {"nccl_allreduce_busbw_gbps": 250.0, "gpu_temp_warn_c": 80.0}
    # the Evaluator given of_config's profile still names what the site changed
    ev = Evaluator(prof, cfg.checks, enabled=["nvml"])
    [r] = [r for r in ev.evaluate(temps(82), 1000.0, damped=False, only=["temperature"]) if r.entity == "gpu0"]
    assert r.status is Status.WARN and dict(r.evidence)["policy"] == "checks.policy.thresholds: gpu_temp_warn_c=80 (profile 85)"
