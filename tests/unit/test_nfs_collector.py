"""The nfs collector: mountstats + rpc/nfs series, configured mounts, and the killable stat probe."""

from __future__ import annotations

import os
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Sequence

import pytest

from podhealth.collectors import REGISTRY, factory
from podhealth.collectors.nfs import NfsCollector, create, default_probe_argv
from podhealth.collectors.probe import Probe
from podhealth.config import CollectorsConfig, Config, NfsConfig, NfsMount, PathsConfig
from podhealth.vocab import Sample
from tests.harness.proc import wait_until

SLEEP = shutil.which("sleep") or "/bin/sleep"
# Probe helpers speaking collectors/probe.py's protocol: "ready", then one line per request.
OK = ["/bin/sh", "-c", "echo ready; while read _; do echo ok; done"]
HUNG = ["/bin/sh", "-c", f"echo ready; exec {SLEEP} 30"]  # started, then never answers
STALE = ["/bin/sh", "-c", "echo ready; while read _; do echo 'fail Stale file handle: /home'; done"]


def _cfg(proc: Path, *mounts: tuple[str, float], timeout: float = 10.0) -> Config:
    nfs = NfsConfig(timeout=timeout, mounts=tuple(NfsMount(p, t) for p, t in mounts))
    return Config(paths=PathsConfig(procfs_root=proc), collectors=CollectorsConfig(nfs=nfs))


@pytest.fixture
def dgx_proc(own_fixtures: Path, tmp_path: Path) -> Path:
    proc = tmp_path / "proc"
    (proc / "77").mkdir(parents=True)
    shutil.copy(own_fixtures / "nfs" / "mountstats_dgx.txt", proc / "77" / "mountstats")
    (proc / "self").symlink_to("77")
    (proc / "net" / "rpc").mkdir(parents=True)
    shutil.copy(own_fixtures / "nfs" / "rpc_nfs_dgx.txt", proc / "net" / "rpc" / "nfs")
    return proc


def _v(samples: tuple[Sample, ...], name: str, **labels: str) -> float | None:
    want = set(labels.items())
    hits = [s.value for s in samples if s.name == name and want <= set(s.labels)]
    assert len(hits) <= 1, f"{name}{labels}: {hits}"
    return hits[0] if hits else None


def _argv_by_mount(table: dict[str, Sequence[str]]):  # type: ignore[no-untyped-def]
    return lambda mp: list(table[mp])


def test_registered() -> None:
    assert REGISTRY["nfs"] == "podhealth.collectors.nfs:create"


def test_dgx_mounts(dgx_proc: Path) -> None:
    col = factory("nfs")(_cfg(dgx_proc, ("/home", 5.0), ("/cm/shared", 5.0), ("/scratch", 5.0)),
                         probe_argv=lambda mp: OK)
    try:
        r = col.collect()
    finally:
        col.close()
    s = r.samples
    assert len({(x.name, x.labels) for x in s}) == len(s)  # no duplicate series
    assert {x.name for x in s} <= set(col.metrics)
    assert _v(s, "nfs_mount_present", mountpoint="/home") == 1
    assert _v(s, "nfs_mount_present", mountpoint="/cm/shared") == 1
    assert _v(s, "nfs_mount_present", mountpoint="/scratch") == 0
    for mp in ("/home", "/cm/shared", "/scratch"):
        assert _v(s, "nfs_probe_ok", mountpoint=mp) == 1
        assert 0 < _v(s, "nfs_probe_seconds", mountpoint=mp) < 5  # type: ignore[operator]
    home = {"mountpoint": "/home", "export": "10.141.255.254:/home"}
    assert _v(s, "nfs_read_bytes", **home) == 137171591168
    assert _v(s, "nfs_write_bytes", **home) == 38085361664
    assert _v(s, "nfs_operation_requests", operation="READ", **home) == 2093117
    assert _v(s, "nfs_operation_transmissions", operation="READ", **home) == 2093190
    assert _v(s, "nfs_operation_major_timeouts", operation="READ", **home) == 2
    assert _v(s, "nfs_operation_sent_bytes", operation="WRITE", **home) == 38099342808
    assert _v(s, "nfs_operation_received_bytes", operation="READ", **home) == 137177843308
    assert _v(s, "nfs_operation_queue_seconds", operation="WRITE", **home) == 1882.316
    assert _v(s, "nfs_operation_rtt_seconds", operation="READ", **home) == 2412.391
    assert _v(s, "nfs_operation_execute_seconds", operation="READ", **home) == 2514.72
    assert _v(s, "nfs_transport_sends", protocol="tcp", **home) == 9352345
    assert _v(s, "nfs_transport_receives", protocol="tcp", **home) == 9352245
    shared = {"mountpoint": "/cm/shared", "export": "10.141.255.254:/cm/shared"}
    assert _v(s, "nfs_transport_bad_xids", protocol="rdma", **shared) == 0
    assert _v(s, "nfs_transport_sends", protocol="rdma", **shared) == 12190882
    assert _v(s, "nfs_rpc_calls") == 21542007
    assert _v(s, "nfs_rpc_retransmissions") == 176
    assert _v(s, "nfs_rpc_procedure_requests", version="3", procedure="GETATTR") == 4182265
    assert _v(s, "nfs_net_packets", protocol="tcp") == 0
    assert r.errors == ()


