"""A simulated libnvidia-ml that the real pynvml (nvidia-ml-py) runs against.

pynvml calls NVML through ctypes: it loads the library into `pynvml.nvmlLib` on first
`nvmlInit()` and looks each C function up by name (`getattr(nvmlLib, name)`), caching the result
in `pynvml._nvmlGetFunctionPointer_cache`. `install(node)` puts an object there whose attributes
are `ctypes.CFUNCTYPE` callbacks implemented in Python, so every pynvml wrapper -- argument
marshalling, struct layouts, return-code to exception mapping -- runs unchanged; a function this
module does not implement raises `NVMLError_FunctionNotFound` through pynvml, as with an old driver.

API (stable):

    install(node: SimNode) -> None    route pynvml to the simulated node (uninitialised until
                                      nvmlInit(), like the real library)
    uninstall() -> None               restore pynvml to "library not loaded" (safe to call twice)
    installed() -> SimNode | None

Readings follow the node's state and faults at the moment of each call (`gpu_view`); counters
that grow (energy, NVLink traffic, CRC errors under a rate fault) are functions of wall time.
Fault effects: fallen-off-bus -> GPU_IS_LOST on every per-device call; nvml-hang -> device calls
block `seconds` in the calling thread; the rest change exactly the readings listed in `gpu_view`.

Pointer parameters are declared `c_void_p` and cast inside: typed POINTER argtypes reject the
`byref(c_nvmlDevice_t())` arguments pynvml passes.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import re
import threading
import time
import traceback
from ctypes import (CFUNCTYPE, POINTER, c_char, c_int, c_uint, c_uint64, c_ulonglong, c_void_p,
                    cast, memmove)
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Sequence

import pynvml

from podhealth.checks import profiles
from podhealth.sim.faults import climbed
from podhealth.sim.nvml_cpu import timed
from podhealth.sim.perfmodel import LOAD_POWER_SHARE, node_thermal, throttled
from podhealth.sim.state import ARCHITECTURES, GpuSpec, NodeState

if TYPE_CHECKING:
    from podhealth.sim.node import SimNode

SUCCESS = pynvml.NVML_SUCCESS
UNINITIALIZED = pynvml.NVML_ERROR_UNINITIALIZED
INVALID_ARGUMENT = pynvml.NVML_ERROR_INVALID_ARGUMENT
NOT_SUPPORTED = pynvml.NVML_ERROR_NOT_SUPPORTED
NOT_FOUND = pynvml.NVML_ERROR_NOT_FOUND
INSUFFICIENT_SIZE = pynvml.NVML_ERROR_INSUFFICIENT_SIZE
TIMEOUT = pynvml.NVML_ERROR_TIMEOUT
GPU_IS_LOST = pynvml.NVML_ERROR_GPU_IS_LOST
VERSION_MISMATCH = pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH
UNKNOWN = pynvml.NVML_ERROR_UNKNOWN

_HANDLE_BASE = 0x5D0C_0000  # fake device pointers: base + 16 * (index + 1); never dereferenced
_MIG_HANDLE_BASE = 0x5D2C_0000  # MIG device handles: base + 16 * (64 * gpu + mig index + 1)
_MIG_PER_GPU = 64
_EVENTSET_BASE = 0x5E70_0000

# Clocks-event reason bits (nvml.h nvmlClocksEventReason*).
REASON_IDLE = 0x1
REASON_HW_SLOWDOWN = 0x8
REASON_SW_THERMAL = 0x20
REASON_HW_THERMAL = 0x40
REASON_HW_POWER_BRAKE = 0x80

THERMAL_FAULT_TEMP_C = 92
IDLE_UTIL_GPU = 0
LOADED_UTIL_GPU = 95
NVLINK_IDLE_KIB_PER_S = 64  # management traffic on an idle NVSwitch fabric
SUPPORTED_EVENTS = (pynvml.nvmlEventTypeSingleBitEccError | pynvml.nvmlEventTypeDoubleBitEccError
                    | pynvml.nvmlEventTypePState | pynvml.nvmlEventTypeXidCriticalError
                    | pynvml.nvmlEventTypeClock | pynvml.nvmlEventTypePowerSourceChange)
_NVLINK_VERSION = {"ampere": pynvml.NVML_NVLINK_VERSION_3_0, "hopper": pynvml.NVML_NVLINK_VERSION_4_0,
                   "blackwell": pynvml.NVML_NVLINK_VERSION_5_0}
_ERROR_TEXT = {code: text for code, text in pynvml.NVMLError._errcode_to_string.items()}


class _Fail(Exception):
    def __init__(self, code: int) -> None:
        self.code = code


# --- what a GPU shows, given state + faults + time ---------------------------------------------


@dataclass(frozen=True)
class NvLinkView:
    active: bool
    replay: int
    recovery: int
    crc_flit: int
    crc_data: int
    tx_kib: int
    rx_kib: int


@dataclass(frozen=True)
class GpuView:
    spec: GpuSpec
    lost: bool
    temperature_c: int
    mem_temperature_c: int
    power_mw: int
    energy_mj: int
    clocks: tuple[int, int, int, int]  # graphics, sm, mem, video (MHz)
    reasons: int
    pcie_gen: int
    pcie_width: int
    ecc_sbe: tuple[int, int]  # volatile, aggregate
    ecc_dbe: tuple[int, int]
    remap: tuple[int, int, int, int] | None  # correctable, uncorrectable, pending, failure
    remap_histogram: tuple[int, int, int, int, int] | None  # banks: max, high, partial, low, none
    fabric_state: int
    persistence: bool
    links: tuple[NvLinkView, ...]
    nvl_domain: bool = False  # the node's GPUs are in a multi-node NVLink domain (GB200 NVL72)
    kinds: frozenset[str] = frozenset()  # the fault kinds on this GPU
    utilization: int = 0  # percent: IDLE_UTIL_GPU, or LOADED_UTIL_GPU while a job runs on it


# Banks an H100 80GB HBM3 reports in its remap histogram (nvidia-smi -q, 565.57.01 capture:
# "Max : 2560 bank(s)"); a node seeded from a capture keeps its own count (H200: 3072).
REMAP_BANKS = 2560


def _idle_clocks(g: GpuSpec) -> tuple[int, int, int, int]:
    # An idle Hopper GPU parks graphics/SM at 345 MHz and video near half its max; memory stays at max.
    low = min(345, g.max_sm_clock_mhz)
    idle = (low, low, g.max_mem_clock_mhz, g.max_video_clock_mhz // 2)
    # a node seeded from nvidia-smi -q answers the captured clocks
    seeded = (g.clock_graphics_mhz, g.clock_sm_mhz, g.clock_mem_mhz, g.clock_video_mhz)
    return (seeded[0] if seeded[0] is not None else idle[0], seeded[1] if seeded[1] is not None else idle[1],
            seeded[2] if seeded[2] is not None else idle[2], seeded[3] if seeded[3] is not None else idle[3])


@functools.lru_cache(maxsize=64)
def _in_nvl_domain(profile: str) -> bool:
    return profiles.load(profile).nvlink_domain.gpus > 0


def gpu_view(state: NodeState, index: int, now: float, loaded: bool = False) -> GpuView:
    """Every NVML reading of GPU `index` at wall time `now`, with the node's faults applied;
    `loaded`: a job runs on it (`simulate job start`), so it computes."""
    g = state.gpu(index)
    mine = [f for f in state.faults if f.gpu == index]
    kinds = {f.kind for f in mine}
    temp, reasons = g.temperature_c, g.clocks_event_reasons
    clocks = _idle_clocks(g)
    power_w, util = g.power_w, IDLE_UTIL_GPU
    if loaded:
        # A training step: SM clock at what the node's cooling allows (sim/perfmodel.py's per-node
        # thermal headroom), most of the power limit, busy. A fault below may hold it lower.
        sm = int(g.max_sm_clock_mhz * node_thermal(0, state))
        clocks = (sm, sm, clocks[2], clocks[3])
        reasons &= ~REASON_IDLE
        power_w, util = g.power_limit_w * LOAD_POWER_SHARE, LOADED_UTIL_GPU
    if "thermal" in kinds:
        # A GPU that overheats is a busy one: not idle, HW + SW thermal slowdown, SM clock halved.
        temp = THERMAL_FAULT_TEMP_C
        reasons = (reasons & ~REASON_IDLE) | REASON_HW_SLOWDOWN | REASON_HW_THERMAL | REASON_SW_THERMAL
        half = g.max_sm_clock_mhz // 2
        clocks = (half, half, clocks[2], clocks[3])
    hot = throttled(state, index, now)
    if hot and "thermal" not in kinds:
        # fault=thermal-throttle-intermittent, in its hot half-period (sim/perfmodel.py): busy and
        # held pct % below its maximum SM clock by a thermal slowdown.
        temp = THERMAL_FAULT_TEMP_C
        reasons = (reasons & ~REASON_IDLE) | REASON_HW_THERMAL | REASON_SW_THERMAL
        held = int(g.max_sm_clock_mhz * (1.0 - hot))
        clocks = (held, held, clocks[2], clocks[3])
    if "power-brake" in kinds:
        reasons |= REASON_HW_SLOWDOWN | REASON_HW_POWER_BRAKE
    gen, width = g.pcie_gen_max, g.pcie_width_max
    for f in mine:
        if f.kind == "pcie-degraded":
            gen, width = min(gen, f.gen or gen), min(width, f.width or width)
    dbe = sum(1 for f in mine if f.kind == "dbe")
    remap: tuple[int, int, int, int] | None = None
    if g.remap_uncorrectable is not None and g.remap_correctable is not None:
        pending = sum(1 for f in mine if f.kind == "row-remap-pending")
        # banks run low on spare rows by remapping rows: each row-remap-low bank used some
        used = sum(f.count or 1 for f in mine if f.kind == "row-remap-low")
        remap = (g.remap_correctable + used, g.remap_uncorrectable + pending,
                 int(g.remap_pending or pending > 0),
                 int(g.remap_failure or "row-remap-failure" in kinds))
    hist: tuple[int, int, int, int, int] | None = None
    if remap is not None:
        hist = g.remap_histogram or (REMAP_BANKS, 0, 0, 0, 0)
        # a failed remap means a bank ran out of spare rows; row-remap-low faults take banks to Low
        low = sum(f.count or 1 for f in mine if f.kind == "row-remap-low")
        none = max(hist[4], 1 if remap[3] else 0)
        moved = min(hist[0], low + (none - hist[4]))
        hist = (hist[0] - moved, hist[1], hist[2], hist[3] + low, none)
    fabric = pynvml.NVML_GPU_FABRIC_STATE_NOT_SUPPORTED
    if g.has_fabric:
        fabric = (pynvml.NVML_GPU_FABRIC_STATE_IN_PROGRESS if "fabric-incomplete" in kinds
                  else pynvml.NVML_GPU_FABRIC_STATE_COMPLETED)
    up = max(0.0, now - state.t0)
    links = []
    for link in range(g.nvlink_count):
        down = [f for f in mine if f.kind == "nvlink-down" and f.link == link]
        # Traffic counters stop moving when the link goes down.
        until = min([f.injected_at for f in down], default=now)
        kib = int(NVLINK_IDLE_KIB_PER_S * max(0.0, min(now, until) - state.t0))
        crc = sum(climbed(f, now) for f in mine if f.kind == "nvlink-crc" and f.link == link)
        links.append(NvLinkView(active=not down, replay=0, recovery=0, crc_flit=crc, crc_data=0,
                                tx_kib=kib, rx_kib=kib))
    return GpuView(
        spec=g,
        lost="fallen-off-bus" in kinds,
        temperature_c=temp,
        mem_temperature_c=g.mem_temperature_c,
        power_mw=int(power_w * 1000),
        energy_mj=int(g.power_w * 1000 * up),
        clocks=clocks,
        reasons=reasons,
        pcie_gen=gen,
        pcie_width=width,
        ecc_sbe=(g.ecc_sbe_volatile, g.ecc_sbe_aggregate),
        ecc_dbe=(g.ecc_dbe_volatile + dbe, g.ecc_dbe_aggregate + dbe),
        remap=remap,
        remap_histogram=hist,
        fabric_state=fabric,
        persistence=g.persistence_mode and "persistence-off" not in kinds,
        links=tuple(links),
        nvl_domain=_in_nvl_domain(state.profile),
        kinds=frozenset(kinds),
        utilization=util,
    )


# --- the library --------------------------------------------------------------------------------


@dataclass
class _EventSet:
    created_at: float
    masks: dict[int, int]  # gpu index -> registered event mask
    delivered: set[int]  # fault seqs already handed out


class _Backend:
    """The simulated library's own state: init refcount, event sets."""

    def __init__(self, node: "SimNode") -> None:
        self.node = node
        self.refcount = 0
        self.lock = threading.Lock()
        self.event_sets: dict[int, _EventSet] = {}
        self.next_set = 1
        # nvmlErrorString returns a const char* the caller never frees: keep the buffers alive.
        self.error_strings: dict[int, ctypes.Array[c_char]] = {}
        # gpu index -> (state, time slot, view): the calls of one collection (20-odd per GPU
        # within a millisecond or two) share one view instead of each rebuilding all 18 links.
        self.views: dict[int, tuple[NodeState, int, GpuView]] = {}

    # helpers used by the callbacks

    def require_init(self) -> NodeState:
        if self.refcount <= 0:
            raise _Fail(UNINITIALIZED)
        return self.node.state

    def hang(self, state: NodeState, index: int | None) -> None:
        for f in state.faults:
            if f.kind == "nvml-hang" and (f.gpu is None or f.gpu == index):
                # A wedged driver holds the caller inside the ioctl; so do we.
                time.sleep(f.seconds or 0.0)
                return

    def device(self, handle: int | None, allow_lost: bool = False) -> GpuView:
        state = self.require_init()
        index = handle_index(handle)
        if index is None or not any(g.index == index for g in state.gpus):
            # A MIG device handle is no GPU handle: NVML refuses most whole-GPU queries on one.
            raise _Fail(INVALID_ARGUMENT)
        self.hang(state, index)
        view = self.view(self.node.state, index)
        if view.lost and not allow_lost:
            raise _Fail(GPU_IS_LOST)
        # What this SKU / driver generation answers for the function being called (GpuSpec.nvml_errors).
        code = view.spec.nvml_errors.get(getattr(_calling, "name", ""))
        if code is not None:
            raise _Fail(code)
        return view


    def loaded_gpus(self) -> set[int]:
        """GPUs a job runs on: the records `podhealth simulate job start` writes beside the node
        (the directory the simulated agent reads, sim/agentnode.py); none when it cannot be read."""
        from podhealth.collectors import job_records
        from podhealth.sim.cmd_job import state_dir_of

        try:
            recs, _ = job_records.read_records(state_dir_of(self.node.dir))
        except OSError:
            return set()
        return set(job_records.by_gpu(recs))

    def view(self, state: NodeState, index: int) -> GpuView:
        """gpu_view at the current VIEW_SLOT_S time slot, built once per slot and state."""
        now = time.time()
        slot = int(now / VIEW_SLOT_S)
        hit = self.views.get(index)
        if hit is not None and hit[0] is state and hit[1] == slot:
            return hit[2]
        view = gpu_view(state, index, now, loaded=index in self.loaded_gpus())
        self.views[index] = (state, slot, view)  # a racing thread at worst builds it twice
        return view


