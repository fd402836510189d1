"""One NVML session per process, shared by the nvml and nvlink collectors.

NVML is initialised lazily (first collect, in a worker thread, never on the event loop), once,
and handles plus GPU identities are cached. A lock guards only initialisation and reset: device
calls run without it, so a GPU that hangs inside one collector's call does not block the other
collector (unless NVML itself is globally hung, in which case nothing can help).

After NVML reports UNINITIALIZED / DRIVER_NOT_LOADED / LIB_RM_VERSION_MISMATCH (driver reloaded or
upgraded under us) the session is reset and re-initialised on the next use; each initialisation
is a new `generation`, and per-device caches in the collectors are keyed by it.

`DeviceCalls` is the one place that sorts NVML errors: NOT_SUPPORTED / FUNCTION_NOT_FOUND mean
"field absent" (never 0), GPU_IS_LOST and TIMEOUT take the GPU down for this collection, anything
else (UNKNOWN, NO_PERMISSION, INVALID_ARGUMENT as MIG parents answer some queries, a corrupted
InfoROM, ...) makes that one reading unreadable: the GPU stays up while it answers anything else,
and the checks that need the reading say UNKNOWN. Meanings of values stay out of here (checks/
judge them).
"""

from __future__ import annotations

import ctypes
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, TypeVar

import pynvml

from podhealth import pci as pci_address
from podhealth.collectors.base import SourceUnreadable

T = TypeVar("T")

# NVML return codes that say "this GPU / driver has no such thing": the value is absent.
ABSENT_CODES = frozenset({pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_FUNCTION_NOT_FOUND})
# This host ran out of memory or other resources for the call: nothing is known about the GPU,
# so the collection fails (its checks say UNKNOWN) rather than calling the GPU lost.
LOCAL_CODES = frozenset({pynvml.NVML_ERROR_MEMORY, pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES})
# The library lost its state (driver reloaded, upgraded, or never initialised): re-initialise.
REINIT_CODES = frozenset({
    pynvml.NVML_ERROR_UNINITIALIZED,
    pynvml.NVML_ERROR_DRIVER_NOT_LOADED,
    pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH,
})
# Unsupported fields are re-probed this often (collections), because ECC mode or a link can be
# enabled by a GPU reset that does not re-initialise NVML.
REPROBE_EVERY = 60
# NVML calls answer in milliseconds; one slower than this means the GPU is wedged (see DeviceCalls).
SLOW_CALL_S = 2.0


class NvmlUnavailable(RuntimeError):
    """NVML could not be initialised (no driver, no library, or no answer): the collector fails."""


class NvmlReinitNeeded(Exception):
    """A device call said NVML lost its state; the collection is retried after a re-init."""

    def __init__(self, generation: int, error: pynvml.NVMLError) -> None:
        super().__init__(f"NVML needs re-initialisation: {error}")
        self.generation = generation
        self.error = error


def cuda_version_text(v: int) -> str:
    """nvmlSystemGetCudaDriverVersion's 12040 as nvidia-smi prints it: "12.4"."""
    return f"{v // 1000}.{(v % 1000) // 10}"


def error_text(e: BaseException) -> str:
    # NVMLError.__str__ calls nvmlErrorString, which itself can fail on a half-dead library.
    try:
        return str(e)
    except Exception:  # noqa: BLE001 - a message must never raise
        return f"NVML error {getattr(e, 'value', '?')}"


@dataclass(frozen=True, slots=True)
class GpuIdentity:
    """Who a GPU is; any part NVML could not tell is empty (and its label is left off)."""

    index: int
    uuid: str = ""
    pci_bus_id: str = ""
    model: str = ""

    @property
    def complete(self) -> bool:
        return bool(self.uuid and self.pci_bus_id and self.model)

    def labels(self) -> dict[str, object]:
        return {
            "gpu": self.index,
            "uuid": self.uuid or None,
            "pci_bus_id": self.pci_bus_id or None,
            "model": self.model or None,
        }


@dataclass(frozen=True, slots=True)
class Device:
    """One GPU as this session sees it now: a handle (None when NVML refused one) and its identity."""

    index: int
    generation: int
    identity: GpuIdentity
    handle: object | None = None
    error: pynvml.NVMLError | None = None  # why there is no handle, when there is none


@dataclass(frozen=True, slots=True)
class SystemInfo:
    driver_version: str | None
    cuda_driver_version: str | None


