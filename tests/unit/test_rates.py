"""Counter history: rates and increases over the window, resets, and bounded memory."""

from __future__ import annotations

import pytest

from podhealth.checks.passive.rates import RateTracker


def test_rate_and_increase_over_the_window() -> None:
    r = RateTracker(window=300.0)
    for t in range(0, 301, 10):
        r.observe("k", float(t), t * 2.0)
    assert r.increase("k", 300.0) == pytest.approx(600.0)
    assert r.rate("k", 300.0, per=3600.0) == pytest.approx(7200.0)


def test_history_is_bounded_but_keeps_the_window_ends() -> None:
    r = RateTracker(window=300.0, max_points=32)
    for i in range(3000):  # one point every 0.1 s for 300 s
        r.observe("k", i * 0.1, float(i))
    h = r.points()["k"]
    assert len(h) <= 32
    assert h[-1][1] == 2999.0 and h[-1][0] == pytest.approx(299.9)
    assert h[0][0] <= 299.9 - 280  # the oldest point still spans (almost) the whole window
    assert r.rate("k", 299.9) == pytest.approx(10.0, rel=0.01)


def test_counter_reset_starts_a_new_history() -> None:
    r = RateTracker(window=300.0)
    r.observe("k", 0.0, 100.0)
    r.observe("k", 10.0, 200.0)
    r.observe("k", 20.0, 5.0)  # driver reload: the counter went back
    assert r.increase("k", 20.0) is None
    r.observe("k", 30.0, 15.0)
    assert r.increase("k", 30.0) == 10.0
