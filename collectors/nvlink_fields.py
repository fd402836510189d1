"""Which NVML field ids (nvmlDeviceGetFieldValues) carry each NVLink reading, per link.

One nvmlDeviceGetFieldValues call answers every link's state and error counters of a GPU, where
asking per link costs 5 calls a link (90 on an 18-link H100, 720 on a DGX per collection).
Each answer carries its own nvmlReturn, so one unsupported field drops only its own reading.

The ids, from nvml.h:
  - NVML_FI_DEV_NVLINK_GET_STATE, scopeId = link: 1 active, 0 not (nvmlDeviceGetNvLinkState).
  - NVML_FI_DEV_NVLINK_ERROR_DL_{CRC,REPLAY,RECOVERY}, scopeId = link: the data-link counters of
    nvmlDeviceGetNvLinkErrorCounter (DL_CRC is the flit CRC counter, as nvidia-smi's "CRC Errors").
  - NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_L0..L11: one id per link (scopeId unused); there is
    no id for links 12-17 (Hopper has 18), so those are asked per link (`PER_CALL`).
  - NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_{TX,RX}, scopeId = UINT_MAX: KiB over all links.
A pynvml that lacks an id (an old release) leaves that reading to the per-link call as well.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any

import pynvml

ALL_LINKS = 0xFFFFFFFF

# The counters by contract name, in the order they are reported, and the scoped field for each.
_SCOPED_COUNTER = {
    "crc_flit": "NVML_FI_DEV_NVLINK_ERROR_DL_CRC",
    "replay": "NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY",
    "recovery": "NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY",
}
_PER_LINK_PREFIX = {"crc_data": "NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_L"}


@dataclass(frozen=True, slots=True)
class Ask:
    """One field to ask: what it is (`kind` state | counter | total, the link, the counter's
    name) and how (field id, scope)."""

    kind: str
    link: int
    name: str
    field_id: int
    scope: int

    @property
    def key(self) -> str:
        """The DeviceCalls key: the same reading keeps the same key whichever way it is asked."""
        if self.kind == "state":
            return f"link{self.link}"
        if self.kind == "counter":
            return f"link{self.link}_{self.name}"
        return self.name


def field_id(name: str) -> int | None:
    v = getattr(pynvml, name, None)
    return int(v) if v is not None else None


def state_asks(links: range | tuple[int, ...]) -> list[Ask]:
    fid = field_id("NVML_FI_DEV_NVLINK_GET_STATE")
    return [] if fid is None else [Ask("state", n, "state", fid, n) for n in links]


def counter_ask(link: int, counter: str) -> Ask | None:
    """The field for one counter of one link, or None when only the per-link call has it."""
    scoped = _SCOPED_COUNTER.get(counter)
    if scoped is not None:
        fid = field_id(scoped)
        return None if fid is None else Ask("counter", link, counter, fid, link)
    prefix = _PER_LINK_PREFIX.get(counter)
    fid = field_id(f"{prefix}{link}") if prefix else None
    return None if fid is None else Ask("counter", link, counter, fid, 0)


def total_asks(names: tuple[tuple[str, str], ...]) -> list[Ask]:
    """Whole-GPU fields (throughput): (metric name, pynvml constant) pairs with ids known here."""
    out = []
    for metric, const in names:
        fid = field_id(const)
        if fid is not None:
            out.append(Ask("total", -1, metric, fid, ALL_LINKS))
    return out


class _FieldValue(ctypes.Structure):
    """nvmlFieldValue_t in pynvml's layout, without its _PrintableStructure attribute hooks, which
    cost more than the rest of reading a 100-field answer."""

    _fields_ = pynvml.c_nvmlFieldValue_t._fields_


def plain(values: Any) -> Any:
    """The same memory as pynvml's answer array, read through plain ctypes fields."""
    try:
        return (_FieldValue * len(values)).from_buffer(values)
    except TypeError:
        return values  # not a ctypes array (a test's stand-in): read it as it is
