"""Watching the GPUs while a burn-in runs: temperatures, clocks-event reasons, ECC, XIDs.

A watcher samples in a background thread from `start()` to `stop()` and returns a `WatchReport`.
Two sources sit behind the same protocol:
- `NvmlWatcher`: NVML directly (pynvml); without a GPU or driver it reports `available=False`
  with the reason and never raises.
- `MetricsWatcher`: a local podhealth agent's `/metrics` URL (the names in docs/metrics.md), for
  nodes where the agent already holds NVML and the burn-in should not open it again.
Judging what the report means is burnin.judge's job; this module only observes.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Callable, Protocol, Sequence

# Clocks-event reasons that mean the GPU was slowed by heat or a power brake, not by choice.
# (sw_power_cap is routine under a full GEMM load and is recorded but not judged.)
BAD_CLOCK_EVENTS = ("hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown")
_NVML_REASON_BITS = {  # nvmlClocksEventReason* bit values (nvml.h)
    0x4: "sw_power_cap", 0x8: "hw_slowdown", 0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown", 0x80: "hw_power_brake_slowdown",
}


@dataclass(frozen=True)
class GpuWatch:
    gpu: int
    max_temp_c: float | None = None
    clock_events: tuple[str, ...] = ()      # reasons seen active at any sample
    ecc_corrected: float | None = None      # increase during the run (volatile)
    ecc_uncorrected: float | None = None
    xids: tuple[int, ...] = ()              # XID codes seen during the run


@dataclass(frozen=True)
class WatchReport:
    source: str
    available: bool
    reason: str = ""
    samples: int = 0
    gpus: tuple[GpuWatch, ...] = ()

    def gpu(self, index: int) -> GpuWatch | None:
        return next((g for g in self.gpus if g.gpu == index), None)


class Watcher(Protocol):
    def start(self) -> None: ...
    def stop(self) -> WatchReport: ...


class NullWatcher:
    def __init__(self, reason: str = "telemetry watching is off") -> None:
        self.reason = reason

    def start(self) -> None:
        pass

    def stop(self) -> WatchReport:
        return WatchReport("none", False, self.reason)


@dataclass
class _Acc:
    """Mutable per-GPU accumulator, private to the sampling thread until stop() joins it."""

    max_temp: float | None = None
    events: set[str] = field(default_factory=set)
    ecc_first: dict[str, float] = field(default_factory=dict)
    ecc_last: dict[str, float] = field(default_factory=dict)
    xids: list[int] = field(default_factory=list)

    def temp(self, t: float) -> None:
        self.max_temp = t if self.max_temp is None else max(self.max_temp, t)

    def ecc(self, kind: str, v: float) -> None:
        self.ecc_first.setdefault(kind, v)
        self.ecc_last[kind] = v

    def freeze(self, gpu: int) -> GpuWatch:
        def inc(k: str) -> float | None:
            return self.ecc_last[k] - self.ecc_first[k] if k in self.ecc_first else None
        return GpuWatch(gpu, self.max_temp, tuple(sorted(self.events)), inc("corrected"), inc("uncorrected"),
                        tuple(dict.fromkeys(self.xids)))


class _Sampler:
    """Runs `sample()` every `interval` seconds in a daemon thread until stopped."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.samples = 0
        self.error = ""

    def _loop(self) -> None:
        while True:
            try:
                self.sample()
                self.samples += 1
            except Exception as e:  # noqa: BLE001 - a failing source must not kill the burn-in
                self.error = f"{type(e).__name__}: {e}"
            if self._stop.wait(self.interval):
                break
        try:
            self.sample()   # a last look after the load stops: XIDs logged at the very end
            self.samples += 1
        except Exception:  # noqa: BLE001
            pass

    def sample(self) -> None:
        raise NotImplementedError

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name=type(self).__name__, daemon=True)
        self._thread.start()

    def _join(self, timeout: float) -> bool:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            return not self._thread.is_alive()
        return True


class MetricsWatcher(_Sampler):
    """Samples a podhealth agent's /metrics (Prometheus text) for the GPUs under test."""

    def __init__(self, url: str, gpus: Sequence[int], interval: float = 2.0, timeout: float = 3.0) -> None:
        super().__init__(interval)
        self.url, self.timeout = url, timeout
        self.gpus = list(gpus)
        self.acc = {g: _Acc() for g in self.gpus}
        self._xid_first: dict[tuple[int, int], float] = {}

    def sample(self) -> None:
        from prometheus_client.parser import text_string_to_metric_families

        from podhealth import httpclient

        r = httpclient.exchange("GET", self.url, deadline_s=self.timeout, max_bytes=8 * 1024 * 1024)
        if r.status != 200:
            raise httpclient.ExchangeError(f"{self.url} answered HTTP {r.status}")
        text = r.body.decode("utf-8", "replace")
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                try:
                    gpu = int(s.labels.get("gpu", ""))
                except ValueError:
                    continue
                acc = self.acc.get(gpu)
                if acc is None:
                    continue
                if s.name == "podhealth_gpu_temperature_celsius":
                    acc.temp(s.value)
                elif s.name == "podhealth_gpu_clocks_event_active" and s.value >= 1:
                    acc.events.add(s.labels.get("reason", ""))
                elif s.name == "podhealth_gpu_ecc_errors_total" and s.labels.get("scope") == "volatile":
                    acc.ecc(s.labels.get("type", ""), s.value)
                elif s.name == "podhealth_xid_events_total":
                    try:
                        code = int(s.labels.get("code", ""))
                    except ValueError:
                        continue
                    # A series that first appears mid-run started from zero.
                    first = self._xid_first.setdefault((gpu, code), s.value if self.samples == 0 else 0.0)
                    if s.value > first and code not in acc.xids:
                        acc.xids.append(code)

    def stop(self) -> WatchReport:
        self._join(self.timeout + 1)
        ok = self.samples > 0
        return WatchReport(f"metrics:{self.url}", ok, "" if ok else (self.error or "no sample"),
                           self.samples, tuple(self.acc[g].freeze(g) for g in self.gpus))


