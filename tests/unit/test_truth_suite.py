"""The truth suite: every capture of a real node in ../shared/fixtures, judged the way podhealth
judges a node, against what that node really was.

Healthy captures must give no FAIL; the faulty ones must give exactly the FAIL their fault asks
for. Each capture goes through the path the agent uses for it:

- `nvidia-smi -q`: seeds a simulated node (the real pynvml over the simulated NVML library, as
  `podhealth simulate node --from-nvidia-smi` does), then the whole handover suite runs on it.
- `ibstat`/`ibstatus`: becomes a sysfs tree, read by the InfiniBand collector, judged by the
  role-aware port rules.
- kernel logs: the kmsg line assembler, then the XID/SXid rules with NVIDIA's catalog.
- `dcgmi diag`, nccl-tests output: their parsers and verdicts with the profile's gates.
- mountstats: the NFS collector on a procfs tree holding the capture, then the NFS rules.

The table (capture -> verdict -> expected) is written to test-artifacts/truth_suite.md.
Captures that are truncated (an excerpt, a cut-off dump) are judged on what they hold: their GPU
count is taken as the profile's, since the cut is the capture's, not the node's.
"""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from podhealth import config
from podhealth.checks.active import dcgm, nccl
from podhealth.checks.passive import ib, nfs
from podhealth.checks import profiles
from podhealth.checks.passive.context import Context
from podhealth.checks.passive.rates import RateTracker
from podhealth.checks.passive.xid import evaluate_xids, load_catalog
from podhealth.collectors.infiniband import InfinibandCollector
from podhealth.collectors.nfs import NfsCollector, default_probe_argv
from podhealth.collectors.nfs_parse import parse_mountstats
from podhealth.collectors.xid_parse import LineAssembler, ParsedLine
from podhealth.snapshot import CollectorState, Snapshot
from podhealth.vocab import CheckResult, Event, Status
from tests.conftest import REPO
from tests.harness.ibtree import from_ibstat, write_tree

T = 1_700_000_000.0
Fails = frozenset[tuple[str, str, str]]  # (check, entity, action) of every FAIL


def _fails(results: list[CheckResult]) -> Fails:
    return frozenset((r.check, r.entity, r.action.value) for r in results if r.status is Status.FAIL)


# ---- judges: capture file -> FAIL set -------------------------------------------------------------


def judge_nvidia_smi(path: Path, tmp: Path, gpu_count: int | None = None) -> Fails:
    from podhealth.checks.handover.suite import LocalCollector, run_suite
    from podhealth.sim import agentnode, nvidia_smi, nvml_lib
    from podhealth.sim.node import SimNode

    name = "cap01"
    SimNode.create(tmp, name, seed=nvidia_smi.to_state(nvidia_smi.parse(path.read_text()), name))
    profile = SimNode.open(tmp, name).state.profile
    base = config.Config()
    overrides: dict[str, Any] = {"gpu_count": gpu_count} if gpu_count is not None else {}
    # NFS is not in an nvidia-smi capture: no mounts to judge here (the mountstats rows do that).
    base = dataclasses.replace(
        base, checks=dataclasses.replace(base.checks, grace=0, overrides=overrides),
        collectors=dataclasses.replace(base.collectors, nfs=dataclasses.replace(base.collectors.nfs, mounts=())))
    setup = agentnode.setup(base, profile, tmp, name)
    cfg = dataclasses.replace(setup.cfg, node=dataclasses.replace(setup.cfg.node, profile=profile))
    try:
        rep = asyncio.run(run_suite(cfg, LocalCollector(cfg, seams=setup.seams), name))
    finally:
        nvml_lib.uninstall()
    return _fails(list(rep.results))


def judge_ibstat(path: Path, tmp: Path, profile: profiles.Profile) -> Fails:
    hcas = from_ibstat(path.read_text())
    for i, h in enumerate(hcas):  # ibstat prints no PCI address: one slot per adapter
        h.pci = f"0000:{0x10 + i:02x}:00.0"
    c = InfinibandCollector(write_tree(tmp / "sys", hcas)).collect()
    st = CollectorState("infiniband", samples=c.samples, stale=False, last_success=T, last_attempt=T)
    ctx = Context(snapshot=Snapshot(T, {"infiniband": st}), profile=profile, now=T, rates=RateTracker(300))
    return _fails(ib.ib_port(ctx) + ib.ib_errors(ctx))