def test_missing_files_give_errors_not_zeros(tmp_path: Path) -> None:
    col = NfsCollector(tmp_path, [("/home", 2.0)], probe_argv=lambda mp: OK)
    r = col.collect()
    col.close()
    assert [x.name for x in r.samples] == ["nfs_probe_ok", "nfs_probe_seconds"]  # presence unknown
    assert len(r.errors) == 2 and "mountstats" in r.errors[0] and "rpc/nfs" in r.errors[1]


def test_malformed_mountstats_lines_reported(dgx_proc: Path) -> None:
    ms = dgx_proc / "77" / "mountstats"
    ms.write_text(ms.read_text().replace("READ: 2093117", "READ: x2093117"))
    col = create(_cfg(dgx_proc, ("/home", 2.0)), probe_argv=lambda mp: OK)
    r = col.collect()
    col.close()
    assert _v(r.samples, "nfs_operation_requests", mountpoint="/home", operation="READ") is None
    assert _v(r.samples, "nfs_operation_requests", mountpoint="/home", operation="WRITE") == 581133
    assert len(r.errors) == 1 and "READ" in r.errors[0]


def test_hung_probe_reports_timeout(dgx_proc: Path) -> None:
    col = create(_cfg(dgx_proc, ("/home", 0.5), ("/cm/shared", 5.0)),
                 probe_argv=_argv_by_mount({"/home": HUNG, "/cm/shared": OK}))
    try:
        r = col.collect()
    finally:
        col.close()
    assert _v(r.samples, "nfs_probe_ok", mountpoint="/home") == 0
    assert _v(r.samples, "nfs_probe_seconds", mountpoint="/home") == 0.5
    assert _v(r.samples, "nfs_probe_ok", mountpoint="/cm/shared") == 1
    assert _v(r.samples, "nfs_mount_present", mountpoint="/home") == 1  # listed, but not answering
    assert any("probe /home: timed out" in e for e in r.errors)


def test_probe_honours_the_mount_timeout_not_the_collectors(dgx_proc: Path) -> None:
    """The mount's own timeout decides; a collector timeout below it makes the agent mark the
    collector stale (tests/integration/test_agent_e2e.py relies on that)."""
    col = create(_cfg(dgx_proc, ("/home", 1.2), timeout=0.5), probe_argv=lambda mp: HUNG)
    try:
        r = col.collect()
    finally:
        col.close()
    assert _v(r.samples, "nfs_probe_seconds", mountpoint="/home") == 1.2


def test_failing_probe_reports_the_helpers_reason(dgx_proc: Path) -> None:
    col = create(_cfg(dgx_proc, ("/home", 5.0)), probe_argv=lambda mp: STALE)
    r = col.collect()
    col.close()
    assert _v(r.samples, "nfs_probe_ok", mountpoint="/home") == 0
    assert "probe /home: Stale file handle: /home" in r.errors


def test_a_helper_that_dies_at_start_reports_exit_and_stderr(dgx_proc: Path) -> None:
    col = create(_cfg(dgx_proc, ("/home", 5.0)),
                 probe_argv=lambda mp: [sys.executable, "-c", "import sys; sys.exit('no python here')"])
    r = col.collect()
    col.close()
    assert _v(r.samples, "nfs_probe_ok", mountpoint="/home") == 0
    assert any("exit 1: no python here" in e for e in r.errors)


