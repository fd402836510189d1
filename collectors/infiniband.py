"""InfiniBand ports from <sysfs_root>/class/infiniband: state, rate, and every counter.

The reader gathers file bytes (one read per file per cycle); ib_parse's pure parsers turn them
into values. Values are exported raw: what a symbol error rate means is for checks/ib.

A DGX reads ~500 of these files every cycle and most of them (error counters, attributes) hold
the same text as last time, so the collector remembers, per file, the text it last read and the
Sample (or the problem) that text gave: an unchanged file costs its read and a bytes compare, and
an unchanged Sample is handed on as the same object (which lets the exposition reuse its line).
Directory listings are kept while the directory's inode and mtime stay the same, and re-read at
least every RELIST_SECONDS in case a filesystem does not update them.

Files stay open between collections and are re-read with pread() at offset 0: sysfs (kernfs)
runs the attribute's show() again for every read from the start, so one syscall per counter
replaces open+read+close (the open, a path walk, was most of the cost). A file of a removed
device answers ENODEV and is opened again. That holds while a directory is settled: its inode
and mtime as at the last look, and that look not racy. A directory whose files may have been
replaced by rename (a test tree; sysfs never does this) is read file by file with open+read+
close, its kept fds let go, until it settles again.
"""

from __future__ import annotations

import contextlib
import errno
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, ClassVar, Mapping

from podhealth.collectors.base import Collection, raise_if_local, specs
from podhealth.collectors.ib_parse import (is_bond_device, parse_bond_slaves, parse_counter, parse_enum,
                                           parse_netdev, parse_numa_node, parse_pci_address, parse_pcie_speed,
                                           parse_pcie_width, parse_rate)
from podhealth.config import Config
from podhealth.vocab import Labels, MetricSpec, Sample, labels_of

_PORT_ATTRS = ("state", "phys_state", "rate", "link_layer")
_MAX_FILE = 4096  # sysfs attributes are one page at most
_O_FILE = os.O_RDONLY | os.O_CLOEXEC
_O_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
RELIST_SECONDS = 60.0
RACY_NS = 2_000_000_000

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
    MetricSpec("infiniband_device_pci_info", "info", "Where the HCA sits: PCI address and NUMA node (\"\" = not known)."),
    MetricSpec("infiniband_device_pcie_link_gen", "gauge", "The HCA's current PCIe link generation (device/current_link_speed)."),
    MetricSpec("infiniband_device_pcie_link_width", "gauge", "The HCA's current PCIe link width in lanes (device/current_link_width)."),
    MetricSpec("infiniband_port_netdev_info", "info",
               "The port's netdev (gid_attrs/ndevs/0, else device/net/*); bond_slaves when it is a bonding master."),
)

# What one file's text gave: (the text, its sample or None, its problem or None).
_Memo = tuple[bytes, "Sample | None", "str | None"]
_Make = Callable[[str, bytes], "tuple[Sample | None, str | None]"]


def _read_at(dfd: int, name: str) -> bytes:
    """One sysfs attribute, opened relative to its directory's fd: the kernel resolves one path
    component instead of ten, and os.open/os.read skip the io stack of open()."""
    fd = os.open(name, _O_FILE, dir_fd=dfd)
    try:
        return os.read(fd, _MAX_FILE)
    finally:
        os.close(fd)


# Errors after which a kept fd is worth opening again: the file (or its device) went away.
_REOPEN = frozenset({errno.ENODEV, errno.ENOENT, errno.ESTALE, errno.EBADF})
MAX_KEPT_FDS = 4096  # beyond this (an unusually large host), files are opened per read as before


class _Kept:
    """The fds kept open in one directory, by file name."""

    open_fds = 0  # across all directories of all collectors in this process

    def __init__(self) -> None:
        self.fds: dict[str, int] = {}

    def read(self, dfd: int, name: str, settled: bool) -> bytes:
        """The file's bytes: pread on the kept fd in a settled directory; otherwise (files there
        may have been replaced: the directory changed) opened and closed as any reader would."""
        fd = self.fds.get(name)
        if not settled:
            if fd is not None:
                self._drop(name)
            return _read_at(dfd, name)
        if fd is not None:
            try:
                return os.pread(fd, _MAX_FILE, 0)
            except OSError as e:
                if e.errno not in _REOPEN:
                    raise  # e.g. EINVAL from a counter the firmware refuses: the same next time
            self._drop(name)
        if _Kept.open_fds >= MAX_KEPT_FDS:
            return _read_at(dfd, name)
        fd = os.open(name, _O_FILE, dir_fd=dfd)
        try:
            raw = os.read(fd, _MAX_FILE)
        except BaseException:
            os.close(fd)
            raise
        self.fds[name] = fd
        _Kept.open_fds += 1
        return raw

    def _drop(self, name: str) -> None:
        fd = self.fds.pop(name)
        _Kept.open_fds -= 1
        with contextlib.suppress(OSError):
            os.close(fd)

    def keep_only(self, names: "set[str] | tuple[str, ...]") -> None:
        for name in [n for n in self.fds if n not in names]:
            self._drop(name)

    def close(self) -> None:
        for name in list(self.fds):
            self._drop(name)

    def __del__(self) -> None:
        # A collector dropped without close() (a one-off read, a test) must not keep its fds.
        self.close()


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", "replace")


