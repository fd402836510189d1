"""The remediation ladder against the real things: a loopback Slurm 22.05 whose RebootProgram is a
script this test provides, and `podhealth agent --simulate` nodes.

The RebootProgram records each call and reboots the simulated node (`podhealth simulate inject
NODE fault=reboot`: a new btime, and every fault not marked persist=1 is gone). The loopback
cluster's slurmds share one host and Slurm passes the program no node name, so the test writes
the name of the node it reboots into a file the script reads.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest

from podhealth.config_aggregator import AggAuthConfig, LadderConfig, NodeEntry, RetryConfig
from podhealth.fencing.fence import FenceReason, Refused, repair_reason
from podhealth.aggregator.model import FenceMode
from podhealth.fencing.slurm import SlurmFencer
from tests.harness.agg import config, running
from tests.harness.proc import Service, free_port, http_get, service
from tests.harness.slurm import SlurmCluster, slurm_fixture

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

TOKEN = "ladder-token-0123456789"
R = FenceReason("xid", "gpu3", "REBOOT", "ev-0001")


@pytest.fixture(scope="module")
def reboot_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("reboot")


def _reboot_program(d: Path) -> str:
    script = d / "reboot.sh"
    script.write_text(
        "#!/bin/sh\n"
        "# podhealth test RebootProgram: record the call, then reboot the simulated node named in ./target\n"
        f'node=$(cat "{d}/target")\n'
        f'echo "$node" >> "{d}/calls"\n'
        f'exec "{sys.executable}" -m podhealth simulate inject "$node" fault=reboot --root "{d}/sim" '
        f'>> "{d}/program.log" 2>&1\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return str(script)


@pytest.fixture(scope="module")
def slurm(reboot_dir: Path) -> Iterator[SlurmCluster]:
    from tests.harness.slurm import missing_binaries

    if missing_binaries():
        pytest.skip(f"Slurm binaries missing: {', '.join(missing_binaries())}")
    # ResumeTimeout: a simulated reboot never re-registers with a new boot time; Slurm then
    # says "reboot timed out" and leaves the node DOWN, which is podhealth's fence either way.
    with SlurmCluster(nodes=3, extra_conf=f"RebootProgram={_reboot_program(reboot_dir)}\nResumeTimeout=60\n") as c:
        yield c


def sim(d: Path, *argv: str) -> str:
    r = subprocess.run([sys.executable, "-m", "podhealth", "simulate", *argv, "--root", str(d / "sim")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout


def faults(d: Path, node: str) -> list[tuple[str, Any]]:
    return [(f["kind"], f["gpu"]) for f in json.loads(sim(d, "show", node))["faults"]]


def calls(d: Path) -> list[str]:
    p = d / "calls"
    return p.read_text().split() if p.exists() else []


async def until(pred: Any, timeout: float, what: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not pred():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.1)


def show(c: SlurmCluster, node: str) -> str:
    return c.run("scontrol", "show", "node", "-o", node).stdout


async def test_reboot_runs_the_reboot_program_once_and_keeps_the_node_out(slurm: SlurmCluster,
                                                                         reboot_dir: Path) -> None:
    d = reboot_dir
    sim(d, "node", "dgx01")
    sim(d, "inject", "dgx01", "fault=dbe", "gpu=3")
    sim(d, "inject", "dgx01", "fault=row-remap-failure", "gpu=5")
    (d / "target").write_text("dgx01")
    f = SlurmFencer(slurm_conf=slurm.conf, env=slurm.env, timeout=5.0)

    with pytest.raises(Refused, match="not fenced by podhealth"):  # not fenced by podhealth: never rebooted
        await f.reboot("dgx01", R)
    assert calls(d) == []

    assert (await f.fence("dgx01", R)).changed
    o = await f.reboot("dgx01", R)
    assert o.changed, o
    assert o.command == ("scontrol", "reboot", "ASAP", "nextstate=DOWN", "reason=podhealth: xid gpu3 REBOOT [ev-0001]",
                         "dgx01")
    again = await f.reboot("dgx01", R)  # requested already: not asked twice
    assert not again.changed and "already requested" in again.output
    await until(lambda: calls(d) == ["dgx01"], 30, "slurmd to run the RebootProgram")
    await until(lambda: ("reboot", None) in faults(d, "dgx01"), 30, "the simulated node to reboot")
    assert sorted(faults(d, "dgx01"), key=str) == [("reboot", None), ("row-remap-failure", 5)]
    st = await f.read("dgx01")
    assert st.fenced and st.ours and "State=DOWN+DRAIN+REBOOT_ISSUED" in show(slurm, "dgx01")
    assert "NextState=DOWN" in show(slurm, "dgx01")  # never back to users before the handover suite

    o = await f.remark("dgx01", repair_reason(R))
    assert o.changed, o
    st = await f.read("dgx01")
    assert st.fenced and st.ours and st.reason == "podhealth: REPAIR xid/gpu3 REBOOT [ev-0001]"
    assert calls(d) == ["dgx01"]
    assert (await f.release("dgx01")).changed


@pytest.fixture
def agent(reboot_dir: Path) -> Iterator[Service]:
    d = reboot_dir
    cfg = d / "agent.yaml"
    cfg.write_text(f"""
auth: {{token: {TOKEN}}}
checks:
  damping: {{fail_after: 1, recover_after: 1}}
  grace: 0
