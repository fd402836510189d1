"""core/pci.py, the one PCI-address normaliser: every form a source writes, and garbage (None,
never an exception). The readers that join on an address all go through it."""

from __future__ import annotations

import pytest

from podhealth import pci
from podhealth.checks.passive import aer
from podhealth.collectors import compat_dcgm, ib_parse, nvml_events, nvml_session, xid_parse


@pytest.mark.parametrize(("raw", "want"), [
    ("0000:1b:00.0", "0000:1b:00.0"),              # sysfs bus/pci/devices
    ("0000:1B:00.0", "0000:1b:00.0"),
    ("00000000:1B:00.0", "0000:1b:00.0"),          # NVML / DCGM busId: 8-digit domain, upper case
    (b"00000000:DB:00.0\x00\x00", "0000:db:00.0"),  # ... as ctypes hands it over
    ("00000001:B1:00.1", "0001:b1:00.1"),
    ("PCI:0000:18:00", "0000:18:00.0"),            # the NVIDIA driver's Xid line (no function)
    ("PCI:0008:01:00", "0008:01:00.0"),
    ("18:00.0", "0000:18:00.0"),                   # no domain
    (" 0000:18:00.0\n", "0000:18:00.0"),
    ("00010000:E1:00.0", "10000:e1:00.0"),         # Intel VMD domain, printed as the kernel does
    ("10000:e1:00.0", "10000:e1:00.0"),
    ("0000:18:1f.7", "0000:18:1f.7"),
    ("PCI:0001:ab:cd", "0001:ab:cd.0"),            # (an anonymised corpus line: two hex digits kept)
    # garbage: None, never an exception
    ("", None), ("garbage", None), ("PCI:zz:00", None), ("0000:18:00.8", None),
    ("0000:118:00.0", None), ("000000000:18:00.0", None), ("0000:18:00.0.1", None), ("0000:18", None),
    ("../../../0000:18:00.0", None), ("0000:18:00.0 junk", None), ("\x00", None), (b"\xff\xfe", None),
    (None, None), (18, None), (["0000:18:00.0"], None),
])
def test_every_form_and_garbage(raw: object, want: str | None) -> None:
    assert pci.normalise(raw) == want
    if want is not None:
        assert pci.normalise(want) == want  # idempotent
        dcgm = pci.dcgm_form(raw)
        assert dcgm is not None and dcgm == dcgm.upper() and len(dcgm.split(":")[0]) == 8
        assert pci.normalise(dcgm) == want  # DCGM's form round-trips
    else:
        assert pci.dcgm_form(raw) is None


def test_every_reader_uses_the_one_normaliser() -> None:
    """No reader keeps its own: the modules that join on an address bind core's function."""
    assert xid_parse.normalise_pci is pci.normalise
    assert nvml_events.normalise_pci is pci.normalise
    assert aer.normalise_pci is pci.normalise
    assert nvml_session.pci_address is pci and compat_dcgm.pci is pci and ib_parse.pci is pci
    for mod in (xid_parse, nvml_session, compat_dcgm, ib_parse):
        assert not [n for n in vars(mod) if "pci" in n.lower() and n not in ("pci", "pci_address", "normalise_pci")
                    and callable(getattr(mod, n)) and "normal" in n.lower()], mod.__name__


@pytest.mark.parametrize(("link", "want"), [
    ("../../../devices/pci0000:a8/0000:a9:00.1", "0000:a9:00.1"),
    ("../../../0000:AA:00.0/", "0000:aa:00.0"),
    ("../../devices/virtual/net/ib0", None),
    ("", None),
    ("../../../0000:zz:00.0", None),
])
def test_sysfs_device_links(link: str, want: str | None) -> None:
    assert ib_parse.parse_pci_address(link) == want
