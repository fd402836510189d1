"""What the collectors saw between two fail-slow probe rounds, summarised per GPU and per HCA.

The probes say how fast a part is when asked; these say how it lived since the last round:
- `throttle_<why>_s`: seconds a clock-event reason held the GPU's clocks down (thermal, power,
  hw_slowdown), summed over the snapshots' intervals;
- `clock_residency`: of the time the GPU was busy (NVML utilisation > 5%), the share its SM clock
  was within 5% of its maximum;
- `pcie_replay_per_h`, `ecc_corrected_per_h`: the GPU's PCIe replay and volatile corrected ECC
  counters' increase per hour;
- `temp_margin_c`: the least margin between the GPU's temperature and the profile's
  `gpu_temp_fail_c` (NVML's own T.Limit margin is not read by the collectors yet);
- `ib_symbol_errors_per_h`, `ib_link_recovery_per_h` per HCA: the port counters' increase per hour.

`PassiveWindow` is fed every snapshot and `take()`n at each probe round (then starts afresh). Pure
arithmetic over the samples; a counter that goes back (a driver reload, a counter reset) counts
from its new value. A signal with no reading in the window is left out, never 0.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from podhealth.snapshot import Snapshot

REASONS = {"hw_thermal_slowdown": "thermal", "sw_thermal_slowdown": "thermal", "sw_power_cap": "power",
           "hw_power_brake_slowdown": "power", "hw_slowdown": "hw_slowdown"}
BUSY = 0.05
NEAR_MAX = 0.95
IB_COUNTERS = {"symbol_error": "ib_symbol_errors_per_h", "link_error_recovery": "ib_link_recovery_per_h"}


@dataclass
class _Counter:
    first_t: float
    total: float = 0.0
    last: float | None = None
    last_t: float = 0.0

    def add(self, value: float, t: float) -> None:
        if self.last is not None:
            self.total += value - self.last if value >= self.last else value  # reset: count from the new value
        self.last, self.last_t = value, t

    def per_hour(self) -> float | None:
        span = self.last_t - self.first_t
        return self.total / span * 3600.0 if span > 0 else None


@dataclass
class PassiveWindow:
    temp_limit_c: float
    started: float | None = None
    last_t: float | None = None
    throttle: dict[tuple[str, str], float] = field(default_factory=dict)  # (gpu, why) -> seconds
    reasons_read: set[str] = field(default_factory=set)  # GPUs whose clock-event reasons were read
    busy: dict[str, float] = field(default_factory=dict)
    near_max: dict[str, float] = field(default_factory=dict)
    margin: dict[str, float] = field(default_factory=dict)
    counters: dict[tuple[str, str], _Counter] = field(default_factory=dict)  # (entity, signal)

    def feed(self, snap: Snapshot) -> None:
        t = snap.time
        if self.last_t is not None and t <= self.last_t:
            return  # an older snapshot finishing late adds nothing
        dt = 0.0 if self.last_t is None else t - self.last_t
        self.started = t if self.started is None else self.started
        self.last_t = t
        util: dict[str, float] = {s.label("gpu"): s.value for s in snap.samples("gpu_utilization_ratio")}
        top: dict[str, float] = {s.label("gpu"): s.value for s in snap.samples("gpu_sm_clock_max_hertz")}
        for s in snap.samples("gpu_sm_clock_hertz"):
            g = s.label("gpu")
            if util.get(g, 0.0) > BUSY and top.get(g):
                self.busy[g] = self.busy.get(g, 0.0) + dt
                if s.value >= NEAR_MAX * top[g]:
                    self.near_max[g] = self.near_max.get(g, 0.0) + dt
        held: set[tuple[str, str]] = set()
        for s in snap.samples("gpu_clocks_event_active"):
            if dt:
                self.reasons_read.add(s.label("gpu"))
            why = REASONS.get(s.label("reason"))
            if why and s.value:
                held.add((s.label("gpu"), why))
        for key in held:
            self.throttle[key] = self.throttle.get(key, 0.0) + dt
        for s in snap.samples("gpu_temperature_celsius"):
            g = s.label("gpu")
            m = self.temp_limit_c - s.value
            self.margin[g] = min(self.margin.get(g, m), m)
        for s in snap.samples("gpu_pcie_replay"):
            self._count(f"gpu{s.label('gpu')}", "pcie_replay_per_h", s.value, t)
        for s in snap.samples("gpu_ecc_errors"):
            if s.label("type") == "corrected" and s.label("scope") == "volatile":
                self._count(f"gpu{s.label('gpu')}", "ecc_corrected_per_h", s.value, t)
        for s in snap.samples("infiniband_port_stat"):
            signal = IB_COUNTERS.get(s.label("counter"))
            if signal:
                self._count(s.label("device"), signal, s.value, t)

    def _count(self, entity: str, signal: str, value: float, t: float) -> None:
        c = self.counters.get((entity, signal))
        if c is None:
            c = self.counters[(entity, signal)] = _Counter(first_t=t)
        c.add(value, t)

    def summary(self) -> list[tuple[str, str, float]]:
        """(entity, signal, value) for the window so far."""
        out: list[tuple[str, str, float]] = []
        gpus = sorted(set(self.busy) | set(self.margin) | self.reasons_read, key=_index)
        for g in gpus:
            ent = f"gpu{g}"
            for why in ("thermal", "power", "hw_slowdown"):
                if g in self.reasons_read:
                    out.append((ent, f"throttle_{why}_s", round(self.throttle.get((g, why), 0.0), 1)))
            if self.busy.get(g):
                out.append((ent, "clock_residency", round(self.near_max.get(g, 0.0) / self.busy[g], 4)))
            if g in self.margin:
                out.append((ent, "temp_margin_c", self.margin[g]))
        for (entity, signal), c in sorted(self.counters.items()):
            rate = c.per_hour()
            if rate is not None:
                out.append((entity, signal, round(rate, 3)))
        return out

    def take(self) -> list[tuple[str, str, float]]:
        """The summary, and a fresh window from the last snapshot on."""
        out = self.summary()
        self.started, self.throttle, self.busy, self.near_max, self.margin = self.last_t, {}, {}, {}, {}
        self.reasons_read = set()
        for c in self.counters.values():
            c.first_t, c.total = c.last_t, 0.0
        return out


def _index(g: str) -> int:
    return int(g) if g.isdigit() else 10_000