def judge_kernel_log(path: Path) -> Fails:
    asm = LineAssembler()
    kinds = {"xid": "xid", "sxid": "sxid", "fallen_off_bus": "kernel"}
    events = []
    parsed: list[ParsedLine] = []
    for line in path.read_text(errors="replace").splitlines():
        p = asm.feed(line, year=2024)
        parsed.extend([p] if isinstance(p, ParsedLine) else [])
    for p in parsed + asm.drain():
        if p.kind in kinds:
            events.append(Event(kind=kinds[p.kind], code=p.code, time=T - 10, text=p.message,  # type: ignore[arg-type]
                                pci_bus_id=p.pci_bus_id if p.kind != "sxid" else "", device=p.device))
    return _fails(evaluate_xids(events, load_catalog(), T, 3600.0, {}))


def judge_host_log(path: Path) -> Fails:
    """Host RAS lines (EDAC summaries, mce records) as the kmsg collector turns them into events,
    judged by kernel_ras: FAILs by their action, WARNs as "WARN" (a failing DIMM warns)."""
    from podhealth.checks.passive import memory_ecc
    from podhealth.collectors import ras_parse
    from podhealth.collectors.xid_parse import line_timestamps

    events = []
    for i, line in enumerate(path.read_text(errors="replace").splitlines()):
        r = ras_parse.parse(line)
        if r is None:
            continue
        wall, mono = line_timestamps(line[:r.start], 2024)
        at = wall if wall is not None else (mono if mono is not None else float(i))
        events.append(Event(kind=r.kind, code=r.count, time=at, text=r.message, device=r.source,
                            subcode=None if r.uncorrected is None else int(r.uncorrected)))
    now = max((e.time for e in events), default=T) + 10
    ctx = Context(snapshot=Snapshot(now, {}), profile=profiles.load("generic"), now=now, rates=RateTracker(3600),
                  events=tuple(events), window=3600.0)
    res = memory_ecc.kernel_ras(ctx)
    return frozenset((r.check, r.entity, r.action.value if r.status is Status.FAIL else "WARN")
                     for r in res if r.status in (Status.FAIL, Status.WARN))


def judge_dcgmi(path: Path) -> Fails:
    return _fails(dcgm.results(dcgm.parse(path.read_text())))


def judge_nccl(path: Path, profile: str, multinode: bool) -> Fails:
    run = nccl.parse(path.read_text())
    t = profiles.load(profile).thresholds
    if multinode:
        return _fails(nccl.judge_hosts(run, nccl.multinode_gates(t)))
    return _fails([nccl.judge(run, nccl.Gates(float(t["nccl_allreduce_busbw_gbps"]), 0.0, 10.0, 0, required=True))])


def judge_mountstats(path: Path, tmp: Path) -> Fails:
    text = path.read_text()
    mounts = sorted({m.mountpoint for m in parse_mountstats(text).mounts})
    self_dir = tmp / "proc" / "4242"
    self_dir.mkdir(parents=True)
    (self_dir / "mountstats").write_text(text)
    (self_dir / "mountinfo").write_text("".join(
        f"{30 + i} 1 0:{40 + i} / {mp} rw,relatime - nfs4 server:/export{i} rw\n" for i, mp in enumerate(mounts)))
    (tmp / "proc" / "self").symlink_to("4242")
    (tmp / "proc" / "net" / "rpc").mkdir(parents=True)
    # The servers are not here: a statfs of a local directory stands in for a server that answers.
    coll = NfsCollector(tmp / "proc", [(mp, 2.0) for mp in mounts], probe_argv=lambda mp: default_probe_argv(str(tmp)))
    try:
        c = coll.collect()
    finally:
        coll.close()
    st = CollectorState("nfs", samples=c.samples, stale=False, last_success=T, last_attempt=T)
    ctx = Context(snapshot=Snapshot(T, {"nfs": st}), profile=profiles.load("generic"), now=T, rates=RateTracker(300))
    ctx = dataclasses.replace(ctx, required_mounts=tuple(mounts))
    res = nfs.nfs_mount(ctx) + nfs.nfs_latency(ctx)
    judged = {r.entity for r in res if r.check == "nfs_mount" and r.status is not Status.UNKNOWN}
    assert judged == set(mounts), f"every captured mount is judged, not just skipped: {res}"
    return _fails(res)