collectors:
  nvml: {{interval: 0.5, timeout: 2}}
  nvlink: {{interval: 1, timeout: 2}}
  infiniband: {{interval: 2, timeout: 2}}
  host: {{interval: 2, timeout: 2}}
  kmsg: {{interval: 0.5, timeout: 2}}
  nfs: {{enabled: false}}
""")
    port = free_port()
    with service("agent", [sys.executable, "-m", "podhealth", "agent", "--config", str(cfg), "--simulate", "dgx-h100",
                           "--sim-root", str(d / "sim"), "--node", "dgx02", "--listen", f"127.0.0.1:{port}"],
                 d, port=port, ready=lambda: http_get(f"http://127.0.0.1:{port}/health")[0] == 200,
                 ready_timeout=60) as svc:
        yield svc


async def test_the_simulator_climbs_the_ladder_to_repair(slurm: SlurmCluster, reboot_dir: Path, agent: Service,
                                                         tmp_path: Path) -> None:
    """A pending row remap (asks RESET_GPU) that survives a reboot, on a GPU whose reset fails:
    fence -> reset (fails) -> reboot (Slurm RebootProgram; the fault stays) -> REPAIR."""
    d = reboot_dir
    (d / "target").write_text("dgx02")
    before = len(calls(d))
    sim(d, "inject", "dgx02", "fault=gpu-reset-fails", "gpu=3")
    sim(d, "inject", "dgx02", "fault=row-remap-pending", "gpu=3", "persist=1")
    cfg = dataclasses.replace(
        config(tmp_path, healthy_for=0.5, pull_interval=0.25, retries=RetryConfig(attempts=1, backoff=0.1, max_backoff=0.5),
               auth=AggAuthConfig(agent_token=TOKEN),
               ladder=LadderConfig(enabled=True, verify_within=8.0, max_attempts=2)),
        nodes=(NodeEntry(name="dgx02", agent_url=agent.url, partition="gpu"),))
    fencer = SlurmFencer(slurm_conf=slurm.conf, env=slurm.env, timeout=5.0)
    async with running(cfg, [fencer]) as (agg, _):
        await until(lambda: agg.mem.nodes["dgx02"].ladder == "repair" and not agg.pending, 150, "REPAIR")

        def attempts() -> list[tuple[str, str, str]]:
            return [(a["kind"], a["state"], a["outcome"]) for a in reversed(agg.store.ladder_attempts("dgx02"))]
        want = [("reset_gpu", "failed", ""), ("reboot", "done", "failed"), ("repair", "done", "")]
        # Memory leads; the writer thread stores the last rows a moment later (under load, later still).
        try:
            await until(lambda: attempts() == want, 30, "the ladder's rows in the store")
        except AssertionError as e:
            raise AssertionError(f"{e}: {attempts()}") from None
        assert calls(d)[before:] == ["dgx02"]  # rebooted exactly once, through Slurm's RebootProgram
        assert ("row-remap-pending", 3) in faults(d, "dgx02") and ("gpu-reset-fails", 3) not in faults(d, "dgx02")
        st = await fencer.read("dgx02")
        assert st.fenced and st.ours and st.reason.startswith("podhealth: REPAIR ")
        rec = agg.mem.nodes["dgx02"]
        assert rec.fence is FenceMode.FENCED and rec.hold and rec.state == "repair"
        assert [r["node"] for r in agg.repairs_json()] == ["dgx02"]
    await fencer.release("dgx02")
    sim(d, "clear", "dgx02")


def test_simulate_fleets_reboot_program_reboots_the_nodes_slurm_issued_a_reboot_for(tmp_path: Path) -> None:
    """`podhealth simulate fleet` gives its loopback Slurm this RebootProgram (no node name comes
    with the call): it reboots every simulated node slurmctld shows REBOOT_ISSUED, no other."""
    from podhealth.sim.fleet_config import (
        FencerChoice, FleetPlan, aggregator_config, check_aggregator_config, reboot_program,
    )

    root = tmp_path / "sim"
    plan = FleetPlan(root=root, home=root / "_fleet", profile="dgx-h100", cluster="c", partition="gpu", agents=(),
                     aggregator_port=1, aggregator_config=root / "agg.yml", db=root / "agg.db",
                     cluster_secret="s" * 64, admin_token="a")
    for n in ("dgx01", "dgx02"):
        sim(tmp_path, "node", n)
        sim(tmp_path, "inject", n, "fault=dbe", "gpu=1")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "scontrol"  # what `scontrol show node -o` printed on the loopback cluster (above)
    fake.write_text("#!/bin/sh\n"
                    "echo 'NodeName=dgx01 Arch=x86_64 State=DOWN+DRAIN+REBOOT_ISSUED NextState=DOWN Reason=podhealth: x'\n"
                    "echo 'NodeName=dgx02 Arch=x86_64 State=IDLE Partitions=gpu'\n")
    fake.chmod(0o755)
    script = tmp_path / "reboot.sh"
    script.write_text(reboot_program(plan, sys.executable))
    script.chmod(0o755)
    r = subprocess.run([str(script)], env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"},
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert faults(tmp_path, "dgx01") == [("reboot", None)]
    assert faults(tmp_path, "dgx02") == [("dbe", 1)]
    text = aggregator_config(plan, FencerChoice(None, ""))
    check_aggregator_config(text, "fleet aggregator.yml")
    assert "ladder:\n    enabled: true" in text and "jobs:\n    enabled: true" in text
