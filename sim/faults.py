"""Faults a simulated node can suffer, parsed from the CLI's `key=value` tokens.

    xid=79 gpu=3                       an XID: kernel log line + NVML XID event
    fault=nvlink-crc gpu=0 link=5 rate=50
    fault=ib-flap device=mlx5_0 [port=1] [count=3] [period=60]
    fault=ib-counter-saturated device=mlx5_4 counter=symbol_error

`parse(tokens, now)` checks syntax and returns a `Fault`; `validate(fault, state)` checks it
against the node (GPU index, link, HCA, mount exist). Both raise ValueError naming the token and
what is allowed, so the CLI can refuse bad input before anything changes.

Counters driven by a rate fault are a pure function of time (`climbed`), so every reader in every
process sees the same monotonic value without anything ticking.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Mapping, Sequence

from podhealth.sim.state import Fault, NodeState


@dataclass(frozen=True)
class KindSpec:
    required: tuple[str, ...]
    optional: Mapping[str, float | int | None]  # param -> default (None = stays unset)
    help: str


KINDS: Mapping[str, KindSpec] = {
    "xid": KindSpec(("gpu",), {}, "XID <code> on GPU: kernel line + NVML XID event"),
    "fallen-off-bus": KindSpec(("gpu",), {}, "GPU lost: XID 79 line, NVML GPU_IS_LOST"),
    "dbe": KindSpec(("gpu",), {}, "uncorrectable (double-bit) ECC error"),
    "row-remap-pending": KindSpec(("gpu",), {}, "row remap pending (needs GPU reset)"),
    "row-remap-failure": KindSpec(("gpu",), {}, "row remapping failed (bank exhausted)"),
    "row-remap-low": KindSpec(("gpu",), {"count": 1}, "`count` memory banks low on spare rows "
                                                      "(remap histogram Low): a warning before the XID 64"),
    "nvlink-down": KindSpec(("gpu", "link"), {}, "one NVLink link inactive"),
    "nvlink-crc": KindSpec(("gpu", "link"), {"rate": 10.0}, "NVLink CRC errors climbing (errors/s)"),
    "pcie-degraded": KindSpec(("gpu",), {"width": 8, "gen": 4}, "PCIe link trained below max"),
    "thermal": KindSpec(("gpu",), {}, "HW thermal slowdown, ~92 C"),
    "power-brake": KindSpec(("gpu",), {}, "HW power brake slowdown"),
    "fabric-incomplete": KindSpec(("gpu",), {}, "NVSwitch fabric registration not completed"),
    "fabric-degraded-bw": KindSpec(("gpu",), {}, "NVLink5 fabric health mask: bandwidth degraded (GB200)"),
    "fabric-wrong-cluster": KindSpec(("gpu",), {}, "the GPU registered in another NVLink domain than its tray's (GB200)"),
    "persistence-off": KindSpec(("gpu",), {}, "persistence mode disabled"),
    "nvml-hang": KindSpec(("seconds",), {"gpu": None}, "device calls block for N seconds"),
    "ib-down": KindSpec(("device",), {}, "IB port down"),
    "ib-rate": KindSpec(("device",), {"rate": 200.0}, "IB port trained at a lower rate (Gb/s)"),
    "ib-symbol-errors": KindSpec(("device",), {"rate": 10.0}, "IB symbol errors climbing (errors/s)"),
    "ib-flap": KindSpec(("device",), {"port": None, "count": 3, "period": 60.0},
                        "IB port goes down and up `count` times, one cycle per `period` s "
                        "(down for the first half); link_downed +1 per down"),
    "ib-counter-saturated": KindSpec(("device", "counter"), {"port": None},
                                     "an IB error counter stuck at its width's maximum "
                                     "(e.g. symbol_error 65535)"),
    "nfs-missing": KindSpec(("mount",), {}, "NFS mount absent"),
    "nfs-hung": KindSpec(("mount",), {}, "NFS server not responding (stat blocks)"),
    "unit-down": KindSpec(("unit",), {}, "systemd unit failed"),
    "reboot": KindSpec((), {}, "the node booted now: <proc>/stat btime = the injection time (boot grace); "
                               "every fault without persist=1 (and not persistent by nature) is gone"),
    "gpu-reset-fails": KindSpec(("gpu",), {}, "`nvidia-smi -r` on this GPU fails (podhealth simulate gpu-reset)"),
    "gpu-busy": KindSpec(("gpu",), {}, "a compute process (pid 4242) runs on the GPU (NVML running processes)"),
    "nvml-events-unsupported": KindSpec(("gpu",), {}, "NVML refuses XID event registration on the GPU (NOT_SUPPORTED, "
                                                      "as some vGPU and passthrough drivers answer)"),
    "pcie-aer-fatal": KindSpec(("gpu",), {}, "fatal PCIe AER error (Surprise Down, Completion Timeout) on the GPU's link"),
    "edac-ue": KindSpec((), {}, "one uncorrectable host memory error on mc0's second DIMM (EDAC + kernel line)"),
    "nvme-critical": KindSpec((), {}, "nvme0 SMART critical warning 0x04 (reliability degraded) and media errors"),
    # Fail-slow (sim/perfmodel.py): a part that passes every threshold and is still slower than its peers.
    "slow-gpu": KindSpec(("gpu",), {"pct": 10.0}, "GEMM of the GPU pct % slower (fail-slow probes)"),
    "slow-hbm": KindSpec(("gpu",), {"pct": 10.0}, "device-memory bandwidth of the GPU pct % lower"),
    "slow-nvlink": KindSpec(("gpu",), {"link": None, "pct": 20.0},
                            "NVLink P2P of the GPU (a degraded link) pct % lower to every peer"),
    "slow-hca": KindSpec(("device",), {"pct": 20.0}, "RDMA bandwidth of the HCA pct % lower"),
    "thermal-throttle-intermittent": KindSpec((), {"gpu": None, "pct": 15.0, "period": 600.0},
                                              "the GPU (every GPU when gpu= is unset) thermally throttled, "
                                              "SM clock pct % down, for the first half of every period s"),
    "imex-down": KindSpec((), {}, "the tray's IMEX daemon UNAVAILABLE (nvidia-imex-ctl -q), its domain DOWN "
                                  "(GB200 NVL72 profile)"),
}

_INT_PARAMS = ("gpu", "link", "width", "gen", "code", "port", "count", "persist")
# Every kind but reboot also takes persist=1: the fault survives a reboot (a part that is broken,
# not a state the driver can leave). Kinds that survive one by nature: a failed row remap, and a
# bank's used spare rows, are recorded in the GPU's InfoROM and stay until the GPU is replaced.
PERSISTENT_KINDS = frozenset({"row-remap-failure", "row-remap-low"})
# What a GPU reset (`nvidia-smi -r`) clears on that GPU: volatile state the driver rebuilds when
# the GPU re-initialises (pending remaps are applied, volatile ECC counts and XID state cleared).
RESETTABLE_KINDS = frozenset({"xid", "dbe", "row-remap-pending", "nvlink-down", "nvlink-crc", "fabric-incomplete"})
# The reset fails while one of these is on the GPU: it cannot be reset, is lost from the bus, or a
# process still uses it (nvidia-smi refuses then; the agent checks first and answers 409).
UNRESETTABLE_KINDS = frozenset({"gpu-reset-fails", "fallen-off-bus", "gpu-busy"})
_FLOAT_PARAMS = ("rate", "seconds", "period", "pct")
_STR_PARAMS = ("device", "mount", "unit", "counter")
def counter_widths() -> Mapping[str, int]:
    """PMA counter widths (checks/data/ib_counters.yaml, the checks' own table): these counters
    saturate at their maximum instead of wrapping, and a saturated one shows no new error."""
    from podhealth.checks.passive import ib_counters

    return ib_counters.load().widths


FLAP_COUNT = 3
FLAP_PERIOD_S = 60.0
MAX_FLAPS = 1000
_TOKEN = re.compile(r"^([a-z]+)=(.+)$")
_UNIT = re.compile(r"^[A-Za-z0-9@:._\\-]+\.(service|target|socket|mount|timer)$")
_DEVICE = re.compile(r"^[A-Za-z0-9_]+$")


def kinds_help() -> str:
    return "; ".join(f"{k} ({', '.join(s.required + tuple(s.optional))})" for k, s in KINDS.items())


def parse(tokens: Sequence[str], now: float) -> Fault:
    """`["xid=79", "gpu=3"]` or `["fault=dbe", "gpu=1"]` -> Fault; ValueError on any bad token."""
    values: dict[str, str] = {}
    for tok in tokens:
        m = _TOKEN.match(tok)
        if not m:
            raise ValueError(f"bad token {tok!r}: expected key=value (e.g. xid=79 gpu=3, fault=dbe gpu=1)")
        key, val = m.groups()
        if key in values:
            raise ValueError(f"bad token {tok!r}: {key} given twice")
        values[key] = val
    if "xid" in values and "fault" in values:
        raise ValueError("give either xid=<code> or fault=<kind>, not both")
    if "xid" in values:
        kind = "xid"
        values["code"] = values.pop("xid")
    elif "fault" in values:
        kind = values.pop("fault")
        if kind not in KINDS or kind == "xid":
            raise ValueError(f"bad token 'fault={kind}': unknown fault kind (allowed: "
                             f"{', '.join(k for k in KINDS if k != 'xid')}; or xid=<code>)")
    else:
        raise ValueError(f"no fault given in {' '.join(tokens)!r}: start with fault=<kind> or xid=<code>")
    spec = KINDS[kind]
    allowed = (set(spec.required) | set(spec.optional) | ({"code"} if kind == "xid" else set())
               | ({"persist"} if kind != "reboot" else set()))
    for key in values:
        if key not in allowed:
            raise ValueError(f"bad token '{key}={values[key]}': fault {kind} takes "
                             f"{', '.join(sorted(allowed - {'code'}))}")
    for key in spec.required:
        if key not in values:
            raise ValueError(f"fault {kind} needs {key}=<value> ({spec.help})")
    args: dict[str, object] = {k: v for k, v in spec.optional.items() if v is not None}
    for key, raw in values.items():
        args[key] = _convert(key, raw)
    return Fault(kind=kind, injected_at=now, **args)


def _convert(key: str, raw: str) -> object:
    tok = f"{'xid' if key == 'code' else key}={raw}"
    if key in _INT_PARAMS:
        try:
            v = int(raw, 10)
        except ValueError:
            raise ValueError(f"bad token {tok!r}: {tok.split('=')[0]} must be a whole number") from None
        if v < 0:
            raise ValueError(f"bad token {tok!r}: {key} must be >= 0")
        if key == "code" and not 1 <= v <= 999:
            raise ValueError(f"bad token {tok!r}: XID codes are 1..999")
        if key == "width" and v not in (1, 2, 4, 8, 16, 32):
            raise ValueError(f"bad token {tok!r}: PCIe width is one of 1, 2, 4, 8, 16, 32")
        if key == "gen" and not 1 <= v <= 6:
            raise ValueError(f"bad token {tok!r}: PCIe gen is 1..6")
        if key == "port" and not 1 <= v <= 255:
            raise ValueError(f"bad token {tok!r}: IB ports are numbered 1..255")
        if key == "count" and not 1 <= v <= MAX_FLAPS:
            raise ValueError(f"bad token {tok!r}: count is 1..{MAX_FLAPS}")
        if key == "persist" and v not in (0, 1):
            raise ValueError(f"bad token {tok!r}: persist is 0 or 1")
        return v
    if key in _FLOAT_PARAMS:
        try:
            f = float(raw)
        except ValueError:
            raise ValueError(f"bad token {tok!r}: {key} must be a number") from None
        if not f > 0 or f != f or f == float("inf"):
            raise ValueError(f"bad token {tok!r}: {key} must be a finite number > 0")
        if key == "pct" and f >= 100:
            raise ValueError(f"bad token {tok!r}: pct is a slowdown in percent, below 100")
        return f
    if key == "mount":
        if not raw.startswith("/"):
            raise ValueError(f"bad token {tok!r}: mount must be an absolute path")
        return raw.rstrip("/") or "/"
    if key == "unit" and not _UNIT.match(raw):
        raise ValueError(f"bad token {tok!r}: expected a systemd unit name like nvidia-fabricmanager.service")
    if key == "counter" and raw not in counter_widths():
        raise ValueError(f"bad token {tok!r}: counter is one of the width-limited PMA counters "
                         f"({', '.join(sorted(counter_widths()))})")
    if key == "device" and not _DEVICE.match(raw):
        raise ValueError(f"bad token {tok!r}: expected an HCA name like mlx5_3")
    return raw


def validate(fault: Fault, state: NodeState) -> None:
    """ValueError if the fault names something this node does not have."""
    gpus = {g.index: g for g in state.gpus}
    if fault.gpu is not None and fault.gpu not in gpus:
        raise ValueError(f"bad token 'gpu={fault.gpu}': node {state.name} has GPUs "
                         f"{_range(sorted(gpus))}")
    if fault.link is not None and fault.gpu is not None:
        n = gpus[fault.gpu].nvlink_count
        if fault.link >= n:
            raise ValueError(f"bad token 'link={fault.link}': GPU {fault.gpu} has NVLink links "
                             f"{_range(list(range(n)))}")
    if fault.kind == "imex-down":
        from podhealth.checks import profiles

        if not profiles.load(state.profile).nvlink_domain.imex:
            raise ValueError(f"fault imex-down: node {state.name} ({state.profile}) runs no IMEX service")
    if fault.kind in ("row-remap-pending", "row-remap-failure", "row-remap-low") and fault.gpu is not None \
            and gpus[fault.gpu].remap_uncorrectable is None:
        raise ValueError(f"fault {fault.kind}: GPU {fault.gpu} ({gpus[fault.gpu].name}) has no row remapping")
    if fault.kind == "pcie-degraded" and fault.gpu is not None:
        g = gpus[fault.gpu]
        if (fault.width or 0) > g.pcie_width_max or (fault.gen or 0) > g.pcie_gen_max:
            raise ValueError(f"fault pcie-degraded: GPU {fault.gpu} maxes at gen{g.pcie_gen_max} "
                             f"x{g.pcie_width_max}; a degraded link cannot exceed that")
    if fault.device is not None:
        devs = list(dict.fromkeys(h.device for h in state.hcas))
        if fault.device not in devs:
            raise ValueError(f"bad token 'device={fault.device}': node {state.name} has HCAs "
                             f"{', '.join(devs) or 'none'}")
        ports = [h.port for h in state.hcas if h.device == fault.device]
        if fault.port is not None and fault.port not in ports:
            raise ValueError(f"bad token 'port={fault.port}': {fault.device} has ports "
                             f"{', '.join(map(str, ports))}")
        seeded = [h for h in state.hcas if h.device == fault.device and h.counters is not None
                  and fault.port in (None, h.port)]
        if fault.counter is not None and seeded and all(fault.counter not in (h.counters or {})
                                                        for h in seeded):
            raise ValueError(f"bad token 'counter={fault.counter}': {fault.device} (seeded from a "
                             f"capture) has no such counter file")
    if fault.mount is not None and fault.mount not in state.mounts:
        raise ValueError(f"bad token 'mount={fault.mount}': node {state.name} mounts "
                         f"{', '.join(state.mounts) or 'nothing'}")
    if fault.kind == "unit-down" and fault.unit not in state.units:
        raise ValueError(f"bad token 'unit={fault.unit}': node {state.name} has units "
                         f"{', '.join(sorted(state.units))}")


def survives_reboot(f: Fault) -> bool:
    return bool(f.persist) or f.kind in PERSISTENT_KINDS


def after_reboot(faults: Sequence[Fault]) -> tuple[Fault, ...]:
    """What a reboot leaves of `faults`: the persistent ones, and earlier reboots (btime is the latest)."""
    return tuple(f for f in faults if f.kind == "reboot" or survives_reboot(f))


def after_reset(faults: Sequence[Fault], gpu: int) -> tuple[Fault, ...] | None:
    """What `nvidia-smi -r -i gpu` leaves of `faults`, or None when the reset fails (a GPU that
    cannot be reset, or one lost from the bus). A persistent fault survives a reset too."""
    mine = [f for f in faults if f.gpu == gpu]
    if any(f.kind in UNRESETTABLE_KINDS for f in mine):
        return None
    return tuple(f for f in faults if f.gpu != gpu or f.kind not in RESETTABLE_KINDS or survives_reboot(f))


def check_kind(kind: str) -> str:
    if kind not in KINDS:
        raise ValueError(f"unknown fault kind {kind!r} (allowed: {', '.join(KINDS)})")
    return kind


def down_intervals(fault: Fault) -> list[tuple[float, float]]:
    """When an IB port fault holds the link down: ib-down from injection on; ib-flap `count`
    cycles of `period` s, each down for its first half and up for the second (so a reader polling
    faster than period/2 sees every transition). Pure: the same at any moment in any process."""
    if fault.kind == "ib-down":
        return [(fault.injected_at, float("inf"))]
    if fault.kind == "ib-flap":
        period = fault.period or FLAP_PERIOD_S
        return [(fault.injected_at + i * period, fault.injected_at + i * period + period / 2)
                for i in range(fault.count or FLAP_COUNT)]
    return []


def saturated_value(counter: str, value: int) -> int:
    """`value` as the PMA shows it: a width-limited counter stops at its maximum, never wraps."""
    bits = counter_widths().get(counter)
    return min(value, (1 << bits) - 1) if bits else value


def climbed(fault: Fault, now: float) -> int:
    """Errors accumulated since injection by a rate fault; 0 before injection, never decreasing."""
    return int((fault.rate or 0.0) * max(0.0, now - fault.injected_at))


def _range(items: list[int]) -> str:
    if not items:
        return "none"
    if items == list(range(items[0], items[-1] + 1)):
        return f"{items[0]}..{items[-1]}"
    return ", ".join(map(str, items))