# ---- the table ----------------------------------------------------------------------------------

NONE: Fails = frozenset()
ROCE_SITE = {"network.roles.compute.link_layers": ["Ethernet"],
             "network.rules": [{"role": "compute", "hca_type": "MT4129"}, {"role": "storage", "hca_type": "MT4125"}],
             "network.roles.storage.count": 4}


@dataclasses.dataclass(frozen=True)
class Case:
    capture: str  # path under ../shared/fixtures
    truth: str  # what the node really was
    expected: Fails | None
    judge: Callable[[Path, Path], Fails]


CASES = [
    # nvidia-smi -q
    Case("nvidia_smi/nvidia-smi-q_h100_8gpu_gpud_535.183.01.out.0.valid.txt",
         "healthy 8x H100 (SW power cap, a HW power brake on one idle GPU)", NONE,
         lambda p, t: judge_nvidia_smi(p, t)),
    Case("nvidia_smi/nvidia-smi-q_h100_sxm_8gpu_565.57.01_thamada.txt",
         "healthy 8x H100, PCIe replays on three GPUs", NONE, lambda p, t: judge_nvidia_smi(p, t)),
    Case("nvidia_smi/nvidia-smi-q_h200_1gpu_vm_passthrough_550.90.12_thamada.txt",
         "healthy H200 passed through to a VM (one GPU)", NONE, lambda p, t: judge_nvidia_smi(p, t, gpu_count=1)),
    Case("nvidia_smi/nvidia-smi-q_gh200_480gb_550.127.05_thamada.txt",
         "healthy GH200", NONE, lambda p, t: judge_nvidia_smi(p, t)),
    Case("nvidia_smi/nvidia-smi-q_h100_8gpu_gpud_535.183.01.out.0.invalid.txt",
         "cut-off dump of a healthy H100 (one GPU section, 'Invalid' reason names)", NONE,
         lambda p, t: judge_nvidia_smi(p, t, gpu_count=1)),
    Case("nvidia_smi/nvidia-smi-q_a100_remapped_rows_pending_excerpt_stas00.txt",
         "A100 after an XID 63: row remap pending", frozenset({("row_remap", "gpu0", "RESET_GPU")}),
         lambda p, t: judge_nvidia_smi(p, t, gpu_count=1)),
    # non-DGX servers (issue 28): each seeds a node of what it is (generic where no shipped
    # profile has its model and count) and passes the handover
    Case("nvidia_smi/nvidia-smi-q_l4_1gpu_550.90.07_thamada.txt", "healthy L4 (PCIe, T.Limit thresholds)", NONE,
         lambda p, t: judge_nvidia_smi(p, t)),
    Case("nvidia_smi/nvidia-smi-q_rtx6000ada_8gpu_550.127.05_thamada.txt", "healthy 8x RTX 6000 Ada, ECC off", NONE,
         lambda p, t: judge_nvidia_smi(p, t)),
    Case("nvidia_smi/nvidia-smi-q_rtxa6000_9gpu_550.127.05_swpowercap_thamada.txt",
         "healthy 9x RTX A6000 (SW power cap at idle)", NONE, lambda p, t: judge_nvidia_smi(p, t)),
    Case("nvidia_smi/nvidia-smi-q_a10_1gpu_vm_passthrough_550.90.12_thamada.txt", "healthy A10 in a VM", NONE,
         lambda p, t: judge_nvidia_smi(p, t)),
    Case("nvidia_smi/nvidia-smi-q-x_telegraf_a10g.xml", "healthy A10G (-q -x)", NONE, lambda p, t: judge_nvidia_smi(p, t)),
    Case("nvidia_smi/nvidia-smi-q-x_telegraf_tesla-t4.xml", "healthy T4 (-q -x)", NONE, lambda p, t: judge_nvidia_smi(p, t)),
    Case("nvidia_smi/nvidia-smi-q-x_netdata_tesla-p100.xml", "healthy P100, page retirement (-q -x)", NONE,
         lambda p, t: judge_nvidia_smi(p, t)),
    Case("nvidia_smi/nvidia-smi-q-x_netdata_a100-sxm4-mig.xml", "healthy A100-SXM4-40GB in MIG mode (-q -x)", NONE,
         lambda p, t: judge_nvidia_smi(p, t)),
    Case("nvidia_smi/nvidia-smi_default_h100_sxm_8gpu_565.57.01_thamada.txt", "healthy 8x H100 (summary table)",
         NONE, lambda p, t: judge_nvidia_smi(p, t)),
    Case("nvidia_smi/nvidia-smi_default_ERR_fan_525.125.06_gpud.txt",
         "GeForce with an ERR! fan reading (summary table): nothing a handover fails", NONE,
         lambda p, t: judge_nvidia_smi(p, t)),
    # InfiniBand
    Case("infiniband/ibstat.47.0.h100.all.active.2.txt",
         "healthy DGX H100: 8 NDR rails + bonded RoCE storage (mlx5_bond_0, 200)", NONE,
         lambda p, t: judge_ibstat(p, t, profiles.load("dgx-h100"))),
    Case("infiniband/ibstat.47.0.h100.some.down.with.polling.1.txt",
         "H100 RoCE node (site profile: Ethernet rails), two rails Down/Polling",
         frozenset({("ib_port", "mlx5_5/1", "DRAIN"), ("ib_port", "mlx5_11/1", "DRAIN")}),
         lambda p, t: judge_ibstat(p, t, profiles.load("dgx-h100", ROCE_SITE))),
    Case("infiniband/ibstatus.39.0.a100.all.active.0.txt", "healthy A100 (8 HDR + an Ethernet VF)", NONE,
         lambda p, t: judge_ibstat(p, t, profiles.load("dgx-a100"))),
    # kernel logs
    Case("xid_kernel_logs/dmesg_T_h100_xid43_31_94_contained.log",
         "application faults and a contained ECC error (NVIDIA: restart the app)", NONE,
         lambda p, t: judge_kernel_log(p)),
    Case("xid_kernel_logs/dmesg_decode_iso_boot_h100_nvswitch_mlx5.log", "healthy H100 + NVSwitch boot", NONE,
         lambda p, t: judge_kernel_log(p)),
    Case("xid_kernel_logs/dmesg_decode_iso_xid13_43_pt_main_thread.log", "application errors (XID 13, 43)", NONE,
         lambda p, t: judge_kernel_log(p)),
    Case("xid_kernel_logs/dmesg_T_xid79_fallen_off_bus_crash_dump_multiline.log", "GPU fell off the bus (XID 79)",
         frozenset({("xid", "pci:0000:a1:00.0", "REBOOT")}), lambda p, t: judge_kernel_log(p)),
    Case("xid_kernel_logs/dmesg_fallen_off_bus_no_xid_multiline_570.log", "GPU fell off the bus, no XID line",
         frozenset({("xid", "pci:0000:b3:00.0", "REBOOT")}), lambda p, t: judge_kernel_log(p)),
    Case("xid_kernel_logs/dmesg_ctime_xid119_gsp_rpc_timeout_h100_xe9680.log", "GSP RPC timeout (XID 119)",
         frozenset({("xid", "pci:0000:9b:00.0", "RESET_GPU")}), lambda p, t: judge_kernel_log(p)),
    Case("xid_kernel_logs/dmesg_iso_xid48_63_94_dbe_rowremap_contained_peermem.log",
         "double-bit ECC error with a row remap (XID 48 + 63)", frozenset({("xid", "pci:0000:19:00.0", "DRAIN")}),
         lambda p, t: judge_kernel_log(p)),
    Case("xid_kernel_logs/kmsg_xid79_fallen_off_bus_plus_sxid20034_h100.log",
         "GPU fell off the bus, NVSwitch LTSSM faults (XID 79 + SXid 20034)",
         frozenset({("xid", "pci:0000:91:00.0", "REBOOT"), ("sxid", "nvswitch0", "REBOOT"),
                    ("sxid", "nvswitch1", "REBOOT"), ("sxid", "nvswitch2", "REBOOT")}),
         lambda p, t: judge_kernel_log(p)),
    Case("xid_kernel_logs/kmsg_gb200_xid149_154_nvlink5_recovery_action.log",
         "GB200 NVLink5 fatal errors with the driver's stated recovery (XID 149 + 154)",
         frozenset({("xid", "pci:0008:01:00.0", "RESET_GPU"), ("xid", "pci:0009:01:00.0", "DRAIN"),
                    ("xid", "pci:0018:01:00.0", "RESET_GPU"), ("xid", "pci:0019:01:00.0", "RESET_GPU")}),
         lambda p, t: judge_kernel_log(p)),
    Case("xid_kernel_logs/kmsg_gb200_xid145_149_nvlink5_rlw_netir.log", "GB200 NVLink5 errors (XID 145, 149)",
         frozenset({("xid", "pci:0008:01:00.0", "RESET_GPU"), ("xid", "pci:0018:01:00.0", "RESET_GPU"),
                    ("xid", "pci:0019:01:00.0", "RESET_GPU")}), lambda p, t: judge_kernel_log(p)),
    Case("xid_kernel_logs/dmesg_nv_err_gpu_is_lost_rpc_fn78_no_xid_john5835_excerpt.log",
         "GPU lost during a CUDA job, GSP-RM's NV_ERR_GPU_IS_LOST lines, no Xid line (no address either)",
         frozenset({("xid", "node", "REBOOT")}), lambda p, t: judge_kernel_log(p)),
    Case("xid_kernel_logs/dmesg_ctime_titanv_rminitadapter_failed_0x25_illinois76.log",
         "GPU that keeps disappearing: RmInitAdapter failed, no Xid line (only a reboot helps)",
         frozenset({("xid", "pci:0000:81:00.0", "REBOOT")}), lambda p, t: judge_kernel_log(p)),
    # host RAS lines in the kernel log (WARN: a DIMM to replace; FAIL: an uncorrectable error)
    Case("host_errors/dmesg_T_edac_sbridge_262_ce_overflow_illinois66.log",
         "failing DIMM: 262 corrected errors in one EDAC line, repeating (host later failed)",
         frozenset({("kernel_ras", "mc1", "WARN")}), lambda p, t: judge_host_log(p)),
    Case("host_errors/dmesg_T_edac_skx_ce_read_and_scrub_overflow_retry_rd_err_log.log",
         "failing DIMM: 16384 + 78 corrected errors (OVERFLOW) on one DIMM",
         frozenset({("kernel_ras", "mc0", "WARN")}), lambda p, t: judge_host_log(p)),
    Case("host_errors/journal_kernel_edac_sbridge_mce_ce_scrubbing_radiasoft134.log",
         "one corrected scrubbing error (below any rate: no verdict from one line)", NONE,
         lambda p, t: judge_host_log(p)),
    # dcgmi diag
    Case("dcgm/dcgmi_diag_r3_v_pass_v100_dcgm3.3.9.txt", "healthy V100 node, dcgmi diag -r 3 pass", NONE,
         lambda p, t: judge_dcgmi(p)),
    Case("dcgm/dcgmi_diag_r3_fail_h100_cuinit_no_fabricmanager.txt",
         "H100 node without Fabric Manager: CUDA cannot start (one node-level FAIL, no GPU blamed)",
         frozenset({("dcgm_diag.gpu_memory", "node", "DRAIN")}), lambda p, t: judge_dcgmi(p)),
    Case("dcgm/dcgmi_diag_dcgm4.2.3_4gpu_pcie_fail_internal_error.txt",
         "healthy L40S node; DCGM 4.2.3's pcie harness broke (NVIDIA/DCGM#253): UNKNOWN, not FAIL", NONE,
         lambda p, t: judge_dcgmi(p)),
    Case("dcgm/dcgmi_diag_j_legacy_format_v1.7_4gpu_sm_stress_fail_dcgm_teststring.json",
         "SM stress below the stress level on GPUs 0, 2, 3 (NVIDIA's test string)",
         frozenset({("dcgm_diag.sm_stress", f"gpu{i}", "REBOOT") for i in (0, 2, 3)}), lambda p, t: judge_dcgmi(p)),
    # nccl-tests
    Case("nccl_tests/all_reduce_perf_h200_2node_16gpu_oci_slurm.txt", "healthy 2x8 H200", NONE,
         lambda p, t: judge_nccl(p, "dgx-h200", True)),
    Case("nccl_tests/all_reduce_perf_h200_2node_g8_nccltests2.18_newformat.txt", "healthy 2x8 H200 (new format)",
         NONE, lambda p, t: judge_nccl(p, "dgx-h200", True)),
    Case("nccl_tests/all_reduce_perf_h200_2node_g8_nccltests2.18_newformat.txt",
         "healthy 2x8 H200 on an OEM RoCE fabric (Dell + BlueField-3): no gate measured there, UNKNOWN", NONE,
         lambda p, t: judge_nccl(p, "hgx-h200", True)),
    Case("nccl_tests/all_reduce_perf_a100_2node_16gpu_gcm.txt", "healthy 2x8 A100", NONE,
         lambda p, t: judge_nccl(p, "dgx-a100", True)),
    Case("nccl_tests/all_reduce_perf_a100_8gpu_single_node_gcm.txt", "healthy 8x A100 in one node", NONE,
         lambda p, t: judge_nccl(p, "dgx-a100", False)),
    Case("nccl_tests/all_reduce_perf_failed_launch_openmpi_slots_gcm.txt", "the launcher failed (MPI slots)",
         NONE, lambda p, t: judge_nccl(p, "dgx-a100", False)),
    Case("nccl_tests/all_reduce_perf_h100_8gpu_fail_system_not_yet_initialized.txt",
         "CUDA 'system not yet initialized' on an H100 node (Fabric Manager not running)",
         frozenset({("nccl_allreduce", "node", "DRAIN")}), lambda p, t: judge_nccl(p, "dgx-h100", False)),
    # mountstats
    Case("nfs/mountstats_nfs4.1_k8s_pod_extended_ops.txt", "healthy NFSv4.1 mount", NONE,
         lambda p, t: judge_mountstats(p, t)),
    Case("nfs/mountstats_node_exporter_fixture_nfs4_nfs3_udp.txt", "healthy NFSv4.0 + v3/udp mounts", NONE,
         lambda p, t: judge_mountstats(p, t)),
    Case("nfs/mountstats_procfs_fixture_pid26231.txt", "healthy NFS mounts", NONE,
         lambda p, t: judge_mountstats(p, t)),
]


ROWS: list[str] = []


@pytest.fixture(scope="module", autouse=True)
def _table() -> Iterator[None]:
    yield
    out = REPO / "test-artifacts"
    out.mkdir(exist_ok=True)
    (out / "truth_suite.md").write_text("| capture | the node | verdict | expected |\n|---|---|---|---|\n"
                                        + "\n".join(ROWS) + "\n")


def _show(f: Fails) -> str:
    return "; ".join(f"{c} {e} {a}" for c, e, a in sorted(f)) or "no FAIL"


@pytest.mark.parametrize("case", CASES, ids=[c.capture.split("/")[-1] for c in CASES])
def test_capture_verdict(case: Case, shared_fixtures: Path, tmp_path: Path) -> None:
    got = case.judge(shared_fixtures / case.capture, tmp_path)
    want = case.expected
    ROWS.append(f"| `{case.capture}` | {case.truth} | {_show(got)} | {_show(want) if want is not None else '?'} |")
    assert want is not None, f"{case.capture}: {_show(got)}"
    assert got == want, f"{case.capture} ({case.truth}): got {_show(got)}, expected {_show(want)}"