def _strerror(e: OSError) -> str:
    return e.strerror or str(e)


@dataclass
class _Listing:
    """A directory's sorted entries (dot files left out), valid while its inode and mtime hold.

    A listing taken within RACY_NS of the directory's mtime is not trusted: the kernel stamps
    mtimes with a coarse clock, so an entry added a moment later can leave the mtime as it was
    (git's "racily clean" problem). Such a directory is listed again next time."""

    key: tuple[int, int] = (-1, -1)
    names: tuple[str, ...] = ()
    at: float = float("-inf")
    racy: bool = True

    def of(self, dfd: int, now: float) -> tuple[tuple[str, ...], bool, bool]:
        """(names, changed, settled) for the directory open at `dfd`; not settled when its files
        may have been replaced since the last look (its inode or mtime moved, or that look was racy)."""
        st = os.fstat(dfd)
        key = (st.st_ino, st.st_mtime_ns)
        settled = key == self.key and not self.racy
        if settled and now - self.at < RELIST_SECONDS:
            return self.names, False, True
        # An editor's or a writer's temporary (".name") is never a kernel counter.
        names = tuple(sorted(n for n in os.listdir(dfd) if not n.startswith(".")))
        changed = names != self.names
        self.key, self.names, self.at = key, names, now
        self.racy = time.time_ns() - st.st_mtime_ns < RACY_NS  # a future mtime too
        return names, changed, settled

    def expire(self) -> None:
        self.at = float("-inf")


@dataclass
class _Watch:
    """Whether a directory's files may have been replaced since the last look (see _Listing)."""

    key: tuple[int, int] = (-1, -1)
    racy: bool = True

    def settled(self, dfd: int) -> bool:
        st = os.fstat(dfd)
        key = (st.st_ino, st.st_mtime_ns)
        settled = key == self.key and not self.racy
        self.key, self.racy = key, time.time_ns() - st.st_mtime_ns < RACY_NS
        return settled


@dataclass
class _CounterDir:
    """counters/ or hw_counters/ of one port: its listing, kept fds and a memo per file."""

    sub: str
    listing: _Listing = field(default_factory=_Listing)
    memo: dict[str, _Memo] = field(default_factory=dict)
    kept: _Kept = field(default_factory=_Kept)

    def close(self) -> None:
        self.kept.close()

    def read(self, pdfd: int, where: str, make: _Make, now: float,
             out: list[Sample], read_problems: list[str], parse_problems: list[str]) -> None:
        try:
            dfd = os.open(self.sub, _O_DIR, dir_fd=pdfd)
        except FileNotFoundError:
            self.memo.clear()
            self.kept.close()
            return
        except OSError as e:
            raise_if_local(e, f"{where}/{self.sub}")
            read_problems.append(f"{where}/{self.sub}: {_strerror(e)}")
            return
        try:
            names, changed, settled = self.listing.of(dfd, now)
            memo = self.memo
            if changed:
                memo = self.memo = {n: memo[n] for n in names if n in memo}
                self.kept.keep_only(names)
            kept = self.kept
            for name in names:
                try:
                    raw = kept.read(dfd, name, settled)
                except OSError as e:
                    raise_if_local(e, f"{where}/{self.sub}/{name}")
                    if e.errno == errno.ENOENT:
                        self.listing.expire()  # gone (or a dangling link): look again next cycle
                    # e.g. EINVAL from a counter the firmware refuses to read: skip it, keep the port
                    if e.errno != errno.EISDIR:
                        read_problems.append(f"{where}/{self.sub}/{name}: {_strerror(e)}")
                    continue
                hit = memo.get(name)
                if hit is None or hit[0] != raw:
                    sample, problem = make(name, raw)
                    hit = memo[name] = (raw, sample, problem)
                if hit[1] is not None:
                    out.append(hit[1])
                elif hit[2] is not None:
                    parse_problems.append(f"{where}/{self.sub}/{name}: {hit[2]}")
        finally:
            os.close(dfd)


