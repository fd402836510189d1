"""Kernel log lines the NVIDIA driver writes for a fault, in /dev/kmsg record format.

A /dev/kmsg record is `<prio>,<seq>,<usec since boot>,<flags>;<message>` (Documentation/ABI/
testing/dev-kmsg). The message text follows what the driver prints (see the captures in
../shared/fixtures/xid_kernel_logs): `NVRM: Xid (PCI:0000:18:00): 79, pid='<unknown>',
name=<unknown>, GPU has fallen off the bus.` -- the PCI address in an Xid line has no function
number, unlike the `NVRM: GPU 0000:18:00.0:` lines.
"""

from __future__ import annotations

from typing import Mapping

from podhealth.sim.state import Fault, GpuSpec, NodeState

LOGGED_KINDS = frozenset({"xid", "fallen-off-bus", "edac-ue", "pcie-aer-fatal"})

# /dev/kmsg prio = facility * 8 + level; the kernel facility is 0. NVRM prints Xids at KERN_ERR
# severity and its identification lines (GPU at PCI ..., serial) at KERN_INFO.
PRIO_ERR = 3
PRIO_INFO = 6

# Text after "pid=..., name=..., " for common codes, shaped like the captured lines.
XID_TEXT: Mapping[int, str] = {
    13: "Graphics SM Warp Exception on (GPC 8, TPC 5, SM 0): Out Of Range Address",
    31: "Ch 00000008, intr 00000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_8 faulted @ "
        "0x73ac_1c000000. Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_WRITE",
    43: "Ch 00000008",
    45: "Ch 00000008, errorString CTX SWITCH TIMEOUT, Info 0x1c004",
    48: "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer "
        "at physAddr 0x12bac1c3e0 partition 2, subpartition 1.",
    61: "Internal micro-controller breakpoint/warning (0x1a7f4)",
    62: "Internal micro-controller halt (0x1a7f4)",
    63: "Row Remapper: New row (0x00000012bac1c3e0) marked for remapping, reset gpu to activate.",
    64: "Row Remapper: Failed to remap row (0x00000012bac1c3e0).",
    74: "NVLink: fatal error detected on link 14(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)",
    79: "GPU has fallen off the bus.",
    92: "High single-bit ECC error rate detected",
    94: "Contained: SM (0x1). RST: No, D-RST: No",
    95: "Uncontained: SM (0x1). RST: Yes, D-RST: No",
    109: "Ch 00000010, errorString CTX SWITCH TIMEOUT, Info 0x3c046",
    119: "Timeout after 6s of waiting for RPC response from GPU GSP! Expected function 76 "
         "(GSP_RM_CONTROL) (0x20801813 0x4c).",
    120: "GSP task exception: Fatal GSP Fault (0x0)",
    154: "GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)",
}
# Codes the driver reports on behalf of a user process (pid/name of the faulting process).
_PROCESS_CODES = frozenset({31, 43, 45, 109})


def xid_pci(gpu: GpuSpec) -> str:
    """"00000000:18:00.0" -> "0000:18:00" (Xid lines drop the function and use 4-digit domain)."""
    short = gpu.pci_bus_id_short
    return short.rsplit(".", 1)[0]


def xid_message(gpu: GpuSpec, code: int, pid: int | None = None, process: str = "") -> str:
    text = XID_TEXT.get(code, "unknown error")
    if code in (154,):
        # Recovery-action Xids carry no pid/name (see the GB200 captures).
        return f"NVRM: Xid (PCI:{xid_pci(gpu)}): {code}, {text}"
    who = f"pid={pid}, name={process}" if pid is not None else "pid='<unknown>', name=<unknown>"
    return f"NVRM: Xid (PCI:{xid_pci(gpu)}): {code}, {who}, {text}"


def record(prio: int, seq: int, usec: int, message: str) -> str:
    return f"{prio},{seq},{usec},-;{message}"


