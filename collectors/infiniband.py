"""InfiniBand ports from <sysfs_root>/class/infiniband: state, rate, and every counter.

The reader only gathers file text (one read per file per cycle); ib_parse turns it into typed
ports. Values are exported raw: what a symbol error rate means is for checks/ib.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import ClassVar, Iterable, Mapping

from podhealth.collectors.base import Collection, specs
from podhealth.collectors.ib_parse import DeviceFiles, IbDevice, PortFiles, parse_device
from podhealth.config import Config
from podhealth.vocab import MetricSpec, Sample

_DEVICE_ATTRS = ("board_id", "fw_ver", "hca_type")
_PORT_ATTRS = ("state", "phys_state", "rate", "link_layer")
_MAX_FILE = 4096  # sysfs attributes are one page at most

# These four have their own series; every other counters/ file goes to infiniband_port_stat.
# port_xmit_data/port_rcv_data count 4-byte words: the IB spec's PortXmitData is in units of 32
# bits, and mlx5 reports the per-lane value, so node_exporter/procfs multiply by 4 for every device
# and so do we (node_exporter is our oracle in tests/integration/test_node_exporter_parity.py).
_DATA_COUNTERS = {"port_rcv_data": "infiniband_port_data_received_bytes",
                  "port_xmit_data": "infiniband_port_data_transmitted_bytes"}
_PACKET_COUNTERS = {"port_rcv_packets": "infiniband_port_packets_received",
                    "port_xmit_packets": "infiniband_port_packets_transmitted"}
DATA_WORD_BYTES = 4

METRICS: Mapping[str, MetricSpec] = specs(
    MetricSpec("infiniband_port_state", "gauge", "Numeric IB port state (4 = ACTIVE); label state is its name."),
    MetricSpec("infiniband_port_physical_state", "gauge", "Numeric IB physical port state (5 = LinkUp); label state is its name."),
    MetricSpec("infiniband_port_rate_bytes_per_second", "gauge", "Port rate from sysfs `rate`.", "bytes"),
    MetricSpec("infiniband_port_link_layer_info", "info", "Port link layer (InfiniBand or Ethernet)."),
    MetricSpec("infiniband_port_data_received_bytes", "counter", "port_rcv_data x 4 (the counter counts 4-byte words).", "bytes"),
    MetricSpec("infiniband_port_data_transmitted_bytes", "counter", "port_xmit_data x 4 (the counter counts 4-byte words).", "bytes"),
    MetricSpec("infiniband_port_packets_received", "counter", "port_rcv_packets."),
    MetricSpec("infiniband_port_packets_transmitted", "counter", "port_xmit_packets."),
    MetricSpec("infiniband_port_stat", "counter", "Any other file in ports/N/counters/, by file name in label counter."),
    MetricSpec("infiniband_port_hw_stat", "counter", "A file in ports/N/hw_counters/, by file name in label counter."),
    MetricSpec("infiniband_info", "info", "HCA board id, firmware version and type."),
)


def read_text(path: str) -> str:
    """One sysfs attribute. os.open/os.read: a few µs cheaper per file than open(), and a cycle
    reads ~500 of them on a DGX."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return os.read(fd, _MAX_FILE).decode("utf-8", "replace")
    finally:
        os.close(fd)


def _listdir(path: str) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except FileNotFoundError:
        return []


def _read_dir_files(path: str, where: str, problems: list[str]) -> tuple[tuple[str, str], ...]:
    out: list[tuple[str, str]] = []
    for name in _listdir(path):
        if name.startswith("."):
            continue  # an editor's or a writer's temporary, never a kernel counter
        try:
            out.append((name, read_text(os.path.join(path, name))))
        except OSError as e:
            # e.g. EINVAL from a counter the firmware refuses to read: skip it, keep the port
            if e.errno != errno.EISDIR:
                problems.append(f"{where}/{name}: {e.strerror or e}")
    return tuple(out)