class NvmlSession:
    """Lazy, thread-safe NVML initialisation with cached handles and identities (see module doc)."""

    def __init__(self, library_path: str = "", init_wait: float = 10.0) -> None:
        self._library_path = library_path
        self._init_wait = init_wait
        self._lock = threading.Lock()
        self._initialised = False
        self._generation = 0
        self._handles: dict[int, object] = {}
        self._identities: dict[int, GpuIdentity] = {}
        self._system: SystemInfo | None = None
        self._users = 0

    @property
    def generation(self) -> int:
        return self._generation

    # -- lifecycle ---------------------------------------------------------------------------
    def acquire(self) -> None:
        with self._lock:
            self._users += 1

    def release(self) -> None:
        """A collector is done; NVML is shut down when the last one leaves."""
        with self._lock:
            self._users = max(0, self._users - 1)
            if self._users == 0:
                self._shutdown_locked()

    def shutdown(self) -> None:
        with self._lock:
            self._shutdown_locked()

    def invalidate(self, generation: int) -> None:
        """Forget this generation's NVML state so the next use re-initialises. Only the first
        caller for a generation resets; a second collector reporting the same loss is a no-op."""
        with self._lock:
            if self._initialised and self._generation == generation:
                self._shutdown_locked()

    def _shutdown_locked(self) -> None:
        if self._initialised:
            try:
                pynvml.nvmlShutdown()
            except pynvml.NVMLError:
                pass  # the library may already have lost its state; that is why we are here
        self._initialised = False
        self._handles.clear()
        self._identities.clear()
        self._system = None

    def _ensure_init(self) -> int:
        if self._initialised:
            return self._generation
        if not self._lock.acquire(timeout=self._init_wait):
            raise NvmlUnavailable(f"NVML initialisation did not finish within {self._init_wait:g}s")
        try:
            if not self._initialised:
                self._load_library()
                try:
                    pynvml.nvmlInit()
                except pynvml.NVMLError as e:
                    raise NvmlUnavailable(f"nvmlInit failed: {error_text(e)}") from e
                self._generation += 1
                self._initialised = True
            return self._generation
        finally:
            self._lock.release()

    def _load_library(self) -> None:
        # pynvml only ever dlopens libnvidia-ml.so.1 by name; a configured path (a container that
        # mounts the driver elsewhere) is honoured by loading it first. A library set by someone
        # else (e.g. the simulator) is left alone.
        if not self._library_path or pynvml.nvmlLib is not None:
            return
        try:
            pynvml.nvmlLib = ctypes.CDLL(self._library_path)
        except OSError as e:
            raise NvmlUnavailable(f"cannot load NVML library {self._library_path}: {e}") from e

    # -- queries -----------------------------------------------------------------------------
    def devices(self) -> tuple[int, tuple[Device, ...]]:
        """(device count, one Device per index). Raises NvmlUnavailable, NvmlReinitNeeded."""
        gen = self._ensure_init()
        try:
            count = int(pynvml.nvmlDeviceGetCount())
        except pynvml.NVMLError as e:
            if e.value in REINIT_CODES:
                raise NvmlReinitNeeded(gen, e) from e
            raise NvmlUnavailable(f"nvmlDeviceGetCount failed: {error_text(e)}") from e
        return count, tuple(self._device(gen, i) for i in range(count))

    def _device(self, gen: int, index: int) -> Device:
        handle = self._handles.get(index)
        if handle is None:
            try:
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            except pynvml.NVMLError as e:
                if e.value in REINIT_CODES:
                    raise NvmlReinitNeeded(gen, e) from e
                if e.value in LOCAL_CODES:
                    raise SourceUnreadable(f"gpu {index}: nvmlDeviceGetHandleByIndex: {error_text(e)}") from e
                return Device(index, gen, self._identities.get(index, GpuIdentity(index)), None, e)
            self._handles[index] = handle  # dict assignment is atomic; a racing duplicate is harmless
        ident = self._identities.get(index)
        if ident is None or not ident.complete:
            ident = self._identify(gen, index, handle, ident)
        return Device(index, gen, ident, handle)

    def _identify(self, gen: int, index: int, handle: object, old: GpuIdentity | None) -> GpuIdentity:
        def one(fn: Callable[[], str]) -> str:
            try:
                return fn()
            except pynvml.NVMLError as e:
                if e.value in REINIT_CODES:
                    raise NvmlReinitNeeded(gen, e) from e
                return ""  # a lost GPU may still tell some of it; keep what it tells

        uuid = (old.uuid if old else "") or one(lambda: str(pynvml.nvmlDeviceGetUUID(handle)))
        pci = (old.pci_bus_id if old else "") or one(
            lambda: pci_address.normalise(pynvml.nvmlDeviceGetPciInfo(handle).busId) or "")
        model = (old.model if old else "") or one(lambda: str(pynvml.nvmlDeviceGetName(handle)))
        ident = GpuIdentity(index, uuid, pci, model)
        self._identities[index] = ident
        return ident

    def system_info(self) -> SystemInfo:
        gen = self._ensure_init()
        if self._system is not None:
            return self._system

        def text(fn: Callable[[], object]) -> object | None:
            try:
                return fn()
            except pynvml.NVMLError as e:
                if e.value in REINIT_CODES:
                    raise NvmlReinitNeeded(gen, e) from e
                return None

        drv = text(pynvml.nvmlSystemGetDriverVersion)
        cuda = text(pynvml.nvmlSystemGetCudaDriverVersion)
        if cuda is None:
            cuda = text(pynvml.nvmlSystemGetCudaDriverVersion_v2)
        info = SystemInfo(
            driver_version=str(drv) if drv is not None else None,
            cuda_driver_version=cuda_version_text(int(cuda)) if isinstance(cuda, int) else None,
        )
        self._system = info
        return info