def test_one_helper_serves_every_probe_and_a_dead_one_is_replaced(tmp_path: Path) -> None:
    p = Probe(default_probe_argv(str(tmp_path)))
    try:
        assert p.run(10.0).ok
        pid = p.pid
        assert pid is not None and all(p.run(10.0).ok for _ in range(5)) and p.pid == pid
        os.kill(pid, signal.SIGKILL)  # OOM killer, an operator: the next probe starts a new helper
        wait_until(lambda: p._proc is not None and p._proc.poll() is not None, 5.0, what="the helper to die")
        r = p.run(10.0)
        assert r.ok and p.pid not in (None, pid)
    finally:
        p.close()
    assert p.pid is None


def test_out_of_step_helper_is_replaced(tmp_path: Path) -> None:
    p = Probe(["/bin/sh", "-c", "echo ready; while read _; do echo maybe; done"])
    try:
        r = p.run(5.0)
        assert not r.ok and "unexpected answer" in r.detail and p.pid is None
    finally:
        p.close()


def test_hung_probes_run_concurrently(dgx_proc: Path) -> None:
    """Three hung mounts with 1.5 s timeouts cost one timeout, not three (4.5 s)."""
    mounts = [("/home", 1.5), ("/cm/shared", 1.5), ("/scratch", 1.5)]
    col = create(_cfg(dgx_proc, *mounts), probe_argv=lambda mp: HUNG)
    try:
        t = time.monotonic()
        r = col.collect()
        elapsed = time.monotonic() - t
    finally:
        col.close()
    assert [_v(r.samples, "nfs_probe_ok", mountpoint=m) for m, _ in mounts] == [0, 0, 0]
    assert elapsed < 3.0, f"probes ran one after another ({elapsed:.2f}s)"


