"""ib_parse: the pure parsers of /sys/class/infiniband attribute files."""

from __future__ import annotations

import pytest

from podhealth.collectors.ib_parse import parse_counter, parse_enum, parse_rate
from tests.harness.ib_device import DeviceFiles, PortFiles, parse_device


@pytest.mark.parametrize("text,expected", [
    ("4: ACTIVE\n", (4, "ACTIVE")),
    ("1: DOWN\n", (1, "DOWN")),
    ("5: LinkUp\n", (5, "LinkUp")),
    ("2: Polling", (2, "Polling")),
    ("3: Disabled\n", (3, "Disabled")),
    ("7: Phy Test\n", (7, "Phy Test")),
])
def test_parse_enum(text: str, expected: tuple[int, str]) -> None:
    assert parse_enum(text) == expected


@pytest.mark.parametrize("text", ["ACTIVE\n", "x: ACTIVE", "", ": ACTIVE"])
def test_parse_enum_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        parse_enum(text)


@pytest.mark.parametrize("text,expected", [
    ("400 Gb/sec (4X NDR)\n", 5e10),
    ("200 Gb/sec (4X HDR)\n", 2.5e10),
    ("100 Gb/sec (4X EDR)\n", 1.25e10),
    ("25 Gb/sec (1X EDR)\n", 3.125e9),
    ("2.5 Gb/sec (1X SDR)\n", 3.125e8),
    ("10 Gb/sec (4X)\n", 1.25e9),  # i40iw prints no speed name
])
def test_parse_rate(text: str, expected: float) -> None:
    assert parse_rate(text) == expected


@pytest.mark.parametrize("text", ["fast", "400 Tb/sec (4X NDR)", "x Gb/sec", ""])
def test_parse_rate_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        parse_rate(text)


@pytest.mark.parametrize("text,expected", [
    ("0\n", 0), ("48213375190664\n", 48213375190664), ("18446744073709551615\n", 2**64 - 1),
    ("N/A (no PMA)\n", None),
])
def test_parse_counter(text: str, expected: int | None) -> None:
    assert parse_counter(text) == expected


@pytest.mark.parametrize("text", ["", "-1", "0x10", "12 34", "abc\n"])
def test_parse_counter_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        parse_counter(text)


def _device() -> DeviceFiles:
    port = PortFiles(
        port="1",
        attrs={"state": "4: ACTIVE\n", "phys_state": "5: LinkUp\n", "rate": "400 Gb/sec (4X NDR)\n",
               "link_layer": "InfiniBand\n"},
        counters=(("symbol_error", "0\n"), ("port_xmit_data", "100\n"), ("link_downed", "garbage\n"),
                  ("VL15_dropped", "N/A (no PMA)\n")),
        hw_counters=(("out_of_buffer", "7\n"),),
    )
    return DeviceFiles("mlx5_0", {"board_id": "MT_0000000838\n", "fw_ver": "28.39.1002\n"}, (port,))


def test_parse_device_skips_only_the_malformed_counter() -> None:
    parsed = parse_device(_device())
    dev = parsed.device
    assert (dev.name, dev.board_id, dev.fw_ver, dev.hca_type) == ("mlx5_0", "MT_0000000838", "28.39.1002", None)
    (port,) = dev.ports
    assert (port.port, port.state_id, port.state, port.phys_state_id, port.phys_state) == (1, 4, "ACTIVE", 5, "LinkUp")
    assert port.rate_bytes_per_second == 5e10 and port.link_layer == "InfiniBand"
    # malformed link_downed skipped and reported; N/A counter absent (None), not 0, and no problem
    assert port.counters == (("port_xmit_data", 100), ("symbol_error", 0))
    assert port.counter("link_downed") is None and port.counter("VL15_dropped") is None
    assert port.hw_counters == (("out_of_buffer", 7),)
    assert len(parsed.problems) == 1 and "mlx5_0/ports/1/counters/link_downed" in parsed.problems[0]


def test_parse_device_missing_and_malformed_attributes() -> None:
    port = PortFiles(port="1", attrs={"state": "ACTIVE", "rate": "n/a"}, counters=())
    bad = PortFiles(port="x", attrs={})
    parsed = parse_device(DeviceFiles("hfi1_0", {}, (port, bad)))
    (p,) = parsed.device.ports
    assert p.state_id is None and p.phys_state_id is None and p.rate_bytes_per_second is None
    assert p.link_layer is None and p.counters == ()
    assert len(parsed.problems) == 3  # state, rate, port "x"
