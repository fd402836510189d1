"""agent/failslow_passive.py: what the collectors saw between two probe rounds."""

from __future__ import annotations

import pytest

from podhealth.agent.failslow_passive import PassiveWindow
from podhealth.snapshot import CollectorState, Snapshot
from podhealth.vocab import Sample

T0 = 1_800_000_000.0


def snap(t: float, *, clock: float = 1.98e9, util: float = 0.9, thermal: int = 0, temp: float = 60.0,
         replay: float = 0.0, ecc: float = 0.0, symbol: float = 0.0) -> Snapshot:
    g = "0"
    s = [Sample.of("gpu_sm_clock_hertz", clock, gpu=g), Sample.of("gpu_sm_clock_max_hertz", 1.98e9, gpu=g),
         Sample.of("gpu_utilization_ratio", util, gpu=g), Sample.of("gpu_temperature_celsius", temp, gpu=g),
         Sample.of("gpu_clocks_event_active", thermal, gpu=g, reason="hw_thermal_slowdown"),
         Sample.of("gpu_clocks_event_active", 1, gpu=g, reason="gpu_idle"),
         Sample.of("gpu_pcie_replay", replay, gpu=g),
         Sample.of("gpu_ecc_errors", ecc, gpu=g, type="corrected", scope="volatile"),
         Sample.of("gpu_ecc_errors", 99, gpu=g, type="corrected", scope="aggregate"),
         Sample.of("infiniband_port_stat", symbol, device="mlx5_0", port="1", counter="symbol_error")]
    return Snapshot(t, {"nvml": CollectorState("nvml", samples=tuple(s))})


def test_a_window_of_a_throttled_gpu() -> None:
    w = PassiveWindow(temp_limit_c=90.0)
    w.feed(snap(T0))
    # one hour, every 60 s: throttled (and at half clock) for the second half hour
    for i in range(1, 61):
        hot = i > 30
        w.feed(snap(T0 + 60 * i, clock=0.99e9 if hot else 1.98e9, thermal=int(hot), temp=88 if hot else 70,
                    replay=2 * i, ecc=i // 10, symbol=i))
    got = {(e, s): v for e, s, v in w.take()}
    assert got[("gpu0", "throttle_thermal_s")] == 1800.0
    assert got[("gpu0", "throttle_power_s")] == 0.0  # read, never held: a real 0
    assert got[("gpu0", "clock_residency")] == pytest.approx(0.5)
    assert got[("gpu0", "temp_margin_c")] == 2.0
    assert got[("gpu0", "pcie_replay_per_h")] == pytest.approx(120.0)
    assert got[("gpu0", "ecc_corrected_per_h")] == pytest.approx(6.0)  # volatile only
    assert got[("mlx5_0", "ib_symbol_errors_per_h")] == pytest.approx(60.0)
    # the next window starts afresh from the last snapshot
    w.feed(snap(T0 + 3660, replay=123, symbol=60))
    again = {(e, s): v for e, s, v in w.take()}
    assert again[("gpu0", "throttle_thermal_s")] == 0.0
    assert again[("gpu0", "pcie_replay_per_h")] == pytest.approx(180.0)  # 3 more in 60 s
    assert again[("mlx5_0", "ib_symbol_errors_per_h")] == pytest.approx(0.0)


def test_counter_reset_counts_from_the_new_value_and_old_snapshots_are_ignored() -> None:
    w = PassiveWindow(temp_limit_c=90.0)
    w.feed(snap(T0, replay=500))
    w.feed(snap(T0 + 1800, replay=520))
    w.feed(snap(T0 + 900, replay=9999))  # an older snapshot finishing late
    w.feed(snap(T0 + 3600, replay=10))  # driver reload: the counter restarted
    got = {(e, s): v for e, s, v in w.take()}
    assert got[("gpu0", "pcie_replay_per_h")] == pytest.approx(30.0)


def test_nothing_read_means_nothing_said() -> None:
    w = PassiveWindow(temp_limit_c=90.0)
    assert w.take() == []
    w.feed(Snapshot(T0, {}))
    w.feed(Snapshot(T0 + 60, {}))
    assert w.take() == []