def _counter_value(raw: bytes) -> tuple[int | None, str | None]:
    """(value, problem); (None, None) for 'N/A (no PMA)'. int() reads the bytes directly in the
    common case; anything else goes through the pure parser for its verdict and message."""
    try:
        v = int(raw)
        if v >= 0:
            return v, None
    except ValueError:
        pass
    try:
        return parse_counter(_text(raw)), None
    except ValueError as e:
        return None, str(e)


class _Port:
    """One port's readers and memos; built when the port first appears."""

    def __init__(self, device: str, name: str, number: int, hw_counters: bool = True) -> None:
        self.device, self.name, self.number = device, name, number
        self.where = f"{device}/ports/{name}"
        self.port_label = str(number)
        self.attr_memo: dict[str, _Memo] = {}
        self.attr_kept = _Kept()
        self.watch = _Watch()
        self.counters = _CounterDir("counters")
        self.hw_counters = _CounterDir("hw_counters") if hw_counters else None

    def close(self) -> None:
        self.attr_kept.close()
        self.counters.close()
        if self.hw_counters is not None:
            self.hw_counters.close()

    def _labels(self, **extra: str) -> Labels:
        return labels_of(device=self.device, port=self.port_label, **extra)

    def _make_attr(self, attr: str, raw: bytes) -> tuple[Sample | None, str | None]:
        text = _text(raw)
        try:
            if attr == "state" or attr == "phys_state":
                ident, name = parse_enum(text)
                metric = "infiniband_port_state" if attr == "state" else "infiniband_port_physical_state"
                return Sample(metric, float(ident), self._labels(state=name)), None
            if attr == "rate":
                return Sample("infiniband_port_rate_bytes_per_second", parse_rate(text), self._labels()), None
        except ValueError as e:
            return None, str(e)
        layer = text.strip()
        if not layer:
            return None, None
        return Sample("infiniband_port_link_layer_info", 1.0, self._labels(link_layer=layer)), None

    def _make_counter(self, name: str, raw: bytes) -> tuple[Sample | None, str | None]:
        v, problem = _counter_value(raw)
        if v is None:
            return None, problem
        if name in _DATA_COUNTERS:
            return Sample(_DATA_COUNTERS[name], float(v * DATA_WORD_BYTES), self._labels()), None
        if name in _PACKET_COUNTERS:
            return Sample(_PACKET_COUNTERS[name], float(v), self._labels()), None
        return Sample("infiniband_port_stat", float(v), self._labels(counter=name)), None

    def _make_hw(self, name: str, raw: bytes) -> tuple[Sample | None, str | None]:
        v, problem = _counter_value(raw)
        if v is None:
            return None, problem
        return Sample("infiniband_port_hw_stat", float(v), self._labels(counter=name)), None

    def read(self, ports_dfd: int, now: float, out: list[Sample],
             read_problems: list[str], parse_problems: list[str]) -> bool:
        """False when the port's directory is gone (the caller lists the ports again)."""
        try:
            pdfd = os.open(self.name, _O_DIR, dir_fd=ports_dfd)
        except FileNotFoundError:
            return False
        except OSError as e:
            raise_if_local(e, self.where)
            read_problems.append(f"{self.where}: {_strerror(e)}")
            return True
        try:
            attr_samples: list[Sample] = []
            attr_parse: list[str] = []
            settled = self.watch.settled(pdfd)
            for attr in _PORT_ATTRS:
                try:
                    raw = self.attr_kept.read(pdfd, attr, settled)
                except FileNotFoundError:
                    continue  # optional attribute: absent, not a problem
                except OSError as e:
                    raise_if_local(e, f"{self.where}/{attr}")
                    read_problems.append(f"{self.where}/{attr}: {_strerror(e)}")
                    continue
                hit = self.attr_memo.get(attr)
                if hit is None or hit[0] != raw:
                    hit = self.attr_memo[attr] = (raw, *self._make_attr(attr, raw))
                if hit[1] is not None:
                    attr_samples.append(hit[1])
                elif hit[2] is not None:
                    attr_parse.append(f"{self.where}/{attr}: {hit[2]}")
            out.extend(attr_samples)
            parse_problems.extend(attr_parse)
            self.counters.read(pdfd, self.where, self._make_counter, now, out, read_problems, parse_problems)
            if self.hw_counters is not None:
                self.hw_counters.read(pdfd, self.where, self._make_hw, now, out, read_problems, parse_problems)
        finally:
            os.close(pdfd)
        return True


