"""Site checks (issue 28 §2): the program runner (core/subproc.py), the protocol parser
(collectors/site_parse.py), the verdict (checks/passive/site.py) inside the engine's damping,
grace and staleness, and the shipped examples (examples/checks/) against fixture roots."""

from __future__ import annotations

import os
import stat
import textwrap
import time
from pathlib import Path

import pytest

from podhealth import config, subproc
from podhealth.checks import profiles
from podhealth.checks.passive.engine import Evaluator
from podhealth.collectors import site, site_parse
from podhealth.collectors.runtime import collector_config
from podhealth.config_policy import SiteCheckConfig
from podhealth.snapshot import CollectorState, Snapshot
from podhealth.vocab import Action, CheckResult, ProgramReport, Status

pytestmark = pytest.mark.timeout(60)
EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "checks"
H100 = profiles.load("dgx-h100")


def script(tmp_path: Path, body: str, name: str = "check") -> str:
    p = tmp_path / name
    p.write_text("#!/bin/sh\n" + textwrap.dedent(body))
    p.chmod(0o755)
    return str(p)


# ---- running the program ---------------------------------------------------------------------------


def test_no_shell_argv_is_passed_as_given(tmp_path: Path) -> None:
    r = subproc.run(["/bin/echo", "a; touch " + str(tmp_path / "pwned"), "$HOME"], 5)
    assert r.exit_code == 0 and r.stdout == f"a; touch {tmp_path / 'pwned'} $HOME\n".encode()
    assert not (tmp_path / "pwned").exists()


def test_timeout_kills_the_whole_process_group(tmp_path: Path) -> None:
    pidfile = tmp_path / "child"
    argv = script(tmp_path, f"sleep 300 & echo $! > {pidfile}\necho started\nwait\n")
    r = subproc.run([argv], 1.0, env={"PATH": "/usr/bin:/bin"})
    assert r.exit_code is None and r.timed_out and r.stdout == b"started\n"
    child = int(pidfile.read_text())
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:  # the killed child is reaped by init: wait for it to go
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        pytest.fail(f"the program's child {child} outlived the timeout")


def test_term_grace_lets_a_client_clean_up_before_the_kill(tmp_path: Path) -> None:
    mark = tmp_path / "cleaned-up"
    argv = script(tmp_path, f"trap 'echo bye > {mark}; exit 0' TERM\necho up\nwhile :; do sleep 0.05; done\n")
    r = subproc.run([argv], 0.5, env={"PATH": "/usr/bin:/bin"}, term_grace=5.0)
    assert r.timed_out and r.exit_code is None and mark.read_text() == "bye\n"
    mark.unlink()
    r = subproc.run([argv], 0.5, env={"PATH": "/usr/bin:/bin"})  # no grace: SIGKILL, no trap runs
    assert r.timed_out and not mark.exists()


def test_a_program_that_closes_its_output_and_runs_on_times_out() -> None:
    r = subproc.run(["/bin/sh", "-c", "echo bye; exec >&- 2>&-; sleep 30"], 1.0, env={"PATH": "/usr/bin:/bin"})
    assert r.timed_out and r.exit_code is None and r.stdout == b"bye\n" and "did not finish" in r.why


def test_merge_stderr_keeps_the_order_written() -> None:
    r = subproc.run(["/bin/sh", "-c", "echo 1; echo 2 >&2; echo 3"], 5, env={"PATH": "/usr/bin:/bin"},
                    merge_stderr=True)
    assert r.exit_code == 0 and r.stdout == b"1\n2\n3\n" and r.stderr == b""


def test_output_is_bounded_and_the_program_still_finishes() -> None:
    r = subproc.run(["/bin/sh", "-c", "head -c 5000000 /dev/zero; echo done >&2"], 10,
                    env={"PATH": "/usr/bin:/bin"}, max_output=1000)
    assert r.exit_code == 0 and len(r.stdout) == 1000 and r.truncated and r.stderr == b"done\n"


def test_environment_is_only_what_is_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PODHEALTH_NODE_TOKEN", "secret-of-the-node")
    r = subproc.run(["/usr/bin/env"], 5, env={"A": "1"})
    assert r.stdout == b"A=1\n"