def test_mounts_are_probed_from_the_collectors_own_thread(dgx_proc: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No thread per probe (issue 32 §5: two hand-offs per mount per collection): the helpers are
    asked at once and answered through one poll, and every answer is read even when reading the
    files fails after they were asked (else the next probe would take this one's answer)."""
    import threading

    from podhealth.collectors.base import SourceUnreadable

    seq = ["/bin/sh", "-c", "echo ready; n=0; while read _; do n=$((n+1)); echo \"fail n=$n: x\"; done"]
    mounts = [("/home", 5.0), ("/cm/shared", 5.0)]
    col = create(_cfg(dgx_proc, *mounts), probe_argv=lambda mp: seq)
    before = {t.ident for t in threading.enumerate()}
    try:
        r = col.collect()
        assert {t.ident for t in threading.enumerate()} <= before
        assert "probe /home: n=1: x" in r.errors

        def unreadable() -> None:
            raise SourceUnreadable("EMFILE reading mountstats")

        with monkeypatch.context() as m:
            m.setattr(col, "_read_files", unreadable)
            with pytest.raises(SourceUnreadable):
                col.collect()
        r = col.collect()  # each helper's third answer, not a leftover second one
        assert "probe /home: n=3: x" in r.errors and "probe /cm/shared: n=3: x" in r.errors
    finally:
        col.close()


def run_probe(argv: Sequence[str], timeout: float) -> tuple[bool, float, str]:
    """Start a helper, probe once, stop it; (ok, seconds, detail)."""
    p = Probe(argv)
    try:
        r = p.run(timeout)
    finally:
        p.close()
    return r.ok, r.seconds, r.detail


def test_default_probe_is_a_real_statfs(tmp_path: Path) -> None:
    argv = default_probe_argv(str(tmp_path))
    assert argv[-1] == str(tmp_path)
    ok, seconds, detail = run_probe(argv, 10.0)
    assert ok and detail == "" and seconds > 0
    ok, _, detail = run_probe(default_probe_argv(str(tmp_path / "absent")), 10.0)
    assert not ok and detail == f"No such file or directory: {tmp_path / 'absent'}"


def test_probe_kills_the_whole_process_group(tmp_path: Path) -> None:
    pidfile = tmp_path / "grandchild.pid"
    argv = ["/bin/sh", "-c", f"{SLEEP} 30 & echo $! > {pidfile}; echo ready; wait"]
    ok, seconds, detail = run_probe(argv, 1.0)
    assert (ok, seconds) == (False, 1.0) and "timed out" in detail
    pid = int(pidfile.read_text())

    def gone() -> bool:
        try:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0] == "Z"  # reaped later by init
        except FileNotFoundError:
            return True
    wait_until(gone, 5.0, what="the probe's grandchild to be killed")


def test_unstartable_probe(tmp_path: Path) -> None:
    ok, _, detail = run_probe([str(tmp_path / "no-such-binary")], 1.0)
    assert not ok and detail.startswith("cannot start")


class _StuckProc:
    """Stands in for a child stuck in uninterruptible sleep: SIGKILL cannot reap it yet."""

    pid = 2**22 + 1
    stdin = stdout = stderr = None

    def __init__(self) -> None:
        self.exited = False

    def poll(self) -> int | None:
        return -9 if self.exited else None

    def wait(self, timeout: float | None = None) -> int:
        return -9


def test_stuck_probe_is_not_piled_up(tmp_path: Path) -> None:
    marker = tmp_path / "started"
    p = Probe(["/bin/sh", "-c", f"echo x >> {marker}; echo ready; while read _; do echo ok; done"])
    stuck = _StuckProc()
    p._lingering = stuck  # type: ignore[assignment]
    r = p.run(2.0)
    assert (r.ok, r.seconds, r.detail) == (False, 2.0, "previous probe still hung")
    assert not marker.exists()  # no new process was started
    stuck.exited = True  # the kernel finally let it go
    try:
        r = p.run(5.0)
        assert r.ok and marker.read_text() == "x\n"
    finally:
        p.close()


def test_collector_close_stops_hung_probes(dgx_proc: Path) -> None:
    col = create(_cfg(dgx_proc, ("/home", 0.3)), probe_argv=lambda mp: HUNG)
    col.collect()
    col.close()
    assert all(p._proc is None and p._lingering is None for p in col._probes.values())


def test_a_long_lived_collector_matches_a_fresh_one(tmp_path: Path) -> None:
    """The agent keeps one collector, which remembers parses and samples between collections:
    as the simulated node's counters move and mounts go missing or come back, it must report
    exactly what a new collector would (probe latencies aside, which are measured each time)."""
    from podhealth.sim import tree_nfs
    from podhealth.sim.state import Fault, default_state

    t0 = 1_700_000_000.0
    st = default_state("dgx01", "dgx-h100", now=t0)
    mounts = [("/home", 5.0), ("/cm/shared", 5.0)]
    col = NfsCollector(tmp_path, mounts, probe_argv=lambda mp: OK)

    def same(a: tuple[Sample, ...], b: tuple[Sample, ...]) -> bool:
        def strip(ss: tuple[Sample, ...]) -> list[Sample]:
            return [s for s in ss if s.name != "nfs_probe_seconds"]
        return strip(a) == strip(b)

    try:
        steps = [(st, t0 + 10), (st, t0 + 10), (st, t0 + 11), (st, t0 + 70),
                 (st.with_fault(Fault("nfs-missing", t0 + 80, mount="/cm/shared")), t0 + 90),
                 (st.with_fault(Fault("nfs-hung", t0 + 95, mount="/home")), t0 + 120),
                 (st, t0 + 130)]
        seen = []
        for state, now in steps:
            tree_nfs.write(state, tmp_path, now)
            fresh = NfsCollector(tmp_path, mounts, probe_argv=lambda mp: OK)
            try:
                a, b = col.collect(), fresh.collect()
            finally:
                fresh.close()
            assert same(a.samples, b.samples) and a.errors == b.errors, f"at {now - t0:g}s"
            seen.append(_v(a.samples, "nfs_mount_present", mountpoint="/cm/shared"))
        assert seen == [1, 1, 1, 1, 0, 1, 1]
    finally:
        col.close()


def test_unchanged_values_are_handed_on_as_the_same_samples(dgx_proc: Path) -> None:
    """What lets /metrics reuse the rendered line of a series (agent/metrics/blocks.py)."""
    col = NfsCollector(dgx_proc, [], probe_argv=lambda mp: OK)
    a = col.collect().samples
    ms = dgx_proc / "77" / "mountstats"
    ms.write_text(ms.read_text().replace("READ: 2093117", "READ: 2093118"))
    b = col.collect().samples
    col.close()
    changed = [y for x, y in zip(a, b) if x is not y]
    assert len(a) == len(b)
    assert [(s.name, s.label("operation"), s.value) for s in changed] == [
        ("nfs_operation_requests", "READ", 2093118.0)]
