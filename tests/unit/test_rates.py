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


@pytest.mark.parametrize("seed", range(40))
def test_observe_many_keeps_the_histories_observe_keeps(seed: int) -> None:
    """The evaluation feeds all counters at once (observe_many): the same points, resets and
    forgetting as one observe() per counter, through resets, spacing, eviction and sweeps."""
    import random

    rnd = random.Random(seed)
    args = (rnd.choice([5.0, 30.0, 300.0]), rnd.choice([2, 3, 5, 32]), rnd.choice([3, 10, 1000]),
            rnd.choice([None, 0.0, 7.0]))
    one, many = RateTracker(*args), RateTracker(*args)
    t, values = 0.0, dict[int, float]()
    for _ in range(80):
        t += rnd.choice([0.0, 0.5, 1.0, 3.0, 10.0, 100.0])
        items = []
        for k in rnd.sample(range(15), rnd.randint(0, 15)):
            v = values.get(k, 0.0) + rnd.choice([0, 0, 0, 1, 5]) if rnd.random() > 0.05 else 0.0
            values[k] = v
            items.append((k, v))
        for k, v in items:
            one.observe(k, t, v)
        many.observe_many(items, t)
        assert many.points() == one.points()
        assert [many.reset_at(k) for k in range(15)] == [one.reset_at(k) for k in range(15)]
        assert many.forgotten == one.forgotten
        assert [many.rate(k, t) for k in range(15)] == [one.rate(k, t) for k in range(15)]