@pytest.mark.skipif(os.geteuid() != 0, reason="dropping privileges needs root")
def test_runs_as_the_configured_user_when_root() -> None:
    r = subproc.run(["/usr/bin/id", "-u"], 5, user="nobody")
    assert r.exit_code == 0 and r.ran_as == "nobody" and r.stdout.strip() != b"0"
    assert subproc.run(["/usr/bin/id"], 5, user="no-such-user-xyz").error == "no such user 'no-such-user-xyz'"


def test_a_program_that_cannot_start_or_is_killed_has_no_exit_code() -> None:
    assert "No such file" in subproc.run(["/nonexistent/probe"], 5).why
    r = subproc.run(["/bin/sh", "-c", "kill -9 $$"], 5)
    assert r.exit_code is None and r.signal == 9 and "SIGKILL" in r.why


# ---- the protocol ----------------------------------------------------------------------------------


def test_parse_summary_and_json_line() -> None:
    out = b'\n{"entity": "gpu3", "action": "drain", "evidence": {"module": "nvidia_peermem", "n": 2}}\npeermem absent\nmore\n'
    r = site_parse.parse(1, out)
    assert (r.summary, r.entity, r.action, dict(r.evidence)) == (
        "peermem absent", "gpu3", "DRAIN", {"module": "nvidia_peermem", "n": "2"})
    assert r.problem == ""


def test_parse_drops_control_characters() -> None:
    r = site_parse.parse(1, b'\x1b[31mdisk\rfull\x07\n{"evidence": {"k": "a\\u001b[0mb"}}\n')
    assert r.summary == "[31mdiskfull" and dict(r.evidence) == {"k": "a[0mb"}


@pytest.mark.parametrize("line, problem", [
    ('{"entity": "gpu3"', "not valid JSON"),
    ('{"entity": "gpu 3; rm"}', "entity must be"),
    ('{"colour": "red"}', "unknown keys colour"),
    ('{"evidence": {"a": {"b": 1}}}', "evidence.a must be"),
    ('{"action": 3}', "action must be a string"),
])
def test_parse_bad_json_lines_are_reported_and_ignored(line: str, problem: str) -> None:
    r = site_parse.parse(0, f"all fine\n{line}\n".encode())
    assert r.exit_code == 0 and r.summary == "all fine" and problem in r.problem


# ---- the verdict -----------------------------------------------------------------------------------


def judged(report: ProgramReport, action: str = "NONE", **ccfg: object) -> CheckResult:
    cfg = config.ChecksConfig(site={"probe": SiteCheckConfig(argv=("/bin/probe",), action=action)}, grace=0,
                              damping=config.DampingConfig(fail_after=1, recover_after=1), **ccfg)  # type: ignore[arg-type]
    ev = Evaluator(H100, cfg, enabled=["site_probe"])
    [r] = [r for r in ev.evaluate(snap(report), 1000.0, damped=False) if r.check == "site_probe"]
    return r


def snap(report: ProgramReport | None, now: float = 1000.0, stale: bool = False) -> Snapshot:
    st = CollectorState("site_probe", reports=(report,) if report else (), last_success=now, last_attempt=now,
                        stale=stale)
    return Snapshot(now, {"site_probe": st})


def test_exit_codes_map_to_ok_fail_unknown() -> None:
    assert judged(ProgramReport(0, "fine"), action="DRAIN").status is Status.OK
    assert judged(ProgramReport(2, "cannot tell"), action="DRAIN").status is Status.UNKNOWN
    r = judged(ProgramReport(3, "segfault"), action="DRAIN")
    assert r.status is Status.UNKNOWN and "exit code 3 is not 0/1/2" in r.summary
    r = judged(ProgramReport(None, problem="did not finish within 10s (killed)"), action="DRAIN")
    assert r.status is Status.UNKNOWN and "killed" in r.summary and r.action is Action.NONE


def test_a_warn_only_check_that_cannot_tell_is_a_warn() -> None:
    # UNKNOWN only where the answer could change the action: a warn-only check cannot fence.
    for report in (ProgramReport(2, "cannot tell"), ProgramReport(3, "segfault"),
                   ProgramReport(None, problem="did not finish within 10s (killed)")):
        r = judged(report)
        assert (r.status, r.action) == (Status.WARN, Action.NONE) and "only warns" in dict(r.evidence)["uncertain"]
        assert r.summary.startswith("could not tell: ")