def lines_for(state: NodeState, fault: Fault, boot_time: float, first_seq: int) -> list[str]:
    """The kmsg records the driver writes when `fault` happens; [] for kinds it does not log."""
    if fault.kind == "edac-ue":
        # edac_mc.c's summary line as i10nm/skx_edac print it (tree_host counts it on mc0's dimm1).
        usec = max(0, int((fault.injected_at - boot_time) * 1_000_000))
        return [record(PRIO_ERR, first_seq, usec, "EDAC MC0: 1 UE memory read error on CPU_SrcID#0_MC#0_Chan#1_DIMM#0 "
                       "(channel:1 slot:0 page:0x1f3a2c offset:0x0 grain:32 -  err_code:0x0000:0x009f socket:0 "
                       "imc:0 rank:0 bg:1 ba:2 row:0x3e8a col:0x3c0)")]
    if fault.kind not in LOGGED_KINDS or fault.gpu is None:
        return []
    gpu = state.gpu(fault.gpu)
    usec = max(0, int((fault.injected_at - boot_time) * 1_000_000))
    if fault.kind == "pcie-aer-fatal":
        # aer.c's line for the device that sent ERR_FATAL (tree_host counts the same error in sysfs)
        return [record(PRIO_ERR, first_seq, usec, f"nvidia {gpu.pci_bus_id_short}: AER: PCIe Bus Error: "
                       "severity=Uncorrected (Fatal), type=Transaction Layer, (Requester ID)")]
    messages: list[tuple[int, str]]
    if fault.kind == "xid" and fault.code is not None and fault.code != 79:
        pid, proc = (4242, "python3") if fault.code in _PROCESS_CODES else (None, "")
        messages = [(PRIO_ERR, xid_message(gpu, fault.code, pid, proc))]
    else:
        # A GPU falling off the bus: identification lines, the Xid 79, then the driver's summary
        # line, microseconds apart (kmsg_xid79_fallen_off_bus_plus_sxid20034_h100.log, 535's
        # dmesg -T capture). One fault: the collector folds the summary into the Xid 79.
        messages = [
            (PRIO_INFO, f"NVRM: GPU at PCI:{xid_pci(gpu)}: {gpu.uuid}"),
            (PRIO_INFO, f"NVRM: GPU Board Serial Number: {gpu.serial}"),
            (PRIO_ERR, xid_message(gpu, 79)),
            (PRIO_ERR, f"NVRM: GPU {gpu.pci_bus_id_short}: GPU has fallen off the bus."),
            (PRIO_INFO, f"NVRM: GPU {gpu.pci_bus_id_short}: GPU serial number is {gpu.serial}."),
        ]
    return [record(prio, first_seq + i, usec + 3 * i, msg) for i, (prio, msg) in enumerate(messages)]


def link_events(state: NodeState, now: float) -> list[tuple[str, float, int, str]]:
    """The mlx5 driver's port transition lines that IB link faults caused up to `now`:
    (key, time, prio, message), key unique per transition so each is logged once. The text is
    the captured driver's: `mlx5_core 0000:53:00.0 mlx5_3: Port: 1 Link DOWN` (and `Link ACTIVE`
    when it comes back), see ../shared/fixtures/infiniband/dmesg_mlx5_roce_link_flap_*.log."""
    from podhealth.sim.faults import down_intervals

    out: list[tuple[str, float, int, str]] = []
    for f in state.faults:
        if f.kind not in ("ib-down", "ib-flap"):
            continue
        for h in state.hcas:
            if h.device != f.device or f.port not in (None, h.port) or not h.pci_addr:
                continue
            head = f"mlx5_core {h.pci_addr} {h.device}: Port: {h.port} Link"
            for i, (down, up) in enumerate(down_intervals(f)):
                if down <= now:
                    out.append((f"{f.seq}/{h.port}/{i}/down", down, PRIO_INFO, f"{head} DOWN"))
                if up <= now:
                    out.append((f"{f.seq}/{h.port}/{i}/up", up, PRIO_INFO, f"{head} ACTIVE"))
    return sorted(out, key=lambda e: e[1])
