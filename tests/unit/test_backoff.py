"""core/backoff.py: the one backoff (publisher, InfluxDB export, the aggregator's retries)."""

from __future__ import annotations

import pytest

from podhealth.backoff import Backoff


@pytest.mark.parametrize(("first", "cap", "n", "want"), [
    (0.5, 60.0, 0, 0.5), (0.5, 60.0, 1, 1.0), (0.5, 60.0, 3, 4.0), (0.5, 60.0, 7, 60.0),
    (1.0, 60.0, 10_000, 60.0),  # a long run of failures stays at the cap (and builds no huge float)
    (0.2, 30.0, -1, 0.2), (0.0, 5.0, 4, 0.0),
])
def test_doubles_up_to_the_cap(first: float, cap: float, n: int, want: float) -> None:
    assert Backoff(first, cap).delay(n) == want


@pytest.mark.parametrize(("r", "want"), [(0.0, 2.0), (0.5, 4.0), (0.999, 5.996)])
def test_jitter_spreads_over_half_to_one_and_a_half_after_the_cap(r: float, want: float) -> None:
    assert Backoff(1.0, 4.0, jitter=True).delay(5, rand=lambda: r) == pytest.approx(want)


def test_negative_waits_are_refused() -> None:
    with pytest.raises(ValueError, match="backoff"):
        Backoff(-1.0, 5.0)


def test_the_aggregator_retry_policy_is_this_backoff() -> None:
    from podhealth.aggregator.actions import delay
    from podhealth.config_aggregator import RetryConfig

    r = RetryConfig(backoff=0.5, max_backoff=60.0)
    assert [delay(r, n) for n in range(9)] == [Backoff(0.5, 60.0).delay(n) for n in range(9)] == \
        [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 60.0, 60.0]