def test_a_fail_without_a_configured_action_is_a_warn() -> None:
    r = judged(ProgramReport(1, "peermem absent", action="DRAIN"))
    ev = dict(r.evidence)
    assert r.status is Status.WARN and r.action is Action.NONE
    assert ev["held"] == "FAIL DRAIN" and "warns only" in ev["policy"]


def test_a_fail_asks_for_the_configured_action_at_most() -> None:
    r = judged(ProgramReport(1, "peermem absent", entity="gpu3", evidence=(("module", "x"),)), action="DRAIN")
    assert (r.status, r.action, r.entity, dict(r.evidence)["module"]) == (Status.FAIL, Action.DRAIN, "gpu3", "x")
    r = judged(ProgramReport(1, "bad", action="REPLACE"), action="DRAIN")
    assert r.action is Action.DRAIN and "asked REPLACE" in dict(r.evidence)["capped"]
    r = judged(ProgramReport(1, "bad", action="RESET_GPU"), action="DRAIN")
    assert r.action is Action.RESET_GPU
    r = judged(ProgramReport(1, "bad", action="EXPLODE"), action="DRAIN")
    assert r.action is Action.DRAIN and "unknown action" in dict(r.evidence)["problem"]


def test_program_evidence_cannot_overwrite_podhealths() -> None:
    r = judged(ProgramReport(1, "x", evidence=(("exit", "0"), ("check", "y"))), action="DRAIN")
    assert dict(r.evidence)["exit"] == "1" and dict(r.evidence)["check"] == "y"


def engine(**site_kw: object) -> Evaluator:
    sc = SiteCheckConfig(argv=("/bin/probe",), action="DRAIN", **site_kw)  # type: ignore[arg-type]
    cfg = config.ChecksConfig(site={"probe": sc}, grace=300,
                              damping=config.DampingConfig(fail_after=2, recover_after=1))
    return Evaluator(H100, cfg, enabled=["site_probe", "host"])


def with_boot(report: ProgramReport, now: float, uptime: float) -> Snapshot:
    from podhealth.vocab import Sample
    s = snap(report, now)
    host = CollectorState("host", samples=(Sample.of("host_uptime_seconds", uptime),), last_success=now,
                          last_attempt=now, stale=False)
    return Snapshot(now, {**s.collectors, "host": host})


def site_result(results: tuple[CheckResult, ...]) -> CheckResult:
    [r] = [r for r in results if r.check == "site_probe"]
    return r


def test_damping_counts_runs_not_wakeups() -> None:
    ev = engine()
    bad = ProgramReport(1, "bad")
    assert site_result(ev.evaluate(snap(bad, 1000.0), 1000.0)).status is Status.OK  # first failing run: pending
    # the same run judged again (no new collection) does not count twice
    assert site_result(ev.evaluate(snap(bad, 1000.0), 1001.0)).status is Status.OK
    assert site_result(ev.evaluate(snap(bad, 1010.0), 1010.0)).status is Status.FAIL


def test_immediate_site_check_fails_at_once_and_ignores_the_grace() -> None:
    r = site_result(engine(immediate=True).evaluate(with_boot(ProgramReport(1, "bad"), 1000.0, 10.0), 1000.0))
    assert r.status is Status.FAIL and r.action is Action.DRAIN
    ev = engine(consecutive=1)
    ev.evaluate(with_boot(ProgramReport(1, "bad"), 1000.0, 10.0), 1000.0)
    r = site_result(ev.evaluate(with_boot(ProgramReport(1, "bad"), 1010.0, 20.0), 1010.0))
    assert r.status is Status.WARN and "grace" in dict(r.evidence)  # held like a built-in rule


def test_a_stale_site_check_is_unknown() -> None:
    r = site_result(engine().evaluate(snap(ProgramReport(1, "bad"), stale=True), 1000.0))
    assert r.status is Status.UNKNOWN and "site_probe" in r.summary


def test_collector_config_follows_the_site_check() -> None:
    cfg = config.loads("checks:\n  site:\n    probe: {argv: [/bin/true], interval: 30, timeout: 7}\n")
    cc = collector_config(cfg, "site_probe")
    assert (cc.interval, cc.timeout, cc.enabled) == (30.0, 7.0 + site.KILL_GRACE, True)
    assert list(site.factories(cfg)) == ["site_probe"]