def _read_attrs(base: str, names: Iterable[str], where: str, problems: list[str]) -> dict[str, str]:
    attrs: dict[str, str] = {}
    for name in names:
        try:
            attrs[name] = read_text(os.path.join(base, name))
        except FileNotFoundError:
            continue  # optional attribute (hfi1 has no hca_type): absent, not a problem
        except OSError as e:
            problems.append(f"{where}/{name}: {e.strerror or e}")
    return attrs


def read_device(class_dir: str, name: str, problems: list[str]) -> DeviceFiles:
    base = os.path.join(class_dir, name)
    attrs = _read_attrs(base, _DEVICE_ATTRS, name, problems)
    ports: list[PortFiles] = []
    ports_dir = os.path.join(base, "ports")
    port_names = _listdir(ports_dir)
    if not port_names:
        problems.append(f"{name}: no ports")
    for pn in port_names:
        pdir = os.path.join(ports_dir, pn)
        where = f"{name}/ports/{pn}"
        ports.append(PortFiles(
            port=pn,
            attrs=_read_attrs(pdir, _PORT_ATTRS, where, problems),
            counters=_read_dir_files(os.path.join(pdir, "counters"), f"{where}/counters", problems),
            hw_counters=_read_dir_files(os.path.join(pdir, "hw_counters"), f"{where}/hw_counters", problems),
        ))
    return DeviceFiles(name, attrs, tuple(ports))


def read_devices(sysfs_root: Path) -> tuple[tuple[IbDevice, ...], tuple[str, ...]]:
    """Every HCA under <sysfs_root>/class/infiniband, and the problems met (never raises for one)."""
    class_dir = os.path.join(sysfs_root, "class", "infiniband")
    problems: list[str] = []
    try:
        names = sorted(os.listdir(class_dir))
    except OSError as e:
        return (), (f"{class_dir}: {e.strerror or e} (no InfiniBand devices)",)
    devices: list[IbDevice] = []
    for name in names:
        parsed = parse_device(read_device(class_dir, name, problems))
        problems.extend(parsed.problems)
        devices.append(parsed.device)
    return tuple(devices), tuple(problems)


def samples_of(devices: Iterable[IbDevice]) -> list[Sample]:
    out: list[Sample] = []
    add = out.append
    for d in devices:
        add(Sample.of("infiniband_info", 1, device=d.name, board_id=d.board_id or "",
                      firmware_version=d.fw_ver or "", hca_type=d.hca_type or ""))
        for p in d.ports:
            lab = {"device": d.name, "port": p.port}
            if p.state_id is not None:
                add(Sample.of("infiniband_port_state", p.state_id, state=p.state, **lab))
            if p.phys_state_id is not None:
                add(Sample.of("infiniband_port_physical_state", p.phys_state_id, state=p.phys_state, **lab))
            if p.rate_bytes_per_second is not None:
                add(Sample.of("infiniband_port_rate_bytes_per_second", p.rate_bytes_per_second, **lab))
            if p.link_layer is not None:
                add(Sample.of("infiniband_port_link_layer_info", 1, link_layer=p.link_layer, **lab))
            for name, v in p.counters:
                if name in _DATA_COUNTERS:
                    add(Sample.of(_DATA_COUNTERS[name], v * DATA_WORD_BYTES, **lab))
                elif name in _PACKET_COUNTERS:
                    add(Sample.of(_PACKET_COUNTERS[name], v, **lab))
                else:
                    add(Sample.of("infiniband_port_stat", v, counter=name, **lab))
            for name, v in p.hw_counters:
                add(Sample.of("infiniband_port_hw_stat", v, counter=name, **lab))
    return out


class InfinibandCollector:
    name: ClassVar[str] = "infiniband"
    metrics: ClassVar[Mapping[str, MetricSpec]] = METRICS

    def __init__(self, sysfs_root: Path) -> None:
        self.sysfs_root = sysfs_root

    def collect(self) -> Collection:
        devices, problems = read_devices(self.sysfs_root)
        return Collection(tuple(samples_of(devices)), errors=problems)

    def close(self) -> None:
        pass


def create(cfg: Config, **_seams: object) -> InfinibandCollector:
    """A node without HCAs still gets a collector: it reports the reason in its errors each cycle."""
    return InfinibandCollector(cfg.paths.sysfs_root)