_DEVICE_ATTRS = ("board_id", "fw_ver", "hca_type")


def _optional_text(path: str, dir_fd: int | None = None) -> str | None:
    """A file that may well be absent (a test tree, an older kernel, an IB port's GID without
    a netdev): its text, or None. Never a problem: roles are told without it where they can."""
    try:
        fd = os.open(path, _O_FILE, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        return _text(os.read(fd, _MAX_FILE))
    except OSError:
        return None
    finally:
        os.close(fd)


def _optional_listing(path: str, dir_fd: int | None = None) -> tuple[str, ...]:
    try:
        fd = os.open(path, _O_DIR, dir_fd=dir_fd)
    except OSError:
        return ()
    try:
        return tuple(sorted(n for n in os.listdir(fd) if not n.startswith(".")))
    except OSError:
        return ()
    finally:
        os.close(fd)


class _Topology:
    """Where a device sits (PCI address, NUMA node) and its ports' netdevs and bonds: what
    checks/ib_roles needs to tell a compute rail from a storage port. These change only with a
    driver reload or a re-bond, so they are read when the device appears and every
    RELIST_SECONDS after, not every cycle (a dozen syscalls per device)."""

    def __init__(self, device: str, net_dir: str) -> None:
        self.device = device
        self.net_dir = net_dir  # <sysfs_root>/class/net
        self.at = float("-inf")
        self.samples: tuple[Sample, ...] = ()

    def read(self, dfd: int, ports: tuple[tuple[int, str], ...], now: float) -> tuple[Sample, ...]:
        if now - self.at < RELIST_SECONDS and self.samples:
            return self.samples
        self.at = now
        try:
            pci = parse_pci_address(os.readlink("device", dir_fd=dfd))
        except OSError:
            pci = None  # no device link: a virtual device or a test tree
        numa_text = _optional_text("device/numa_node", dfd)
        numa = parse_numa_node(numa_text) if numa_text is not None else None
        out: list[Sample] = []
        if pci is not None or numa is not None:
            out.append(Sample("infiniband_device_pci_info", 1.0, labels_of(
                device=self.device, pci_address=pci or "", numa_node="" if numa is None else str(numa))))
        # The HCA's own PCIe link (a site golden profile records it; a ConnectX-7 trains gen5 x16).
        for attr, parse, metric in (("current_link_speed", parse_pcie_speed, "infiniband_device_pcie_link_gen"),
                                    ("current_link_width", parse_pcie_width, "infiniband_device_pcie_link_width")):
            text = _optional_text(f"device/{attr}", dfd)
            value = parse(text) if text is not None else None
            if value is not None:
                out.append(Sample(metric, float(value), labels_of(device=self.device)))
        # mlx5: one netdev per RDMA device, so device/net/* is the fallback for every port
        # (IB ports' GIDs have no netdev; RoCE ones name it, a bond's names the bonding master).
        dev_netdevs = _optional_listing("device/net", dfd)
        for number, pn in ports:
            ndev_text = _optional_text(f"ports/{pn}/gid_attrs/ndevs/0", dfd)
            netdev = parse_netdev(ndev_text) if ndev_text is not None else None
            if netdev is None and dev_netdevs and not is_bond_device(self.device):
                netdev = dev_netdevs[min(number - 1, len(dev_netdevs) - 1)] if number >= 1 else dev_netdevs[0]
            if netdev is None:
                continue
            slaves_text = _optional_text(os.path.join(self.net_dir, netdev, "bonding", "slaves"))
            slaves = parse_bond_slaves(slaves_text) if slaves_text is not None else ()
            out.append(Sample("infiniband_port_netdev_info", 1.0, labels_of(
                device=self.device, port=str(number), netdev=netdev, bond_slaves=" ".join(slaves))))
        self.samples = tuple(out)
        return self.samples


class _Device:
    def __init__(self, name: str, hw_counters: bool = True, net_dir: str = "") -> None:
        self.name = name
        self.hw_counters = hw_counters
        self.topology = _Topology(name, net_dir)
        self.kept = _Kept()
        self.watch = _Watch()
        self.ports_listing = _Listing()
        self.ports: dict[str, _Port] = {}
        self.info: tuple[tuple[bytes | None, ...], Sample] | None = None

    def close(self) -> None:
        self.kept.close()
        for port in self.ports.values():
            port.close()

    def _info(self, dfd: int, read_problems: list[str]) -> Sample:
        raws: list[bytes | None] = []
        settled = self.watch.settled(dfd)
        for attr in _DEVICE_ATTRS:
            try:
                raws.append(self.kept.read(dfd, attr, settled))
            except FileNotFoundError:
                raws.append(None)  # optional attribute (hfi1 has no hca_type): absent, not a problem
            except OSError as e:
                raise_if_local(e, f"{self.name}/{attr}")
                raws.append(None)
                read_problems.append(f"{self.name}/{attr}: {_strerror(e)}")
        key = tuple(raws)
        if self.info is None or self.info[0] != key:
            board, fw, hca = (_text(r).strip() if r is not None else "" for r in raws)
            self.info = (key, Sample("infiniband_info", 1.0, labels_of(
                device=self.name, board_id=board, firmware_version=fw, hca_type=hca)))
        return self.info[1]

    def read(self, class_dfd: int, now: float, out: list[Sample], problems: list[str]) -> None:
        read_problems: list[str] = []
        parse_problems: list[str] = []
        try:
            dfd = os.open(self.name, _O_DIR, dir_fd=class_dfd)
        except OSError as e:
            raise_if_local(e, self.name)
            problems.append(f"{self.name}: {_strerror(e)}")
            return
        try:
            out.append(self._info(dfd, read_problems))
            try:
                ports_dfd = os.open("ports", _O_DIR, dir_fd=dfd)
            except FileNotFoundError:
                ports_dfd = -1
            except OSError as e:
                raise_if_local(e, f"{self.name}/ports")
                ports_dfd = -1
                read_problems.append(f"{self.name}/ports: {_strerror(e)}")
            try:
                names: tuple[str, ...] = ()
                if ports_dfd >= 0:
                    names, changed, _ = self.ports_listing.of(ports_dfd, now)
                    if changed:
                        for n in [n for n in self.ports if n not in names]:
                            self.ports.pop(n).close()
                if not names:
                    read_problems.append(f"{self.name}: no ports")
                numbered: list[tuple[int, str]] = []
                for pn in names:
                    try:
                        numbered.append((int(pn), pn))
                    except ValueError:
                        parse_problems.append(f"{self.name}/ports/{pn}: port directory name is not a number")
                numbered.sort()
                out.extend(self.topology.read(dfd, tuple(numbered), now))
                for number, pn in numbered:
                    port = self.ports.get(pn)
                    if port is None:
                        port = self.ports[pn] = _Port(self.name, pn, number, self.hw_counters)
                    if not port.read(ports_dfd, now, out, read_problems, parse_problems):
                        self.ports_listing.expire()
            finally:
                if ports_dfd >= 0:
                    os.close(ports_dfd)
        finally:
            os.close(dfd)
        problems.extend(read_problems)
        problems.extend(parse_problems)


class InfinibandCollector:
    name: ClassVar[str] = "infiniband"
    metrics: ClassVar[Mapping[str, MetricSpec]] = METRICS

    def __init__(self, sysfs_root: Path, hw_counters: bool = True) -> None:
        self.sysfs_root = sysfs_root
        self.hw_counters = hw_counters
        self._class_dir = os.path.join(sysfs_root, "class", "infiniband")
        self._net_dir = os.path.join(sysfs_root, "class", "net")
        self._devices: dict[str, _Device] = {}

    def collect(self) -> Collection:
        """Every HCA port's samples, and the problems met (one bad file never fails the rest)."""
        problems: list[str] = []
        try:
            class_dfd = os.open(self._class_dir, _O_DIR)
        except OSError as e:
            self.close()
            # Only an absent class directory means "no HCAs"; EMFILE there means "could not look".
            raise_if_local(e, self._class_dir)
            return Collection((), errors=(f"{self._class_dir}: {_strerror(e)} (no InfiniBand devices)",))
        out: list[Sample] = []
        now = time.monotonic()
        try:
            # Listed every cycle: HCAs come and go with driver reloads (sysfs does not bump the mtime).
            names = sorted(os.listdir(class_dfd))
            devices = {n: self._devices.get(n) or _Device(n, self.hw_counters, self._net_dir) for n in names}
            for gone in [d for n, d in self._devices.items() if n not in devices]:
                gone.close()
            self._devices = devices
            for dev in devices.values():
                dev.read(class_dfd, now, out, problems)
        finally:
            os.close(class_dfd)
        return Collection(tuple(out), errors=tuple(problems))

    def close(self) -> None:
        for dev in self._devices.values():
            dev.close()
        self._devices = {}


def create(cfg: Config, **_seams: object) -> InfinibandCollector:
    """A node without HCAs still gets a collector: it reports the reason in its errors each cycle."""
    return InfinibandCollector(cfg.paths.sysfs_root, cfg.collectors.infiniband.hw_counters)