# ---- config ----------------------------------------------------------------------------------------


BAD = """\
checks:
  site:
    relative: {argv: [probe.sh]}
    Bad-Name: {argv: [/bin/true]}
    slow: {argv: [/bin/true], interval: 5, timeout: 30}
    wide: {argv: [/bin/true], action: FENCE}
    empty: {interval: 5}
"""


def test_malformed_site_checks_are_refused_with_file_line_and_key(tmp_path: Path) -> None:
    from podhealth import configload
    errors = [str(e) for e in configload.check_text(config.Config, BAD, "site.yaml")]
    assert errors == [
        'site.yaml:3: checks.site.relative.argv: expected an absolute path as argv[0] (no shell, no PATH search), got "probe.sh"',
        "site.yaml:5: checks.site.slow.timeout: expected seconds <= interval (5), got 30",
        "site.yaml:6: checks.site.wide.action: expected one of 'NONE', 'RESTART_APP', 'RESET_GPU', 'DRAIN', 'REBOOT', "
        "'REPLACE', got \"FENCE\"",
        "site.yaml:7: checks.site.empty.argv: expected the program's argv (a list whose first item is an absolute path), got none",
    ]
    ok = configload.check_text(config.Config, "checks:\n  site:\n    Bad-Name: {argv: [/bin/true]}\n", "s.yaml")
    assert [str(e) for e in ok] == ["s.yaml:3: checks.site.Bad-Name: expected a name of lower-case letters, digits "
                                    "and _ (at most 40, starting with a letter)"]


# ---- the shipped examples, end to end through the collector ----------------------------------------


def run_example(name: str, argv_tail: tuple[str, ...] = (), action: str = "DRAIN", **env: str) -> CheckResult:
    sc = SiteCheckConfig(argv=(str(EXAMPLES / name), *argv_tail), action=action, env=env, user="")
    cfg = config.Config(checks=config.ChecksConfig(site={"probe": sc}))
    col = site.factories(cfg)["site_probe"](cfg)
    collection = col.collect()
    now = time.time()
    st = CollectorState("site_probe", reports=collection.reports, last_success=now, last_attempt=now, stale=False)
    ev = Evaluator(H100, cfg.checks, enabled=["site_probe"])
    return site_result(ev.evaluate(Snapshot(now, {"site_probe": st}), now, damped=False))


def test_example_nvidia_peermem(tmp_path: Path) -> None:
    sysfs = tmp_path / "sys"
    (sysfs / "module" / "nvidia").mkdir(parents=True)
    r = run_example("nvidia-peermem", PODHEALTH_SYSFS_ROOT=str(sysfs))
    assert (r.status, r.action, dict(r.evidence)["state"]) == (Status.FAIL, Action.DRAIN, "absent")
    assert r.summary == "nvidia_peermem is not loaded: GPUDirect RDMA is off"
    (sysfs / "module" / "nvidia_peermem").mkdir()
    (sysfs / "module" / "nvidia_peermem" / "initstate").write_text("live\n")
    assert run_example("nvidia-peermem", PODHEALTH_SYSFS_ROOT=str(sysfs)).status is Status.OK
    (sysfs / "module" / "nvidia_peermem" / "initstate").write_text("going\n")
    assert run_example("nvidia-peermem", PODHEALTH_SYSFS_ROOT=str(sysfs)).status is Status.FAIL
    r = run_example("nvidia-peermem", PODHEALTH_SYSFS_ROOT=str(tmp_path / "nowhere"))
    assert r.status is Status.UNKNOWN