# Readings that grow with time (energy, NVLink traffic, a climbing CRC count) move in steps of
# this: far finer than any collector interval, and it lets one collection's calls share a view.
VIEW_SLOT_S = 0.01


def handle_of(index: int) -> int:
    return _HANDLE_BASE + 16 * (index + 1)


def handle_index(handle: int | None) -> int | None:
    if handle is None or handle <= _HANDLE_BASE or handle >= _MIG_HANDLE_BASE or (handle - _HANDLE_BASE) % 16:
        return None
    return (handle - _HANDLE_BASE) // 16 - 1


def mig_handle_of(gpu: int, mig: int) -> int:
    return _MIG_HANDLE_BASE + 16 * (_MIG_PER_GPU * gpu + mig + 1)


def mig_handle_index(handle: int | None) -> tuple[int, int] | None:
    """(gpu index, MIG device index) of a MIG device handle, else None."""
    if handle is None or handle <= _MIG_HANDLE_BASE or (handle - _MIG_HANDLE_BASE) % 16:
        return None
    gpu, mig = divmod((handle - _MIG_HANDLE_BASE) // 16 - 1, _MIG_PER_GPU)
    return gpu, mig


def _put(ptr: int | None, ctype: Any, value: Any) -> None:
    if not ptr:
        raise _Fail(INVALID_ARGUMENT)
    cast(ptr, POINTER(ctype))[0] = value


def _put_str(buf: int | None, length: int, text: str) -> None:
    data = text.encode() + b"\0"
    if not buf:
        raise _Fail(INVALID_ARGUMENT)
    if len(data) > length:
        raise _Fail(INSUFFICIENT_SIZE)
    memmove(buf, data, len(data))


def _struct(ptr: int | None, ctype: Any) -> Any:
    if not ptr:
        raise _Fail(INVALID_ARGUMENT)
    return cast(ptr, POINTER(ctype)).contents


def _versioned(ptr: int | None, ctype: Any, version: int) -> Any:
    """A versioned struct the caller passed: refused as the real library does (VERSION_MISMATCH)
    unless its `version` is the one this call speaks."""
    st = _struct(ptr, ctype)
    if st.version != version:
        raise _Fail(VERSION_MISMATCH)
    return st


_backend: _Backend | None = None
_install_lock = threading.Lock()


def _b() -> _Backend:
    b = _backend
    if b is None:
        raise _Fail(UNINITIALIZED)
    return b


# Each entry: C name -> (argtypes after the c_int return, implementation). Implementations raise
# _Fail(code) for an NVML error and return nothing on success.
_IMPLS: dict[str, tuple[tuple[Any, ...], Callable[..., None]]] = {}


def _impl(*names: str, args: Sequence[Any]) -> Callable[[Callable[..., None]], Callable[..., None]]:
    def register(fn: Callable[..., None]) -> Callable[..., None]:
        for n in names:
            _IMPLS[n] = (tuple(args), fn)
        return fn
    return register


P = c_void_p


# init / system


@_impl("nvmlInitWithFlags", args=[c_uint])
def _init_with_flags(flags: int) -> None:
    b = _b()
    with b.lock:
        b.refcount += 1


@_impl("nvmlInit_v2", "nvmlInit", args=[])
def _init() -> None:
    _init_with_flags(0)


@_impl("nvmlShutdown", args=[])
def _shutdown() -> None:
    b = _b()
    with b.lock:
        if b.refcount <= 0:
            raise _Fail(UNINITIALIZED)
        b.refcount -= 1
        if b.refcount == 0:
            b.event_sets.clear()


@_impl("nvmlSystemGetDriverVersion", args=[P, c_uint])
def _driver_version(buf: int, length: int) -> None:
    _put_str(buf, length, _b().require_init().driver_version)


@_impl("nvmlSystemGetNVMLVersion", args=[P, c_uint])
def _nvml_version(buf: int, length: int) -> None:
    _put_str(buf, length, _b().require_init().nvml_version)


@_impl("nvmlSystemGetCudaDriverVersion", "nvmlSystemGetCudaDriverVersion_v2", args=[P])
def _cuda_version(ptr: int) -> None:
    _put(ptr, c_int, _b().require_init().cuda_version)


# enumeration


@_impl("nvmlDeviceGetCount_v2", "nvmlDeviceGetCount", args=[P])
def _count(ptr: int) -> None:
    b = _b()
    state = b.require_init()
    b.hang(state, None)
    # A GPU that fell off the bus is still enumerated (its PCI device exists); calls on it fail.
    _put(ptr, c_uint, len(b.node.state.gpus))


@_impl("nvmlDeviceGetHandleByIndex_v2", "nvmlDeviceGetHandleByIndex", args=[c_uint, P])
def _handle_by_index(index: int, ptr: int) -> None:
    b = _b()
    state = b.require_init()
    if not any(g.index == index for g in state.gpus):
        raise _Fail(INVALID_ARGUMENT)
    b.device(handle_of(index))
    _put(ptr, c_void_p, handle_of(index))


def _find(pred: Callable[[GpuSpec], bool]) -> int:
    state = _b().require_init()
    for g in state.gpus:
        if pred(g):
            return g.index
    raise _Fail(NOT_FOUND)


def _c_string(ptr: int | None) -> str:
    if not ptr:
        raise _Fail(INVALID_ARGUMENT)
    raw = ctypes.string_at(ptr)
    return raw.decode(errors="replace")


def _norm_bus_id(text: str) -> tuple[int, int, int, int]:
    """"0000:18:00.0", "00000000:18:00.0" or "18:00.0" -> (domain, bus, device, function)."""
    try:
        parts = text.strip().split(":")
        if len(parts) == 2:
            parts = ["0"] + parts
        dom, bus, rest = parts
        dev, _, fn = rest.partition(".")
        return int(dom, 16), int(bus, 16), int(dev, 16), int(fn or "0", 16)
    except ValueError:
        raise _Fail(INVALID_ARGUMENT) from None


@_impl("nvmlDeviceGetHandleByPciBusId_v2", "nvmlDeviceGetHandleByPciBusId", args=[P, P])
def _handle_by_bus(bus_id: int, ptr: int) -> None:
    want = _norm_bus_id(_c_string(bus_id))
    index = _find(lambda g: _norm_bus_id(g.pci_bus_id) == want)
    _b().device(handle_of(index))
    _put(ptr, c_void_p, handle_of(index))


@_impl("nvmlDeviceGetHandleByUUID", args=[P, P])
def _handle_by_uuid(uuid_ptr: int, ptr: int) -> None:
    want = _c_string(uuid_ptr)
    index = _find(lambda g: g.uuid == want)
    _b().device(handle_of(index))
    _put(ptr, c_void_p, handle_of(index))


@_impl("nvmlDeviceGetIndex", args=[P, P])
def _index(h: int, ptr: int) -> None:
    _put(ptr, c_uint, _b().device(h).spec.index)


# identity


@_impl("nvmlDeviceGetName", args=[P, P, c_uint])
def _name(h: int, buf: int, n: int) -> None:
    mig = _mig(h)
    if mig is not None:
        _put_str(buf, n, f"{mig[0].spec.name} MIG {mig[1]}")  # as nvidia-smi -L names MIG devices
        return
    _put_str(buf, n, _b().device(h).spec.name)


@_impl("nvmlDeviceGetUUID", args=[P, P, c_uint])
def _uuid(h: int, buf: int, n: int) -> None:
    mig = _mig(h)
    if mig is not None:
        _put_str(buf, n, mig_uuid(mig[0].spec, mig[2]))
        return
    _put_str(buf, n, _b().device(h).spec.uuid)


@_impl("nvmlDeviceGetSerial", args=[P, P, c_uint])
def _serial(h: int, buf: int, n: int) -> None:
    _put_str(buf, n, _b().device(h).spec.serial)


@_impl("nvmlDeviceGetVbiosVersion", args=[P, P, c_uint])
def _vbios(h: int, buf: int, n: int) -> None:
    _put_str(buf, n, _b().device(h).spec.vbios)


def _fill_pci(info: Any, g: GpuSpec, legacy_field: str) -> None:
    dom, bus, dev, _ = _norm_bus_id(g.pci_bus_id)
    info.domain, info.bus, info.device = dom, bus, dev
    info.pciDeviceId, info.pciSubSystemId = g.pci_device_id, g.pci_subsystem_id
    setattr(info, legacy_field, f"{dom:04X}:{bus:02X}:{dev:02X}.0".encode())
    if hasattr(info, "busId") and legacy_field != "busId":
        info.busId = g.pci_bus_id.encode()


@_impl("nvmlDeviceGetPciInfo_v3", args=[P, P])
def _pci_v3(h: int, ptr: int) -> None:
    g = _b().device(h).spec
    _fill_pci(_struct(ptr, pynvml.nvmlPciInfo_t), g, "busIdLegacy")


@_impl("nvmlDeviceGetPciInfo_v2", "nvmlDeviceGetPciInfo", args=[P, P])
def _pci_v2(h: int, ptr: int) -> None:
    g = _b().device(h).spec
    _fill_pci(_struct(ptr, pynvml.nvmlPciInfo_v2_t), g, "busId")


@_impl("nvmlDeviceGetArchitecture", args=[P, P])
def _arch(h: int, ptr: int) -> None:
    _put(ptr, c_uint, ARCHITECTURES.get(_b().device(h).spec.architecture, 0xFFFFFFFF))


@_impl("nvmlDeviceGetPersistenceMode", args=[P, P])
def _persistence(h: int, ptr: int) -> None:
    _put(ptr, c_uint, int(_b().device(h).persistence))


# utilisation, memory, thermals, power


def _whole_gpu_only(v: GpuView) -> None:
    # MIG mode: NVML does not report device utilization (nor encoder/decoder) on the parent GPU;
    # nvidia-smi prints N/A (../shared/fixtures nvidia-smi -q -x of an A100-SXM4 in MIG mode, R510).
    if v.spec.mig_mode:
        raise _Fail(NOT_SUPPORTED)


@_impl("nvmlDeviceGetUtilizationRates", args=[P, P])
def _util(h: int, ptr: int) -> None:
    v = _b().device(h)
    _whole_gpu_only(v)
    u = _struct(ptr, pynvml.c_nvmlUtilization_t)
    u.gpu, u.memory = v.utilization, 0


# An idle H100 SXM reports "Encoder : 0 %" and "Decoder : 0 %" (nvidia-smi -q, driver 565.57.01):
# NVML answers with a value, not NOT_SUPPORTED, although the SXM part carries no NVENC.
IDLE_UTIL_ENC = IDLE_UTIL_DEC = 0
# The window the percentage covers (µs); nvidia-smi does not print it. The driver's value varies
# with the engine clocks; this one is only plausible, and nothing reads it but the caller.
ENC_DEC_SAMPLING_US = 167_000


@_impl("nvmlDeviceGetEncoderUtilization", args=[P, P, P])
def _enc_util(h: int, util: int, period: int) -> None:
    _whole_gpu_only(_b().device(h))
    _put(util, c_uint, IDLE_UTIL_ENC)
    _put(period, c_uint, ENC_DEC_SAMPLING_US)


@_impl("nvmlDeviceGetDecoderUtilization", args=[P, P, P])
def _dec_util(h: int, util: int, period: int) -> None:
    _whole_gpu_only(_b().device(h))
    _put(util, c_uint, IDLE_UTIL_DEC)
    _put(period, c_uint, ENC_DEC_SAMPLING_US)


_RESERVED_MIB = 454  # driver-reserved framebuffer on an H100 (nvidia-smi -q, FB Memory Usage)
_USED_MIB = 1


@_impl("nvmlDeviceGetMemoryInfo", args=[P, P])
def _mem_v1(h: int, ptr: int) -> None:
    mig = _mig(h)
    g = _b().device(h).spec if mig is None else mig[0].spec
    m = _struct(ptr, pynvml.c_nvmlMemory_t)
    total = (g.memory_total_mib if mig is None else mig_memory_mib(mig[1])) << 20
    used = (_RESERVED_MIB + _USED_MIB) << 20  # v1 counts the reserved memory as used
    m.total, m.used, m.free = total, used, total - used


@_impl("nvmlDeviceGetMemoryInfo_v2", args=[P, P])
def _mem_v2(h: int, ptr: int) -> None:
    mig = _mig(h)
    g = _b().device(h).spec if mig is None else mig[0].spec
    m = _versioned(ptr, pynvml.c_nvmlMemory_v2_t, pynvml.nvmlMemory_v2)
    total = (g.memory_total_mib if mig is None else mig_memory_mib(mig[1])) << 20
    m.total, m.reserved, m.used = total, _RESERVED_MIB << 20, _USED_MIB << 20
    m.free = total - m.reserved - m.used


def _temperature(v: GpuView, sensor: int) -> int:
    if sensor != pynvml.NVML_TEMPERATURE_GPU:
        raise _Fail(INVALID_ARGUMENT)
    return v.temperature_c


@_impl("nvmlDeviceGetTemperature", args=[P, c_uint, P])
def _temp(h: int, sensor: int, ptr: int) -> None:
    _put(ptr, c_uint, _temperature(_b().device(h), sensor))


@_impl("nvmlDeviceGetTemperatureV", args=[P, P])
def _temp_v(h: int, ptr: int) -> None:
    v = _b().device(h)
    t = _versioned(ptr, pynvml.c_nvmlTemperature_v1_t, pynvml.nvmlTemperature_v1)
    t.temperature = _temperature(v, t.sensorType)


@_impl("nvmlDeviceGetMarginTemperature", args=[P, P])
def _margin(h: int, ptr: int) -> None:
    # nvml.h: nvmlMarginTemperature_v1_t {version, marginTemperature}; the margin is signed (a GPU
    # above T.Limit reads negative), nvidia-smi prints it as "GPU T.Limit Temp".
    v = _b().device(h)
    m = _versioned(ptr, pynvml.c_nvmlMarginTemperature_v1_t, pynvml.nvmlMarginTemperature_v1)
    m.marginTemperature = v.spec.temp_max_operating_c - v.temperature_c


@_impl("nvmlDeviceGetTemperatureThreshold", args=[P, c_uint, P])
def _temp_threshold(h: int, kind: int, ptr: int) -> None:
    g = _b().device(h).spec
    values = {pynvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN: g.temp_shutdown_c,
              pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN: g.temp_slowdown_c,
              pynvml.NVML_TEMPERATURE_THRESHOLD_MEM_MAX: g.mem_temp_max_c,
              pynvml.NVML_TEMPERATURE_THRESHOLD_GPU_MAX: g.temp_max_operating_c}
    if kind not in values:
        raise _Fail(NOT_SUPPORTED if 0 <= kind < pynvml.NVML_TEMPERATURE_THRESHOLD_COUNT else INVALID_ARGUMENT)
    _put(ptr, c_uint, values[kind])


@_impl("nvmlDeviceGetPowerUsage", args=[P, P])
def _power(h: int, ptr: int) -> None:
    _put(ptr, c_uint, _b().device(h).power_mw)


@_impl("nvmlDeviceGetEnforcedPowerLimit", "nvmlDeviceGetPowerManagementLimit",
       "nvmlDeviceGetPowerManagementDefaultLimit", args=[P, P])
def _power_limit(h: int, ptr: int) -> None:
    _put(ptr, c_uint, _b().device(h).spec.power_limit_w * 1000)


@_impl("nvmlDeviceGetTotalEnergyConsumption", args=[P, P])
def _energy(h: int, ptr: int) -> None:
    _put(ptr, c_uint64, _b().device(h).energy_mj)


# clocks


def _clock_index(kind: int) -> int:
    if not 0 <= kind < pynvml.NVML_CLOCK_COUNT:
        raise _Fail(INVALID_ARGUMENT)
    return kind


@_impl("nvmlDeviceGetClockInfo", args=[P, c_uint, P])
def _clock(h: int, kind: int, ptr: int) -> None:
    v = _b().device(h)
    _put(ptr, c_uint, v.clocks[_clock_index(kind)])


@_impl("nvmlDeviceGetMaxClockInfo", args=[P, c_uint, P])
def _max_clock(h: int, kind: int, ptr: int) -> None:
    g = _b().device(h).spec
    maxes = (g.max_graphics_clock_mhz, g.max_sm_clock_mhz, g.max_mem_clock_mhz, g.max_video_clock_mhz)
    _put(ptr, c_uint, maxes[_clock_index(kind)])


@_impl("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons",
       args=[P, P])
def _reasons(h: int, ptr: int) -> None:
    _put(ptr, c_ulonglong, _b().device(h).reasons)


@_impl("nvmlDeviceGetSupportedClocksEventReasons", "nvmlDeviceGetSupportedClocksThrottleReasons",
       args=[P, P])
def _supported_reasons(h: int, ptr: int) -> None:
    _put(ptr, c_ulonglong, _b().device(h).spec.clocks_event_supported)


# PCIe


@_impl("nvmlDeviceGetCurrPcieLinkGeneration", args=[P, P])
def _pcie_gen(h: int, ptr: int) -> None:
    _put(ptr, c_uint, _b().device(h).pcie_gen)


@_impl("nvmlDeviceGetMaxPcieLinkGeneration", "nvmlDeviceGetGpuMaxPcieLinkGeneration", args=[P, P])
def _pcie_gen_max(h: int, ptr: int) -> None:
    _put(ptr, c_uint, _b().device(h).spec.pcie_gen_max)


@_impl("nvmlDeviceGetCurrPcieLinkWidth", args=[P, P])
def _pcie_width(h: int, ptr: int) -> None:
    _put(ptr, c_uint, _b().device(h).pcie_width)


@_impl("nvmlDeviceGetMaxPcieLinkWidth", args=[P, P])
def _pcie_width_max(h: int, ptr: int) -> None:
    _put(ptr, c_uint, _b().device(h).spec.pcie_width_max)


@_impl("nvmlDeviceGetPcieReplayCounter", args=[P, P])
def _pcie_replay(h: int, ptr: int) -> None:
    _put(ptr, c_uint, _b().device(h).spec.pcie_replay)


# ECC, retired pages, row remapping


def _ecc_counts(v: GpuView, err_type: int, counter: int) -> int:
    if not v.spec.ecc_enabled:
        raise _Fail(NOT_SUPPORTED)
    if err_type not in (0, 1) or counter not in (0, 1):
        raise _Fail(INVALID_ARGUMENT)
    if v.spec.mig_mode and counter == pynvml.NVML_VOLATILE_ECC:
        # The same MIG capture: volatile DRAM/SRAM counts N/A on the parent, aggregate ones read.
        raise _Fail(NOT_SUPPORTED)
    return (v.ecc_sbe if err_type == pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED else v.ecc_dbe)[counter]


@_impl("nvmlDeviceGetTotalEccErrors", args=[P, c_uint, c_uint, P])
def _ecc_total(h: int, err_type: int, counter: int, ptr: int) -> None:
    _put(ptr, c_ulonglong, _ecc_counts(_b().device(h), err_type, counter))


@_impl("nvmlDeviceGetMemoryErrorCounter", args=[P, c_uint, c_uint, c_uint, P])
def _ecc_location(h: int, err_type: int, counter: int, location: int, ptr: int) -> None:
    v = _b().device(h)
    total = _ecc_counts(v, err_type, counter)
    if location == pynvml.NVML_MEMORY_LOCATION_DRAM:
        _put(ptr, c_ulonglong, total)
    elif location == pynvml.NVML_MEMORY_LOCATION_SRAM:
        _put(ptr, c_ulonglong, 0)
    elif 0 <= location < pynvml.NVML_MEMORY_LOCATION_COUNT:
        raise _Fail(NOT_SUPPORTED)  # Hopper reports only DRAM and SRAM ("L1 Cache: N/A")
    else:
        raise _Fail(INVALID_ARGUMENT)


@_impl("nvmlDeviceGetEccMode", args=[P, P, P])
def _ecc_mode(h: int, cur: int, pending: int) -> None:
    on = int(_b().device(h).spec.ecc_enabled)
    _put(cur, c_uint, on)
    _put(pending, c_uint, on)


def _retired(h: int, cause: int, count_ptr: int, pages: int, times: int | None) -> None:
    g = _b().device(h).spec
    if g.retired_pages_sbe is None or g.retired_pages_dbe is None:
        raise _Fail(NOT_SUPPORTED)
    if cause not in (0, 1):
        raise _Fail(INVALID_ARGUMENT)
    n = g.retired_pages_sbe if cause == 0 else g.retired_pages_dbe
    cap = cast(count_ptr, POINTER(c_uint))[0] if count_ptr else 0
    _put(count_ptr, c_uint, n)
    if n > cap or (n and not pages):
        raise _Fail(INSUFFICIENT_SIZE)
    for i in range(n):
        # Synthetic but stable page addresses: distinct per cause and index.
        cast(pages, POINTER(c_ulonglong))[i] = 0x1000 * (1 + i) + (0x80000000 if cause else 0)
        if times:
            cast(times, POINTER(c_ulonglong))[i] = int(_b().node.state.t0) * 1_000_000


@_impl("nvmlDeviceGetRetiredPages", args=[P, c_uint, P, P])
def _retired_v1(h: int, cause: int, count_ptr: int, pages: int) -> None:
    _retired(h, cause, count_ptr, pages, None)


@_impl("nvmlDeviceGetRetiredPages_v2", args=[P, c_uint, P, P, P])
def _retired_v2(h: int, cause: int, count_ptr: int, pages: int, times: int) -> None:
    _retired(h, cause, count_ptr, pages, times)


# pynvml's size query calls the _v2 function with 4 arguments (the timestamps pointer left out;
# harmless in C, where pages=NULL means "count only"). A CFUNCTYPE insists on its arity, so this
# one entry point dispatches on the argument count to a 4- or 5-parameter C callback.
_ARITY_VARIANTS = {"nvmlDeviceGetRetiredPages_v2": ((P, c_uint, P, P), _retired_v1)}


@_impl("nvmlDeviceGetRetiredPagesPendingStatus", args=[P, P])
def _retired_pending(h: int, ptr: int) -> None:
    g = _b().device(h).spec
    if g.retired_pages_sbe is None:
        raise _Fail(NOT_SUPPORTED)
    _put(ptr, c_uint, int(g.retired_pages_pending))


@_impl("nvmlDeviceGetRemappedRows", args=[P, P, P, P, P])
def _remapped(h: int, corr: int, unc: int, pending: int, failure: int) -> None:
    v = _b().device(h)
    if v.remap is None:
        raise _Fail(NOT_SUPPORTED)
    for ptr, value in zip((corr, unc, pending, failure), v.remap):
        _put(ptr, c_uint, value)


@_impl("nvmlDeviceGetRowRemapperHistogram", args=[P, P])
def _remap_histogram(h: int, ptr: int) -> None:
    # nvml.h: nvmlRowRemapperHistogramValues_t {max, high, partial, low, none}: banks by how many
    # spare rows they have left. NOT_SUPPORTED where rows do not remap (pre-Ampere), as the rows call.
    v = _b().device(h)
    if v.remap is None or v.remap_histogram is None:
        raise _Fail(NOT_SUPPORTED)
    out = _struct(ptr, pynvml.c_nvmlRowRemapperHistogramValues)
    out.max, out.high, out.partial, out.low, out.none = v.remap_histogram


# NVLink


def _link(v: GpuView, link: int) -> NvLinkView:
    if not v.links:
        raise _Fail(NOT_SUPPORTED)
    if not 0 <= link < len(v.links):
        raise _Fail(INVALID_ARGUMENT)
    return v.links[link]


@_impl("nvmlDeviceGetNvLinkState", args=[P, c_uint, P])
def _nvlink_state(h: int, link: int, ptr: int) -> None:
    _put(ptr, c_uint, int(_link(_b().device(h), link).active))


@_impl("nvmlDeviceGetNvLinkVersion", args=[P, c_uint, P])
def _nvlink_version(h: int, link: int, ptr: int) -> None:
    v = _b().device(h)
    _link(v, link)
    _put(ptr, c_uint, _NVLINK_VERSION.get(v.spec.architecture, pynvml.NVML_NVLINK_VERSION_INVALID))


_LINK_COUNTERS = {
    pynvml.NVML_NVLINK_ERROR_DL_REPLAY: "replay",
    pynvml.NVML_NVLINK_ERROR_DL_RECOVERY: "recovery",
    pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT: "crc_flit",
    pynvml.NVML_NVLINK_ERROR_DL_CRC_DATA: "crc_data",
}


@_impl("nvmlDeviceGetNvLinkErrorCounter", args=[P, c_uint, c_uint, P])
def _nvlink_errors(h: int, link: int, counter: int, ptr: int) -> None:
    lv = _link(_b().device(h), link)
    if counter == pynvml.NVML_NVLINK_ERROR_DL_ECC_DATA:
        _put(ptr, c_ulonglong, 0)
        return
    if counter not in _LINK_COUNTERS:
        raise _Fail(INVALID_ARGUMENT)
    _put(ptr, c_ulonglong, getattr(lv, _LINK_COUNTERS[counter]))


def _per_link_fields() -> dict[int, tuple[str, int]]:
    """Legacy per-"lane" field ids (they count per link, links 0-11) -> (counter, link)."""
    out: dict[int, tuple[str, int]] = {}
    for prefix, counter in (("CRC_FLIT", "crc_flit"), ("CRC_DATA", "crc_data"),
                            ("REPLAY", "replay"), ("RECOVERY", "recovery")):
        for link in range(12):
            name = f"NVML_FI_DEV_NVLINK_{prefix}_ERROR_COUNT_L{link}"
            if hasattr(pynvml, name):
                out[getattr(pynvml, name)] = (counter, link)
    return out


_FIELD_PER_LINK = _per_link_fields()
_FIELD_TOTALS = {
    pynvml.NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL: "crc_flit",
    pynvml.NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL: "crc_data",
    pynvml.NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL: "replay",
    pynvml.NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL: "recovery",
}
# Newer per-link fields take the link as scopeId (UINT_MAX or out of range = invalid).
_FIELD_SCOPED = {
    pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY: "replay",
    pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY: "recovery",
    pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_CRC: "crc_flit",
    pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX: "tx_kib",
    pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX: "rx_kib",
    pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_TX: "tx_kib",
    pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_RX: "rx_kib",
}
_ALL_LINKS = 0xFFFFFFFF
# `nvidia-smi nvlink --status` on an H100 SXM: "Link 0: 26.562 GB/s" on each of its 18 links
# (../shared/fixtures/nvidia_smi/nvidia-smi-nvlink-status_h100_excerpt_stas00.txt); the field is MBps.
_LINK_SPEED_MBPS = {"hopper": 26562}


def field_value(v: GpuView, field_id: int, scope: int) -> tuple[int, int]:
    """(valueType, value) for one field, or raise _Fail(code) for that field's nvmlReturn."""
    ull = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
    code = v.spec.nvml_errors.get(f"field:{field_id}")
    if code is not None:
        raise _Fail(code)  # a per-field error inside an OK call (GpuSpec.nvml_errors)
    if field_id == pynvml.NVML_FI_DEV_MEMORY_TEMP:
        return pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, v.mem_temperature_c
    if field_id == pynvml.NVML_FI_DEV_NVLINK_LINK_COUNT:
        if not v.links:
            raise _Fail(NOT_SUPPORTED)
        return pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, len(v.links)
    if field_id in _FIELD_PER_LINK:
        counter, link = _FIELD_PER_LINK[field_id]
        return ull, getattr(_link(v, link), counter)
    if field_id in _FIELD_TOTALS:
        if not v.links:
            raise _Fail(NOT_SUPPORTED)
        return ull, sum(getattr(lv, _FIELD_TOTALS[field_id]) for lv in v.links)
    if field_id in (pynvml.NVML_FI_DEV_NVLINK_GET_STATE, pynvml.NVML_FI_DEV_NVLINK_GET_SPEED):
        # Per link (scopeId = link), as nvmlDeviceGetNvLinkState: a link the GPU does not have is
        # INVALID_ARGUMENT, a GPU without NVLink NOT_SUPPORTED. A down link has no speed (0).
        lv = _link(v, scope)
        if field_id == pynvml.NVML_FI_DEV_NVLINK_GET_STATE:
            return pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, int(lv.active)
        speed = _LINK_SPEED_MBPS.get(v.spec.architecture)
        if speed is None:
            raise _Fail(NOT_SUPPORTED)  # no capture of another generation's link speed
        return pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, speed if lv.active else 0
    if field_id in _FIELD_SCOPED:
        counter = _FIELD_SCOPED[field_id]
        if not v.links:
            raise _Fail(NOT_SUPPORTED)
        if scope == _ALL_LINKS and counter.endswith("_kib"):
            return ull, sum(getattr(lv, counter) for lv in v.links)
        return ull, getattr(_link(v, scope), counter)
    raise _Fail(NOT_SUPPORTED)


class _FieldValue(ctypes.Structure):
    """nvmlFieldValue_t with pynvml's own layout, without its _PrintableStructure attribute hooks
    (those cost the simulator more than the rest of a 100-field call)."""

    _fields_ = pynvml.c_nvmlFieldValue_t._fields_


@_impl("nvmlDeviceGetFieldValues", args=[P, c_int, P])
def _field_values(h: int, count: int, ptr: int) -> None:
    v = _b().device(h)
    if count < 0 or (count and not ptr):
        raise _Fail(INVALID_ARGUMENT)
    arr = cast(ptr, POINTER(_FieldValue))
    stamp = int(time.time() * 1_000_000)
    for i in range(count):
        fv = arr[i]
        fv.timestamp, fv.latencyUsec = stamp, 0
        try:
            vtype, value = field_value(v, fv.fieldId, fv.scopeId)
        except _Fail as f:
            fv.nvmlReturn = f.code
            continue
        fv.nvmlReturn = SUCCESS
        fv.valueType = vtype
        if vtype == pynvml.NVML_VALUE_TYPE_UNSIGNED_INT:
            fv.value.uiVal = value
        else:
            fv.value.ullVal = value


# fabric


def _fabric(v: GpuView, info: Any) -> None:
    info.state = v.fabric_state
    # status is the result of the fabric probe: NOT_SUPPORTED off-fabric, SUCCESS once registered
    # and, as the driver reports it, IN_PROGRESS states still carry SUCCESS.
    info.status = NOT_SUPPORTED if v.fabric_state == pynvml.NVML_GPU_FABRIC_STATE_NOT_SUPPORTED else SUCCESS
    info.cliqueId = 0
    if v.fabric_state == pynvml.NVML_GPU_FABRIC_STATE_COMPLETED and v.nvl_domain:
        # A multi-node NVLink domain (GB200 NVL72): the rack's cluster UUID and clique. An 8-GPU
        # HGX/DGX reports zeros (the 565.57.01 HGX H100 capture: ClusterUUID 00000000-..., CliqueId 0).
        ctypes.memmove(ctypes.addressof(info.clusterUuid), _cluster_uuid(v), 16)
        info.cliqueId = NVL_CLIQUE


NVL_CLIQUE = 32766  # illustrative: the clique (NVLink partition) every tray of the simulated rack is in


def _cluster_uuid(v: GpuView) -> bytes:
    # One rack per simulated fleet's profile: a GPU a fault moved registers in another cluster.
    rack = "other-rack" if "fabric-wrong-cluster" in v.kinds else "rack"
    return hashlib.sha256(("cluster/" + rack).encode()).digest()[:16]


@_impl("nvmlDeviceGetGpuFabricInfo", args=[P, P])
def _fabric_v1(h: int, ptr: int) -> None:
    v = _b().device(h)
    if not v.spec.has_fabric:
        raise _Fail(NOT_SUPPORTED)
    _fabric(v, _struct(ptr, pynvml.c_nvmlGpuFabricInfo_t))


@_impl("nvmlDeviceGetGpuFabricInfoV", args=[P, P])
def _fabric_v(h: int, ptr: int) -> None:
    v = _b().device(h)
    if not v.spec.has_fabric:
        raise _Fail(NOT_SUPPORTED)
    version = _struct(ptr, c_uint).value
    if version == pynvml.nvmlGpuFabricInfo_v2:
        info = _struct(ptr, pynvml.c_nvmlGpuFabricInfo_v2_t)
    elif version == getattr(pynvml, "nvmlGpuFabricInfo_v3", -1):
        info = _struct(ptr, pynvml.c_nvmlGpuFabricInfo_v3_t)
        # healthSummary: HEALTHY when registered, else NOT_SUPPORTED (no verdict yet).
        info.healthSummary = (pynvml.NVML_GPU_FABRIC_HEALTH_SUMMARY_HEALTHY
                              if v.fabric_state == pynvml.NVML_GPU_FABRIC_STATE_COMPLETED
                              else pynvml.NVML_GPU_FABRIC_HEALTH_SUMMARY_NOT_SUPPORTED)
    else:
        raise _Fail(VERSION_MISMATCH)
    _fabric(v, info)
    info.healthMask = 0
    if v.nvl_domain:
        # NVLink5 reports its bandwidth health (the rest of the mask: not reported here)
        bw = (pynvml.NVML_GPU_FABRIC_HEALTH_MASK_DEGRADED_BW_TRUE if "fabric-degraded-bw" in v.kinds
              else pynvml.NVML_GPU_FABRIC_HEALTH_MASK_DEGRADED_BW_FALSE)
        info.healthMask = bw << pynvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_DEGRADED_BW


# MIG


# Max MIG devices per GPU: seven 1g slices on A100, H100, H200 and B200 (NVIDIA MIG user guide).
MIG_MAX_DEVICES = 7
_MIG_PROFILE = re.compile(r"^([1-7])g\.(\d+)gb(\+me)?$")


def mig_memory_mib(profile: str) -> int:
    """Framebuffer of a MIG device: its profile's GB less what the driver keeps (an A100-SXM4-40GB
    3g.20gb instance shows "Total : 19968 MiB" in nvidia-smi -q -x, i.e. 20 GiB - 512 MiB)."""
    m = _MIG_PROFILE.match(profile)
    if m is None:
        raise _Fail(UNKNOWN)
    return int(m.group(2)) * 1024 - 512


def mig_uuid(g: GpuSpec, mig: int) -> str:
    return "MIG-" + g.uuid.removeprefix("GPU-")[:-4] + f"{mig:04x}"


def _mig_capable(v: GpuView) -> bool:
    return ARCHITECTURES.get(v.spec.architecture, 0) >= ARCHITECTURES["ampere"]


def _mig(h: int | None) -> tuple[GpuView, str, int] | None:
    """(parent GPU view, MIG profile, MIG index) for a MIG device handle; None for anything else."""
    at = mig_handle_index(h)
    if at is None:
        return None
    v = _b().device(handle_of(at[0]))
    if not v.spec.mig_mode or at[1] >= len(v.spec.mig_devices):
        raise _Fail(INVALID_ARGUMENT)  # the instance was destroyed: its handle is stale
    return v, v.spec.mig_devices[at[1]], at[1]


def _mig_only(h: int) -> tuple[GpuView, str, int]:
    """_mig for a call only a MIG device answers: a physical GPU's handle gets NOT_SUPPORTED (an
    unknown handle is refused as such first)."""
    mig = _mig(h)
    if mig is None:
        _b().device(h)
        raise _Fail(NOT_SUPPORTED)
    return mig


@_impl("nvmlDeviceGetMigMode", args=[P, P, P])
def _mig_mode(h: int, cur: int, pending: int) -> None:
    v = _b().device(h)
    if not _mig_capable(v):
        raise _Fail(NOT_SUPPORTED)
    _put(cur, c_uint, int(v.spec.mig_mode))
    _put(pending, c_uint, int(v.spec.mig_mode))


@_impl("nvmlDeviceGetMaxMigDeviceCount", args=[P, P])
def _mig_max(h: int, ptr: int) -> None:
    v = _b().device(h)
    _put(ptr, c_uint, MIG_MAX_DEVICES if _mig_capable(v) else 0)


@_impl("nvmlDeviceGetMigDeviceHandleByIndex", args=[P, c_uint, P])
def _mig_by_index(h: int, index: int, ptr: int) -> None:
    v = _b().device(h)
    if not _mig_capable(v):
        raise _Fail(NOT_SUPPORTED)
    if not v.spec.mig_mode or index >= len(v.spec.mig_devices):
        raise _Fail(NOT_FOUND)
    _put(ptr, c_void_p, mig_handle_of(v.spec.index, index))


@_impl("nvmlDeviceIsMigDeviceHandle", args=[P, P])
def _is_mig(h: int, ptr: int) -> None:
    if _mig(h) is None:
        _b().device(h)
        _put(ptr, c_uint, 0)
    else:
        _put(ptr, c_uint, 1)


@_impl("nvmlDeviceGetDeviceHandleFromMigDeviceHandle", args=[P, P])
def _mig_parent(h: int, ptr: int) -> None:
    mig = _mig(h)
    if mig is None:
        raise _Fail(INVALID_ARGUMENT)
    _put(ptr, c_void_p, handle_of(mig[0].spec.index))


@_impl("nvmlDeviceGetGpuInstanceId", args=[P, P])
def _mig_gi(h: int, ptr: int) -> None:
    _put(ptr, c_uint, _mig_only(h)[2] + 1)  # the capture numbers GPU instances from 1


@_impl("nvmlDeviceGetComputeInstanceId", args=[P, P])
def _mig_ci(h: int, ptr: int) -> None:
    _mig_only(h)
    _put(ptr, c_uint, 0)  # one compute instance per GPU instance, id 0 (as captured)


# vGPU licensing


@_impl("nvmlDeviceGetGridLicensableFeatures_v4", args=[P, P])
def _grid_license(h: int, ptr: int) -> None:
    # nvml.h nvmlGridLicensableFeatures_v4_t: {isGridLicenseSupported, licensableFeaturesCount,
    # gridLicensableFeatures[3] {featureCode, featureState, licenseInfo, productName, ...}}
    g = _b().device(h).spec
    if g.vgpu_license_state is None:
        raise _Fail(NOT_SUPPORTED)
    out = _struct(ptr, pynvml.c_nvmlGridLicensableFeatures_v4_t)
    out.isGridLicenseSupported = 1
    out.licensableFeaturesCount = 1
    f = out.gridLicensableFeatures[0]
    f.featureCode = pynvml.NVML_GRID_LICENSE_FEATURE_CODE_VGPU
    f.featureState = g.vgpu_license_state
    f.featureEnabled = 1
    f.productName = b"NVIDIA Virtual Compute Server"


# processes


@_impl("nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetComputeRunningProcesses_v2",
       "nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses_v3",
       args=[P, P, P])
def _processes(h: int, count_ptr: int, infos: int) -> None:
    b = _b()
    b.device(h)
    index = handle_index(h)
    # fault=gpu-busy: one compute process, answered the way NVML does (the caller asks with
    # count 0 first, gets INSUFFICIENT_SIZE and the count, then asks again with room for it)
    pids = [BUSY_PID for f in b.node.state.faults if f.kind == "gpu-busy" and f.gpu == index][:1]
    room = cast(count_ptr, POINTER(c_uint))[0] if count_ptr else 0
    _put(count_ptr, c_uint, len(pids))
    if not pids:
        return
    if not infos or room < len(pids):
        raise _Fail(INSUFFICIENT_SIZE)
    info = _struct(infos, pynvml.c_nvmlProcessInfo_v3_t)
    info.pid, info.usedGpuMemory = BUSY_PID, BUSY_MIB * 1024 * 1024


BUSY_PID, BUSY_MIB = 4242, 1024


# events


@_impl("nvmlEventSetCreate", args=[P])
def _event_set_create(ptr: int) -> None:
    b = _b()
    b.require_init()
    with b.lock:
        sid = _EVENTSET_BASE + 16 * b.next_set
        b.next_set += 1
        b.event_sets[sid] = _EventSet(created_at=time.time(), masks={}, delivered=set())
    _put(ptr, c_void_p, sid)


def _event_set(sid: int | None) -> _EventSet:
    b = _b()
    b.require_init()
    es = b.event_sets.get(sid or 0)
    if es is None:
        raise _Fail(INVALID_ARGUMENT)
    return es


@_impl("nvmlEventSetFree", args=[P])
def _event_set_free(sid: int) -> None:
    b = _b()
    _event_set(sid)
    with b.lock:
        b.event_sets.pop(sid, None)


@_impl("nvmlDeviceGetSupportedEventTypes", args=[P, P])
def _supported_events(h: int, ptr: int) -> None:
    _b().device(h)
    _put(ptr, c_ulonglong, SUPPORTED_EVENTS)


@_impl("nvmlDeviceRegisterEvents", args=[P, c_ulonglong, P])
def _register_events(h: int, mask: int, sid: int) -> None:
    v = _b().device(h)
    es = _event_set(sid)
    if mask & ~SUPPORTED_EVENTS:
        raise _Fail(NOT_SUPPORTED)
    # fault=nvml-events-unsupported: the documented answer of a platform without event support
    if any(f.kind == "nvml-events-unsupported" and f.gpu == v.spec.index for f in _b().node.state.faults):
        raise _Fail(NOT_SUPPORTED)
    es.masks[v.spec.index] = es.masks.get(v.spec.index, 0) | mask


def _pending_xid(state: NodeState, es: _EventSet) -> tuple[int, int, int] | None:
    """(seq, gpu, code) of the oldest undelivered XID for a GPU registered in `es`."""
    for f in sorted(state.faults, key=lambda f: f.seq):
        if f.seq in es.delivered or f.gpu is None or f.injected_at < es.created_at:
            continue
        code = f.code if f.kind == "xid" else 79 if f.kind == "fallen-off-bus" else None
        if code is None or not es.masks.get(f.gpu, 0) & pynvml.nvmlEventTypeXidCriticalError:
            continue
        return f.seq, f.gpu, code
    return None


_EVENT_POLL_S = 0.02


@_impl("nvmlEventSetWait_v2", "nvmlEventSetWait", args=[P, P, c_uint])
def _event_wait(sid: int, data_ptr: int, timeout_ms: int) -> None:
    b = _b()
    es = _event_set(sid)
    deadline = time.monotonic() + timeout_ms / 1000.0
    while True:
        with b.lock:
            hit = _pending_xid(b.node.state, es)
            if hit is not None:
                es.delivered.add(hit[0])
        if hit is not None:
            seq, gpu, code = hit
            d = _struct(data_ptr, pynvml.c_nvmlEventData_t)
            d.device = cast(c_void_p(handle_of(gpu)), pynvml.c_nvmlDevice_t)
            d.eventType = pynvml.nvmlEventTypeXidCriticalError
            d.eventData = code
            d.gpuInstanceId = d.computeInstanceId = 0xFFFFFFFF  # not a MIG instance
            return
        left = deadline - time.monotonic()
        if left <= 0:
            raise _Fail(TIMEOUT)
        time.sleep(min(_EVENT_POLL_S, left))


# --- wiring into pynvml -------------------------------------------------------------------------


def _error_string(code: int) -> int | None:
    b = _backend
    if b is None:
        return None
    buf = b.error_strings.get(code)
    if buf is None:
        buf = ctypes.create_string_buffer(_ERROR_TEXT.get(code, "Unknown Error").encode())
        b.error_strings[code] = buf
    return ctypes.addressof(buf)


# The C function being answered on this thread: `device()` looks up GpuSpec.nvml_errors by it.
_calling = threading.local()


def _wrap(name: str, fn: Callable[..., None]) -> Callable[..., int]:
    def call(*args: Any) -> int:
        _calling.name = name
        try:
            fn(*args)
            return SUCCESS
        except _Fail as f:
            return f.code
        except Exception:  # an exception must not cross the C boundary: report it, answer UNKNOWN
            traceback.print_exc()
            return UNKNOWN
    call.__name__ = name
    return call


class _ByArity:
    """Calls one of several C callbacks of the same function, chosen by the number of arguments."""

    def __init__(self, by_count: dict[int, Any]) -> None:
        self._by_count = by_count

    def __call__(self, *args: Any) -> int:
        fn = self._by_count.get(len(args))
        if fn is None:
            raise TypeError(f"simulated NVML function takes {sorted(self._by_count)} arguments, got {len(args)}")
        return int(fn(*args))


class SimulatedNvmlLibrary:
    """What `pynvml.nvmlLib` points to while installed: one CFUNCTYPE attribute per C function
    (each timed into sim/nvml_cpu.py's account when the bench's environment names one)."""

    def __init__(self) -> None:
        for name, (argtypes, fn) in _IMPLS.items():
            proto = CFUNCTYPE(c_int, *argtypes)
            setattr(self, name, proto(timed(_wrap(name, fn))))
        for name, (argtypes, fn) in _ARITY_VARIANTS.items():
            full = getattr(self, name)
            short = CFUNCTYPE(c_int, *argtypes)(timed(_wrap(name, fn)))
            setattr(self, name, _ByArity({len(argtypes): short, len(_IMPLS[name][0]): full}))
        # restype void*: pynvml sets restype = c_char_p on the function object before calling.
        self.nvmlErrorString = CFUNCTYPE(c_void_p, c_int)(_error_string)

    def __repr__(self) -> str:
        return "<simulated libnvidia-ml.so.1 (podhealth.sim.nvml_lib)>"


def _reset_pynvml(lib: object | None) -> None:
    with pynvml.libLoadLock:
        pynvml.nvmlLib = lib
        pynvml._nvmlGetFunctionPointer_cache.clear()
        pynvml._nvmlLib_refcount = 0


def install(node: "SimNode") -> None:
    """Make pynvml talk to `node`. The library starts uninitialised: call pynvml.nvmlInit()."""
    global _backend
    with _install_lock:
        _backend = _Backend(node)
        _reset_pynvml(SimulatedNvmlLibrary())


def uninstall() -> None:
    """Forget the simulated library; pynvml is back to 'not loaded' (next nvmlInit loads the real one)."""
    global _backend
    with _install_lock:
        _reset_pynvml(None)
        _backend = None


def installed() -> "SimNode | None":
    b = _backend
    return b.node if b is not None else None


__all__ = ["install", "uninstall", "installed", "gpu_view", "GpuView", "NvLinkView", "handle_of",
           "SimulatedNvmlLibrary"]


