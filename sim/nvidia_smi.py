"""Seed a simulated node from a real `nvidia-smi -q` capture.

`parse(text) -> Capture` is pure: it reads the indented `Key : Value` tree nvidia-smi prints and
keeps what the simulator models (identity, PCI, memory, power limit, current and max clocks, ECC,
retired pages, row remapping, clocks-event (throttle) reasons, thermals, fabric state). Truncated
input yields what is there; a capture without any `GPU <bus id>` section raises ValueError. `to_state(capture, name)`
turns it into a NodeState, filling what a capture does not show (NVLink count, HCAs, mounts)
from the matching hardware profile.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Iterator, Mapping

from podhealth.checks import profiles
from podhealth.sim.state import (ARCHITECTURES, GENERIC_SKU, SKUS, GpuSpec, NodeState, default_state,
                                 gpu_serial, gpu_uuid)

_GPU_HEADER = re.compile(r"^GPU ([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f])\s*$", re.M)
_LINE = re.compile(r"^(\s*)([^:]+?)\s*(?::\s*(.*?))?\s*$")

# nvidia-smi's names for clocks-event (throttle) reasons -> nvmlClocksEventReason bits.
REASON_BITS: Mapping[str, int] = {
    "Idle": 0x1,
    "Applications Clocks Setting": 0x2,
    "SW Power Cap": 0x4,
    "HW Slowdown": 0x8,
    "Sync Boost": 0x10,
    "SW Thermal Slowdown": 0x20,
    "HW Thermal Slowdown": 0x40,
    "HW Power Brake Slowdown": 0x80,
    "Display Clock Setting": 0x100,
}


@dataclass
class _Node:
    key: str
    value: str | None
    children: list["_Node"] = field(default_factory=list)

    def get(self, *path: str) -> "_Node | None":
        node: _Node | None = self
        for key in path:
            if node is None:
                return None
            node = next((c for c in node.children if c.key == key), None)
        return node

    def value_of(self, *path: str) -> str | None:
        n = self.get(*path)
        return n.value if n is not None else None


@dataclass(frozen=True)
class CapturedGpu:
    """One GPU section; None = absent from the capture or N/A."""

    pci_bus_id: str
    name: str | None = None
    architecture: str | None = None
    uuid: str | None = None
    serial: str | None = None
    vbios: str | None = None
    persistence_mode: bool | None = None
    pci_device_id: int | None = None
    pci_subsystem_id: int | None = None
    pcie_gen_max: int | None = None
    pcie_width_max: int | None = None
    pcie_replay: int | None = None
    memory_total_mib: int | None = None
    power_limit_w: float | None = None
    power_draw_w: float | None = None
    max_clocks: tuple[int | None, int | None, int | None, int | None] = (None, None, None, None)
    clocks: tuple[int | None, int | None, int | None, int | None] = (None, None, None, None)  # current
    ecc_enabled: bool | None = None
    ecc_sbe: tuple[int | None, int | None] = (None, None)  # volatile, aggregate
    ecc_dbe: tuple[int | None, int | None] = (None, None)
    retired_sbe: int | None = None
    retired_dbe: int | None = None
    retired_pending: bool | None = None
    remap: tuple[int, int, bool, bool] | None = None  # correctable, uncorrectable, pending, failure
    clocks_event_reasons: int | None = None
    temperature_c: int | None = None
    mem_temperature_c: int | None = None
    temp_shutdown_c: int | None = None
    temp_slowdown_c: int | None = None
    temp_max_operating_c: int | None = None
    mem_temp_max_c: int | None = None
    # R530+ drivers print thresholds relative to T.Limit (the max operating temperature) instead:
    # "GPU T.Limit Temp" is the margin below it, "GPU Shutdown T.Limit Temp : -8 C" means 8 C past it.
    t_limit_margin_c: int | None = None
    shutdown_t_limit_c: int | None = None
    slowdown_t_limit_c: int | None = None
    max_operating_t_limit_c: int | None = None
    remap_histogram: tuple[int, int, int, int, int] | None = None  # banks: max, high, partial, low, none
    fabric_state: str | None = None  # None = no Fabric section; "N/A" = not on a fabric

    def absolute_thresholds(self) -> tuple[int | None, int | None, int | None]:
        """(shutdown, slowdown, max operating) in C: as printed by older drivers, else from the
        T.Limit margin and the current temperature (T.Limit = current + margin)."""
        limit = (self.temperature_c + self.t_limit_margin_c
                 if self.temperature_c is not None and self.t_limit_margin_c is not None else None)

        def past(offset: int | None) -> int | None:
            return None if limit is None or offset is None else limit - offset

        return (self.temp_shutdown_c if self.temp_shutdown_c is not None else past(self.shutdown_t_limit_c),
                self.temp_slowdown_c if self.temp_slowdown_c is not None else past(self.slowdown_t_limit_c),
                self.temp_max_operating_c if self.temp_max_operating_c is not None
                else past(self.max_operating_t_limit_c))


@dataclass(frozen=True)
class Capture:
    driver_version: str | None
    cuda_version: int | None  # NVML form, 12040
    gpus: tuple[CapturedGpu, ...]
    warnings: tuple[str, ...] = ()
    attached: int | None = None  # "Attached GPUs" of the header: the node's count, even when cut short

    @property
    def gpu_count(self) -> int:
        """The GPUs the capture holds: a capture cut short is judged on what it holds (the node
        seeded from it has these GPUs; the header's "Attached GPUs" is in the warnings)."""
        return len(self.gpus)

    @property
    def model(self) -> str:
        names = Counter(g.name for g in self.gpus if g.name)
        return names.most_common(1)[0][0] if names else ""


@dataclass(frozen=True)
class Guess:
    """The shipped profile a capture's node is, and why (one line for the operator)."""

    profile: str
    why: str
    exact: bool  # the profile states this model and this count (or states no count)
    facts: str = "generic"  # the profile whose GPU facts fill what the capture leaves out (same model)


def _tree(lines: list[str]) -> _Node:
    root = _Node("", None)
    stack: list[tuple[int, _Node]] = [(-1, root)]
    for raw in lines:
        if not raw.strip() or raw.strip() == "[...]":
            continue
        m = _LINE.match(raw.rstrip())
        if not m:
            continue
        indent = len(m.group(1).expandtabs(4))
        node = _Node(m.group(2).strip(), m.group(3))
        while stack[-1][0] >= indent:
            stack.pop()
        stack[-1][1].children.append(node)
        stack.append((indent, node))
    return root


def _sections(text: str) -> Iterator[tuple[str, list[str]]]:
    """Split into ("", header lines) and ("<bus id>", lines) per GPU section."""
    current, lines = "", []  # type: str, list[str]
    for line in text.splitlines():
        m = _GPU_HEADER.match(line)
        if m:
            yield current, lines
            current, lines = m.group(1), []
        else:
            lines.append(line)
    yield current, lines


def _na(v: str | None) -> str | None:
    if v is None:
        return None
    v = v.strip()
    return None if v in ("", "N/A", "[N/A]", "Unknown Error", "[Unknown Error]") else v


def _int(v: str | None, base: int = 10) -> int | None:
    v = _na(v)
    if v is None:
        return None
    m = re.match(r"^(0x[0-9A-Fa-f]+|-?\d+)", v)
    if not m:
        return None
    tok = m.group(1)
    return int(tok, 16) if tok.lower().startswith("0x") else int(tok, base)


def _float(v: str | None) -> float | None:
    v = _na(v)
    if v is None:
        return None
    m = re.match(r"^(-?\d+(?:\.\d+)?)", v)
    return float(m.group(1)) if m else None


def _bool(v: str | None, yes: tuple[str, ...] = ("Enabled", "Yes", "Active")) -> bool | None:
    v = _na(v)
    return None if v is None else v in yes


def _cuda(v: str | None) -> int | None:
    v = _na(v)
    m = re.match(r"^(\d+)\.(\d+)", v or "")
    return int(m.group(1)) * 1000 + int(m.group(2)) * 10 if m else None


def _ecc_totals(section: _Node | None) -> tuple[int | None, int | None]:
    """(corrected, uncorrected) for a Volatile/Aggregate section in either nvidia-smi layout."""
    if section is None:
        return None, None
    single, double = section.get("Single Bit"), section.get("Double Bit")
    if single is not None or double is not None:  # pre-R510 layout: Single Bit / Double Bit -> Total
        return (_int(single.value_of("Total")) if single else None,
                _int(double.value_of("Total")) if double else None)
    sbe = dbe = None
    for c in section.children:
        n = _int(c.value)
        if n is None:
            continue
        if "Uncorrectable" in c.key:
            dbe = (dbe or 0) + n
        elif "Correctable" in c.key:
            sbe = (sbe or 0) + n
    return sbe, dbe


def _reasons(section: _Node | None, warnings: list[str], bus: str) -> int | None:
    if section is None:
        return None
    bits = 0
    seen = False
    for node in _walk(section):
        if node.value is None:
            continue
        bit = REASON_BITS.get(node.key)
        if bit is None:
            warnings.append(f"GPU {bus}: unknown clocks-event reason {node.key!r} ignored")
            continue
        seen = True
        if _bool(node.value, ("Active",)):
            bits |= bit
    return bits if seen else None


def _clocks(section: _Node | None) -> tuple[int | None, int | None, int | None, int | None]:
    """(graphics, SM, memory, video) MHz of a `Clocks` / `Max Clocks` section."""
    if section is None:
        return (None, None, None, None)
    return (_int(section.value_of("Graphics")), _int(section.value_of("SM")),
            _int(section.value_of("Memory")), _int(section.value_of("Video")))


def _walk(node: _Node) -> Iterator[_Node]:
    # Depth first with a stack, not recursion: a mangled capture can nest thousands deep.
    stack = list(reversed(node.children))
    while stack:
        c = stack.pop()
        yield c
        stack.extend(reversed(c.children))


def _histogram(remap: _Node | None) -> tuple[int, int, int, int, int] | None:
    """"Bank Remap Availability Histogram" (Max/High/Partial/Low/None bank(s)); None unless whole."""
    h = remap.get("Bank Remap Availability Histogram") if remap is not None else None
    if h is None:
        return None
    vals = [_int(h.value_of(k)) for k in ("Max", "High", "Partial", "Low", "None")]
    if any(v is None for v in vals):
        return None
    return (vals[0], vals[1], vals[2], vals[3], vals[4])  # type: ignore[return-value]


def _parse_gpu(bus: str, root: _Node, warnings: list[str]) -> CapturedGpu:
    pci = root.get("PCI")
    link = pci.get("GPU Link Info") if pci else None
    power = root.get("GPU Power Readings") or root.get("Power Readings")
    power_limit = None
    if power is not None:
        power_limit = _float(power.value_of("Current Power Limit") or power.value_of("Enforced Power Limit")
                             or power.value_of("Power Limit"))
    ecc = root.get("ECC Errors")
    vol = _ecc_totals(ecc.get("Volatile") if ecc else None)
    agg = _ecc_totals(ecc.get("Aggregate") if ecc else None)
    retired = root.get("Retired Pages")
    remap_node = root.get("Remapped Rows")
    remap = None
    if remap_node is not None and remap_node.children:
        corr, unc = _int(remap_node.value_of("Correctable Error")), _int(remap_node.value_of("Uncorrectable Error"))
        if corr is not None and unc is not None:
            remap = (corr, unc, bool(_bool(remap_node.value_of("Pending"))),
                     bool(_bool(remap_node.value_of("Remapping Failure Occurred"))))
    temp = root.get("Temperature")
    max_clocks, clocks = _clocks(root.get("Max Clocks")), _clocks(root.get("Clocks"))
    return CapturedGpu(
        pci_bus_id=bus.upper().replace("0X", "0x"),
        name=_na(root.value_of("Product Name")),
        architecture=_na(root.value_of("Product Architecture")),
        uuid=_na(root.value_of("GPU UUID")),
        serial=_na(root.value_of("Serial Number")),
        vbios=_na(root.value_of("VBIOS Version")),
        persistence_mode=_bool(root.value_of("Persistence Mode")),
        pci_device_id=_int(pci.value_of("Device Id")) if pci else None,
        pci_subsystem_id=_int(pci.value_of("Sub System Id")) if pci else None,
        pcie_gen_max=_int(link.value_of("PCIe Generation", "Max")) if link else None,
        pcie_width_max=_int(link.value_of("Link Width", "Max")) if link else None,
        pcie_replay=_int(pci.value_of("Replays Since Reset")) if pci else None,
        memory_total_mib=_int(root.value_of("FB Memory Usage", "Total")),
        power_limit_w=power_limit,
        power_draw_w=_float(power.value_of("Power Draw")) if power else None,
        max_clocks=max_clocks,
        clocks=clocks,
        ecc_enabled=_bool(root.value_of("ECC Mode", "Current")),
        ecc_sbe=(vol[0], agg[0]),
        ecc_dbe=(vol[1], agg[1]),
        retired_sbe=_int(retired.value_of("Single Bit ECC")) if retired else None,
        retired_dbe=_int(retired.value_of("Double Bit ECC")) if retired else None,
        retired_pending=(_bool(retired.value_of("Pending Page Blacklist") or retired.value_of("Pending Page Retirement"))
                         if retired else None),
        remap=remap,
        clocks_event_reasons=_reasons(root.get("Clocks Event Reasons") or root.get("Clocks Throttle Reasons"),
                                      warnings, bus),
        temperature_c=_int(temp.value_of("GPU Current Temp")) if temp else None,
        mem_temperature_c=_int(temp.value_of("Memory Current Temp")) if temp else None,
        # Absolute thresholds (older drivers); newer ones print T.Limit offsets (absolute_thresholds).
        temp_shutdown_c=_int(temp.value_of("GPU Shutdown Temp")) if temp else None,
        temp_slowdown_c=_int(temp.value_of("GPU Slowdown Temp")) if temp else None,
        temp_max_operating_c=_int(temp.value_of("GPU Max Operating Temp")) if temp else None,
        mem_temp_max_c=_int(temp.value_of("Memory Max Operating Temp")) if temp else None,
        t_limit_margin_c=_int(temp.value_of("GPU T.Limit Temp")) if temp else None,
        shutdown_t_limit_c=_int(temp.value_of("GPU Shutdown T.Limit Temp")) if temp else None,
        slowdown_t_limit_c=_int(temp.value_of("GPU Slowdown T.Limit Temp")) if temp else None,
        max_operating_t_limit_c=_int(temp.value_of("GPU Max Operating T.Limit Temp")) if temp else None,
        remap_histogram=_histogram(remap_node),
        # Kept raw: "N/A" (no NVSwitch fabric) differs from an absent section (older driver).
        fabric_state=root.value_of("Fabric", "State"),
    )


def parse(text: str) -> Capture:
    """Parse `nvidia-smi -q` output (or `-q -x`, its XML form: sim/nvidia_smi_xml.py). ValueError
    if there is no GPU section at all."""
    if text.lstrip().startswith("<"):
        from podhealth.sim import nvidia_smi_xml  # it builds this module's Capture

        return nvidia_smi_xml.parse(text)
    if "NVIDIA-SMI" in text and not _GPU_HEADER.search(text):
        from podhealth.sim import nvidia_smi_table  # the summary table `nvidia-smi` prints

        return nvidia_smi_table.parse(text)
    warnings: list[str] = []
    header: _Node | None = None
    gpus: list[CapturedGpu] = []
    for bus, lines in _sections(text):
        tree = _tree(lines)
        if not bus:
            header = tree
            continue
        gpus.append(_parse_gpu(bus, tree, warnings))
    if not gpus:
        raise ValueError("not a node's nvidia-smi capture (-q, -q -x or the summary table): no 'GPU <bus id>' section found")
    attached = _int(header.value_of("Attached GPUs")) if header else None
    if attached is not None and attached != len(gpus):
        warnings.append(f"capture lists {attached} attached GPUs but holds {len(gpus)} GPU sections")
    return Capture(
        driver_version=_na(header.value_of("Driver Version")) if header else None,
        cuda_version=_cuda(header.value_of("CUDA Version")) if header else None,
        gpus=tuple(gpus),
        warnings=tuple(warnings),
        attached=attached,
    )


def guess(capture: Capture) -> Guess:
    """The shipped profile whose GPU model AND count the node has (in the one list's order: the DGX
    before the OEM board that reads the same in nvidia-smi); a profile that states no count (PCIe
    cards) matches on the model. A model whose profiles all state another count is never guessed
    from the model alone: `generic`, saying so, and asking for `podhealth profile capture`."""
    model, count = capture.model, capture.gpu_count
    same_model = [p for p in profiles.names() if p != "generic" and model and profiles.load(p).gpu_model == model]
    fits = [p for p in same_model if profiles.load(p).gpu_count in (0, count)]
    if fits:
        also = f" (also reads as: {', '.join(fits[1:])}; pass --profile to pick one)" if fits[1:] else ""
        return Guess(fits[0], f"{count}x {model}: profile {fits[0]}{also}", True, fits[0])
    capture_hint = ("run `podhealth profile capture` on this node to record its build"
                    + (f" (extends: {same_model[0]})" if same_model else ""))
    if same_model:
        stated = ", ".join(f"{p} ({profiles.load(p).gpu_count} GPUs)" for p in same_model)
        return Guess("generic", f"{count}x {model}: not the GPU count of {stated}; judged as generic; "
                                f"{capture_hint}", False, same_model[0])
    return Guess("generic", f"{count}x {model or 'unnamed GPU'}: no shipped profile for this GPU; judged as "
                            f"generic; {capture_hint}", False)


def guess_profile(capture: Capture) -> str:
    return guess(capture).profile


def to_state(capture: Capture, name: str, profile: str | None = None,
             storage: str | None = None) -> NodeState:
    """A NodeState whose GPUs are the captured ones (missing facts from the profile/SKU);
    `storage` as for state.default_state."""
    guessed = guess(capture)
    profile = profile or guessed.profile
    base = default_state(name, profile, storage=storage)
    # What a capture leaves out about its GPUs (memory, NVLinks, ids) is the GPU model's, whatever
    # the node's build: a 2x H100 SXM node judged as `generic` still has H100 SXM GPUs.
    facts = profile if profile != "generic" else guessed.facts
    prof = profiles.load(facts)
    sku = SKUS.get(facts, GENERIC_SKU)
    tmpls = base.gpus if facts == profile else default_state(name, facts).gpus
    gpus = []
    for i, c in enumerate(capture.gpus):
        tmpl = tmpls[i] if i < len(tmpls) else None
        arch = (c.architecture or "").lower()
        if arch not in ARCHITECTURES:
            arch = tmpl.architecture if tmpl else sku.architecture
        retires = ARCHITECTURES[arch] < ARCHITECTURES["ampere"]
        shutdown, slowdown, max_op = c.absolute_thresholds()
        idle = tmpl or GpuSpec(i, "", "", "", "", 0, 0, 0, "", 0, 0, 0, 0, 0, 0, 0, 0, arch)
        g = GpuSpec(
            index=i,
            name=c.name or prof.gpu_model or "NVIDIA GPU",
            uuid=c.uuid or gpu_uuid(name, i),
            serial=c.serial or gpu_serial(name, i),
            pci_bus_id=c.pci_bus_id,
            pci_device_id=sku.pci_device_id if c.pci_device_id is None else c.pci_device_id,
            pci_subsystem_id=sku.pci_subsystem_id if c.pci_subsystem_id is None else c.pci_subsystem_id,
            memory_total_mib=prof.gpu_memory_mib if c.memory_total_mib is None else c.memory_total_mib,
            vbios=c.vbios or sku.vbios,
            power_limit_w=int(round(c.power_limit_w)) if c.power_limit_w else prof.power_limit_w,
            max_graphics_clock_mhz=c.max_clocks[0] or sku.max_graphics_clock_mhz,
            max_sm_clock_mhz=c.max_clocks[1] or sku.max_sm_clock_mhz,
            max_mem_clock_mhz=c.max_clocks[2] or sku.max_mem_clock_mhz,
            max_video_clock_mhz=c.max_clocks[3] or sku.max_video_clock_mhz,
            pcie_gen_max=c.pcie_gen_max or prof.pcie_gen,
            pcie_width_max=c.pcie_width_max or prof.pcie_width,
            nvlink_count=prof.nvlink_links,
            architecture=arch,
            persistence_mode=True if c.persistence_mode is None else c.persistence_mode,
            ecc_enabled=True if c.ecc_enabled is None else c.ecc_enabled,
            ecc_sbe_volatile=c.ecc_sbe[0] or 0,
            ecc_dbe_volatile=c.ecc_dbe[0] or 0,
            ecc_sbe_aggregate=c.ecc_sbe[1] or 0,
            ecc_dbe_aggregate=c.ecc_dbe[1] or 0,
            remap_correctable=c.remap[0] if c.remap else (None if retires else 0),
            remap_uncorrectable=c.remap[1] if c.remap else (None if retires else 0),
            remap_pending=c.remap[2] if c.remap else False,
            remap_failure=c.remap[3] if c.remap else False,
            retired_pages_sbe=c.retired_sbe if c.retired_sbe is not None else (0 if retires else None),
            retired_pages_dbe=c.retired_dbe if c.retired_dbe is not None else (0 if retires else None),
            retired_pages_pending=bool(c.retired_pending),
            clocks_event_reasons=0x1 if c.clocks_event_reasons is None else c.clocks_event_reasons,
            clock_graphics_mhz=c.clocks[0], clock_sm_mhz=c.clocks[1], clock_mem_mhz=c.clocks[2],
            clock_video_mhz=c.clocks[3],
            pcie_replay=c.pcie_replay or 0,
            temperature_c=idle.temperature_c if c.temperature_c is None else c.temperature_c,
            mem_temperature_c=idle.mem_temperature_c if c.mem_temperature_c is None else c.mem_temperature_c,
            power_w=idle.power_w if c.power_draw_w is None else c.power_draw_w,
            temp_shutdown_c=shutdown if shutdown is not None else 92,
            temp_slowdown_c=slowdown if slowdown is not None else 89,
            temp_max_operating_c=max_op if max_op is not None else 87,
            mem_temp_max_c=c.mem_temp_max_c or 95,
            remap_histogram=c.remap_histogram,
            has_fabric=(prof.has_nvswitch_fabric if c.fabric_state is None
                        else _na(c.fabric_state) is not None),
        )
        gpus.append(g)
    return replace(
        base,
        driver_version=capture.driver_version or base.driver_version,
        cuda_version=capture.cuda_version or base.cuda_version,
        nvml_version=f"{(capture.cuda_version or base.cuda_version) // 1000}."
                     f"{capture.driver_version or base.driver_version}",
        gpus=tuple(gpus),
    )