def test_example_container_runtime(tmp_path: Path) -> None:
    import socket
    root = tmp_path / "root"
    (root / "run" / "containerd").mkdir(parents=True)
    (root / "etc" / "containerd").mkdir(parents=True)
    (root / "usr" / "bin").mkdir(parents=True)
    r = run_example("container-runtime", PODHEALTH_ROOTFS=str(root))
    assert r.status is Status.FAIL and "not listening" in r.summary
    sock = socket.socket(socket.AF_UNIX)
    try:
        sock.bind(str(root / "run" / "containerd" / "containerd.sock"))
        conf = root / "etc" / "containerd" / "config.toml"
        conf.write_text('version = 2\n[plugins."io.containerd.grpc.v1.cri".containerd]\n  default_runtime_name = "runc"\n')
        r = run_example("container-runtime", PODHEALTH_ROOTFS=str(root))
        assert r.status is Status.FAIL and "no nvidia runtime" in r.summary
        conf.write_text(conf.read_text() + '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia.options]\n'
                        '  BinaryName = "/usr/bin/nvidia-container-runtime"\n')
        assert "missing" in run_example("container-runtime", PODHEALTH_ROOTFS=str(root)).summary
        rt = root / "usr" / "bin" / "nvidia-container-runtime"
        rt.write_text("#!/bin/sh\n")
        rt.chmod(rt.stat().st_mode | stat.S_IXUSR)
        assert run_example("container-runtime", PODHEALTH_ROOTFS=str(root)).status is Status.OK
    finally:
        sock.close()


def proc_tree(root: Path, procs: list[tuple[int, str, str, str]]) -> None:
    for pid, comm, state, wchan in procs:
        d = root / str(pid)
        d.mkdir(parents=True)
        (d / "stat").write_text(f"{pid} ({comm}) {state} 1 {pid} {pid} 0 -1 4194560 0 0\n")
        (d / "wchan").write_text(wchan)
    (root / "self").mkdir(exist_ok=True)


def test_example_dstate(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    proc_tree(proc, [(1, "systemd", "S", "ep_poll"), (200, "python3 (rank 0)", "R", "0"),
                     (301, "kworker/u:2", "D", "io_schedule")])
    r = run_example("dstate", PODHEALTH_PROCFS_ROOT=str(proc))
    assert r.status is Status.OK and dict(r.evidence)["d_state"] == "1"
    proc_tree(proc, [(4242, "nvidia-smi", "D", "os_acquire_mutex")])
    r = run_example("dstate", PODHEALTH_PROCFS_ROOT=str(proc))
    assert (r.status, r.action) == (Status.FAIL, Action.DRAIN)
    assert dict(r.evidence)["in_driver"] == "4242/nvidia-smi@os_acquire_mutex"
    many = tmp_path / "many"
    proc_tree(many, [(100 + i, "cp", "D", "nfs_wait_bit_killable") for i in range(4)])
    assert run_example("dstate", ("--max", "3"), PODHEALTH_PROCFS_ROOT=str(many)).status is Status.FAIL
    assert run_example("dstate", ("--max", "4"), PODHEALTH_PROCFS_ROOT=str(many)).status is Status.OK
    assert run_example("dstate", ("--bogus",), PODHEALTH_PROCFS_ROOT=str(many)).status is Status.UNKNOWN


async def test_the_handover_suite_runs_site_checks(tmp_path: Path) -> None:
    from podhealth.checks.handover.suite import LocalCollector, run_suite
    probe = script(tmp_path, 'echo "scratch filesystem full"\necho \'{"evidence": {"used": "100%"}}\'\nexit 1\n')
    cfg = config.loads(f"checks:\n  site:\n    scratch: {{argv: [{probe}], action: DRAIN, user: ''}}\n")
    report = await run_suite(cfg, LocalCollector(cfg, only=("site_scratch",)), "dgx01")
    [r] = [r for r in report.results if r.check == "site_scratch"]
    assert (r.status, r.action, r.summary, dict(r.evidence)["used"]) == (
        Status.FAIL, Action.DRAIN, "scratch filesystem full", "100%")


def test_config_check_notes_a_program_missing_on_this_host(tmp_path: Path) -> None:
    import subprocess
    import sys
    f = tmp_path / "c.yaml"
    f.write_text(f"checks:\n  site:\n    gone:\n      argv: [{tmp_path}/nope]\n    ok:\n      argv: [/bin/true]\n")
    r = subprocess.run([sys.executable, "-m", "podhealth", "config", "check", str(f)], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0 and r.stdout == f"{f}: OK\n"
    assert r.stderr == (f"c.yaml:4: checks.site.gone.argv: note: {tmp_path}/nope does not exist on this host "
                        "(the check will be UNKNOWN where it is so)\n")
