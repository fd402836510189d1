"""A whole InfiniBand device read through the collector's pure parsers (collectors/ib_parse.py).

Test support, not production: the collector (collectors/infiniband.py) parses each file as it
reads it. The parser tests and the fuzz suite feed whole devices (every port's attributes and
counters as text) through the same parse_enum / parse_rate / parse_counter here, to check that a
malformed file is skipped on its own and reported, and that nothing raises.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from podhealth.collectors.ib_parse import parse_counter, parse_enum, parse_rate


@dataclass(frozen=True, slots=True)
class PortFiles:
    """Raw text of one port's files, as the reader found them (absent file = key missing)."""

    port: str
    attrs: Mapping[str, str]  # state, phys_state, rate, link_layer
    counters: tuple[tuple[str, str], ...] = ()
    hw_counters: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class DeviceFiles:
    name: str
    attrs: Mapping[str, str]  # board_id, fw_ver, hca_type
    ports: tuple[PortFiles, ...] = ()


@dataclass(frozen=True, slots=True)
class IbPort:
    device: str
    port: int
    state_id: int | None
    state: str | None
    phys_state_id: int | None
    phys_state: str | None
    rate_bytes_per_second: float | None
    link_layer: str | None
    counters: tuple[tuple[str, int], ...]  # raw file values (data counters still in 4-byte words)
    hw_counters: tuple[tuple[str, int], ...]

    def counter(self, name: str) -> int | None:
        for k, v in self.counters:
            if k == name:
                return v
        return None


@dataclass(frozen=True, slots=True)
class IbDevice:
    name: str
    board_id: str | None
    fw_ver: str | None
    hca_type: str | None
    ports: tuple[IbPort, ...]


@dataclass(frozen=True, slots=True)
class ParsedDevice:
    device: IbDevice
    problems: tuple[str, ...]  # malformed files, each skipped on its own


def _counters(where: str, raw: tuple[tuple[str, str], ...],
              problems: list[str]) -> tuple[tuple[str, int], ...]:
    out: list[tuple[str, int]] = []
    for name, text in raw:
        try:
            v = parse_counter(text)
        except ValueError as e:
            problems.append(f"{where}/{name}: {e}")
            continue
        if v is not None:
            out.append((name, v))
    out.sort()
    return tuple(out)


def _text(attrs: Mapping[str, str], key: str) -> str | None:
    v = attrs.get(key)
    return None if v is None else v.strip()


def parse_port(device: str, files: PortFiles, problems: list[str]) -> IbPort | None:
    where = f"{device}/ports/{files.port}"
    try:
        port = int(files.port)
    except ValueError:
        problems.append(f"{where}: port directory name is not a number")
        return None
    state_id = state = phys_id = phys = None
    rate: float | None = None
    if "state" in files.attrs:
        try:
            state_id, state = parse_enum(files.attrs["state"])
        except ValueError as e:
            problems.append(f"{where}/state: {e}")
    if "phys_state" in files.attrs:
        try:
            phys_id, phys = parse_enum(files.attrs["phys_state"])
        except ValueError as e:
            problems.append(f"{where}/phys_state: {e}")
    if "rate" in files.attrs:
        try:
            rate = parse_rate(files.attrs["rate"])
        except ValueError as e:
            problems.append(f"{where}/rate: {e}")
    return IbPort(
        device=device, port=port, state_id=state_id, state=state, phys_state_id=phys_id,
        phys_state=phys, rate_bytes_per_second=rate, link_layer=_text(files.attrs, "link_layer") or None,
        counters=_counters(f"{where}/counters", files.counters, problems),
        hw_counters=_counters(f"{where}/hw_counters", files.hw_counters, problems),
    )


def parse_device(files: DeviceFiles) -> ParsedDevice:
    problems: list[str] = []
    ports = [p for p in (parse_port(files.name, pf, problems) for pf in files.ports) if p is not None]
    ports.sort(key=lambda p: p.port)
    dev = IbDevice(
        name=files.name,
        board_id=_text(files.attrs, "board_id"),
        fw_ver=_text(files.attrs, "fw_ver"),
        hca_type=_text(files.attrs, "hca_type"),
        ports=tuple(ports),
    )
    return ParsedDevice(dev, tuple(problems))
