"""NVML's XID event set (nvmlEventTypeXidCriticalError) as a source of XID events.

A second source beside the kernel log, for when the log is not readable or a line is lost. It
gives only the GPU and the code: the kernel line is richer (pid, process, NVLink5 registers,
XID 154's recovery action), so collectors/kmsg.py counts an XID seen both ways once and prefers
the line. Waits are bounded (NVML_WAIT_MS per event) so a poll never blocks the collector.
"""

from __future__ import annotations

import ctypes
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Protocol

from podhealth.pci import normalise as normalise_pci

NVML_WAIT_MS = 1  # nvmlEventSetWait timeout; the agent calls us every interval anyway


@dataclass(frozen=True, slots=True)
class NvmlXid:
    pci_bus_id: str
    gpu: int | None
    code: int
    time: float


class XidEventSource(Protocol):
    def poll(self, max_events: int) -> list[NvmlXid]: ...

    def gpu_index_by_pci(self) -> Mapping[str, int]: ...

    def close(self) -> None: ...


class NvmlUnusable(Exception):
    pass


class NvmlXidEvents:
    """pynvml event set for XID critical errors; `nvml` is the pynvml module (or a stand-in)."""

    def __init__(self, nvml: Any, clock: Callable[[], float] = time.time, library_path: str = "") -> None:
        self._nvml = nvml
        self._clock = clock
        self._set: Any = None
        self._pci_by_key: dict[Any, str] = {}
        self._index_by_pci: dict[str, int] = {}
        self.notes: list[str] = []  # per-device registration problems, reported once
        if library_path and getattr(nvml, "nvmlLib", "absent") is None:
            try:
                nvml.nvmlLib = ctypes.CDLL(library_path)
            except OSError as e:
                raise NvmlUnusable(f"cannot load NVML library {library_path}: {e}") from e
        try:
            nvml.nvmlInit()
        except Exception as e:  # noqa: BLE001 - NVMLError, missing library (OSError), anything
            raise NvmlUnusable(f"nvmlInit failed: {e}") from e
        try:
            self._setup()
        except Exception as e:  # noqa: BLE001
            self.close()
            raise NvmlUnusable(f"NVML XID events unavailable: {e}") from e

    def _setup(self) -> None:
        n = self._nvml
        self._set = n.nvmlEventSetCreate()
        registered = 0
        for i in range(n.nvmlDeviceGetCount()):
            try:
                h = n.nvmlDeviceGetHandleByIndex(i)
                pci = _nvml_pci(n, h)
                if pci:
                    self._index_by_pci[pci] = i
                    self._pci_by_key[_handle_key(h)] = pci
                n.nvmlDeviceRegisterEvents(h, n.nvmlEventTypeXidCriticalError, self._set)
                registered += 1
            except Exception as e:  # noqa: BLE001 - one GPU (lost, unsupported) must not stop the rest
                self.notes.append(f"GPU {i}: XID events not registered: {e}")
        if registered == 0:
            raise NvmlUnusable("no GPU accepted XID event registration")

    def gpu_index_by_pci(self) -> Mapping[str, int]:
        return dict(self._index_by_pci)

    def poll(self, max_events: int) -> list[NvmlXid]:
        n = self._nvml
        out: list[NvmlXid] = []
        while len(out) < max_events:
            try:
                data = n.nvmlEventSetWait_v2(self._set, NVML_WAIT_MS)
            except n.NVMLError_Timeout:
                break
            if not int(data.eventType) & int(n.nvmlEventTypeXidCriticalError):
                continue
            pci = self._pci_by_key.get(_handle_key(data.device)) or _nvml_pci(n, data.device)
            out.append(NvmlXid(pci, self._index_by_pci.get(pci), int(data.eventData), self._clock()))
        return out

    def close(self) -> None:
        n = self._nvml
        try:
            if self._set is not None:
                n.nvmlEventSetFree(self._set)
        except Exception:  # noqa: BLE001 - closing must not raise
            pass
        self._set = None
        try:
            n.nvmlShutdown()  # NVML reference-counts init/shutdown, so other users are unaffected
        except Exception:  # noqa: BLE001
            pass


def _nvml_pci(n: Any, handle: Any) -> str:
    try:
        info = n.nvmlDeviceGetPciInfo_v3(handle)
    except Exception:  # noqa: BLE001
        return ""
    return normalise_pci(info.busId) or ""  # bytes with trailing NULs from ctypes: core/pci.py reads them


def _handle_key(h: Any) -> Any:
    try:
        return ctypes.cast(h, ctypes.c_void_p).value
    except (TypeError, ctypes.ArgumentError):
        return id(h)


def open_nvml_xid_events(library_path: str = "") -> XidEventSource:
    """The real source: pynvml (on `library_path` when given). Raises NvmlUnusable."""
    try:
        import pynvml
    except ImportError as e:
        raise NvmlUnusable(f"pynvml not importable: {e}") from e
    return NvmlXidEvents(pynvml, library_path=library_path)