_shared: NvmlSession | None = None
_shared_lock = threading.Lock()


def collect_with_reinit(session: NvmlSession, once: Callable[[], T]) -> T:
    """Run one collection; after a driver reload (NvmlReinitNeeded) re-init NVML and retry once."""
    try:
        return once()
    except NvmlReinitNeeded as e:
        session.invalidate(e.generation)
    try:
        return once()
    except NvmlReinitNeeded as e:
        session.invalidate(e.generation)
        raise NvmlUnavailable(str(e)) from e


def shared(library_path: str = "") -> NvmlSession:
    """The process-wide session the agent's nvml and nvlink collectors share."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = NvmlSession(library_path)
        return _shared


@dataclass
class DeviceCalls:
    """Runs one GPU's NVML calls for one collection and sorts their errors (see module doc).

    `unsupported` is the collector's per-device memory of keys that answered NOT_SUPPORTED, so
    they are not asked again until the next re-probe. Not shared between threads.
    """

    device: Device
    unsupported: set[str]
    # One call slower than this means the GPU (or its driver thread) is wedged: every further
    # call would block as long, so the rest of this GPU is skipped and it counts as timed out.
    slow_s: float = SLOW_CALL_S
    lost: bool = False
    down: bool = False  # lost or timed out: stop asking this GPU during this collection
    erroring: bool = False
    errors: list[str] = field(default_factory=list)
    # Keys whose call answered an error that is neither "absent" nor "GPU gone" (see module doc).
    unreadable: list[str] = field(default_factory=list)
    answered: int = 0  # calls that returned a value in this collection

    def get(self, key: str, fn: Callable[[], T], absent: frozenset[int] = ABSENT_CODES) -> T | None:
        if self.down or key in self.unsupported:
            return None
        t0 = time.monotonic()
        try:
            value = fn()
            self.answered += 1
            return value
        except pynvml.NVMLError as e:
            self.note(key, e, absent)
            return None
        finally:
            took = time.monotonic() - t0
            if took > self.slow_s and not self.down:
                self.down = True
                self.errors.append(f"gpu {self.device.index}: {key}: answered after {took:.1f}s "
                                   f"(limit {self.slow_s:g}s); rest of this GPU skipped")

    def note(self, key: str, e: pynvml.NVMLError, absent: frozenset[int] = ABSENT_CODES) -> None:
        code = e.value
        if code in absent:
            self.unsupported.add(key)
            return
        if code in REINIT_CODES:
            raise NvmlReinitNeeded(self.device.generation, e) from e
        if code in LOCAL_CODES:
            raise SourceUnreadable(f"gpu {self.device.index}: {key}: {error_text(e)}") from e
        self.errors.append(f"gpu {self.device.index}: {key}: {error_text(e)}")
        if code == pynvml.NVML_ERROR_GPU_IS_LOST:
            self.lost = self.down = True
        elif code == pynvml.NVML_ERROR_TIMEOUT:
            self.down = True
        else:
            # One reading this GPU / driver / deployment cannot give now (NO_PERMISSION is the
            # deployment's; UNKNOWN, INVALID_ARGUMENT on a MIG parent, ... the driver's): that
            # reading is unreadable, its checks say UNKNOWN. Nothing here says the GPU is gone.
            if code != pynvml.NVML_ERROR_NO_PERMISSION:
                self.erroring = True
            if key not in self.unreadable:
                self.unreadable.append(key)

    @property
    def up(self) -> bool:
        """The GPU answered this collection: not lost or timed out, and (when some readings erred)
        at least one call returned a value. A GPU that refuses everything does not answer."""
        return not self.down and (self.answered > 0 or not self.unreadable)
