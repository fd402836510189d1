"""A replica's clock is the database's, carried by the monotonic clock (aggregator/dbclock.py)."""

from __future__ import annotations

from podhealth.aggregator.dbclock import DbClock


def test_the_wall_clock_only_until_the_first_reading_then_the_database_s_whatever_the_wall_says() -> None:
    mono = [100.0]
    wall = [5000.0]
    c = DbClock(lambda: wall[0], lambda: mono[0])
    assert c() == 5000.0 and not c.anchored
    c.sample(1_000_000.0, 99.9, 100.1)  # the server read its clock at about mono 100.0
    assert c.anchored and abs(c() - 1_000_000.0) < 1e-6
    wall[0] = 1.0  # the replica's wall clock steps: nothing follows it
    mono[0] = 130.0
    assert abs(c() - 1_000_030.0) < 1e-6


def test_a_slow_round_trip_does_not_replace_a_good_reading() -> None:
    mono = [0.0]
    c = DbClock(lambda: 0.0, lambda: mono[0])
    c.sample(1000.0, 0.0, 0.02)
    c.sample(1003.0, 0.0, 4.0)  # 4 s round trip: when in it the server read its clock is unknown
    assert abs(c.offset - (1000.0 - 0.01)) < 1e-9  # type: ignore[operator]
    c.sample(1010.0, 9.99, 10.01)
    assert abs(c.offset - 1000.0) < 1e-9  # type: ignore[operator]