class NvmlWatcher(_Sampler):
    """Samples NVML directly. Tolerates no GPU, no driver, and functions a driver lacks."""

    def __init__(self, gpus: Sequence[int], interval: float = 1.0,
                 nvml: Callable[[], object] | None = None) -> None:
        super().__init__(interval)
        self.gpus = list(gpus)
        self.acc = {g: _Acc() for g in self.gpus}
        self._nvml_factory = nvml
        self._nv: object = None
        self._handles: dict[int, object] = {}
        self._events: object = None
        self.unavailable = ""

    def start(self) -> None:
        try:
            nv = self._nvml_factory() if self._nvml_factory else __import__("pynvml")
            nv.nvmlInit()  # type: ignore[attr-defined]
            self._nv = nv
            for g in self.gpus:
                self._handles[g] = nv.nvmlDeviceGetHandleByIndex(g)  # type: ignore[attr-defined]
        except Exception as e:  # noqa: BLE001 - no GPU / no driver: report, do not fail the burn-in
            self.unavailable = f"NVML unavailable: {type(e).__name__}: {e}"
            return
        try:
            es = nv.nvmlEventSetCreate()  # type: ignore[attr-defined]
            for h in self._handles.values():
                nv.nvmlDeviceRegisterEvents(h, nv.nvmlEventTypeXidCriticalError, es)  # type: ignore[attr-defined]
            self._events = es
        except Exception:  # noqa: BLE001 - XID events need root on some drivers; the rest still works
            self._events = None
        super().start()

    def sample(self) -> None:
        nv = self._nv
        for g, h in self._handles.items():
            acc = self.acc[g]
            try:
                acc.temp(float(nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)))  # type: ignore[attr-defined]
            except Exception:  # noqa: BLE001
                pass
            try:
                get = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
                    getattr(nv, "nvmlDeviceGetCurrentClocksThrottleReasons")
                bits = int(get(h))
                acc.events.update(name for bit, name in _NVML_REASON_BITS.items() if bits & bit)
            except Exception:  # noqa: BLE001
                pass
            for kind, et in (("corrected", "NVML_MEMORY_ERROR_TYPE_CORRECTED"),
                             ("uncorrected", "NVML_MEMORY_ERROR_TYPE_UNCORRECTED")):
                try:
                    acc.ecc(kind, float(nv.nvmlDeviceGetTotalEccErrors(h, getattr(nv, et), nv.NVML_VOLATILE_ECC)))  # type: ignore[attr-defined]
                except Exception:  # noqa: BLE001 - ECC off or unsupported: the field stays absent
                    pass
        if self._events is not None:
            self._drain_xids(nv)

    def _drain_xids(self, nv: object) -> None:
        index_of = {}
        for g, h in self._handles.items():
            try:
                index_of[nv.nvmlDeviceGetIndex(h)] = g  # type: ignore[attr-defined]
            except Exception:  # noqa: BLE001
                index_of[g] = g
        for _ in range(64):
            try:
                data = nv.nvmlEventSetWait_v2(self._events, 0)  # type: ignore[attr-defined]
            except Exception:  # noqa: BLE001 - NVML_ERROR_TIMEOUT: no event pending
                return
            try:
                g = index_of.get(nv.nvmlDeviceGetIndex(data.device), -1)  # type: ignore[attr-defined]
            except Exception:  # noqa: BLE001
                g = -1
            if g in self.acc:
                self.acc[g].xids.append(int(data.eventData))  # type: ignore[attr-defined]

    def stop(self) -> WatchReport:
        if self.unavailable:
            return WatchReport("nvml", False, self.unavailable)
        if not self._join(5.0):
            return WatchReport("nvml", False, "NVML sampling hung", self.samples)
        try:
            if self._events is not None:
                self._nv.nvmlEventSetFree(self._events)  # type: ignore[attr-defined]
            self._nv.nvmlShutdown()  # type: ignore[attr-defined]
        except Exception:  # noqa: BLE001
            pass
        ok = self.samples > 0
        return WatchReport("nvml", ok, "" if ok else (self.error or "no sample"), self.samples,
                           tuple(self.acc[g].freeze(g) for g in self.gpus))

