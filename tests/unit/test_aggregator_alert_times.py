"""An Alertmanager webhook's startsAt/endsAt are claims; the aggregator's clock is the judge.

A startsAt ahead of the receive time is the receive time (and beyond max_clock_skew counted as a
clock running ahead); one that is not a time is a 400 naming the alert and the field, and the
webhook changes nothing. Pure parsing first, then a real aggregator on a loopback port.
"""

from __future__ import annotations

import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from podhealth.aggregator import ingest
from podhealth.config_aggregator import AggAuthConfig
from tests.harness.agg import MemFencer, config, running

pytestmark = pytest.mark.timeout(60)
AUTH = AggAuthConfig(cluster_token="ctok", admin_token="atok")
NOW = 1_800_000_000.0


def rfc3339(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f") + "123Z"  # nanoseconds, as sent


def alert(node: str = "dgx01", **kw: Any) -> dict[str, Any]:
    return {"status": "firing", "labels": {"alertname": "PodhealthGpuFallenOffBus", "node": node,
                                           "severity": "critical", "gpu": "5"}, **kw}


def parse(*alerts: dict[str, Any], now: float = NOW) -> list[ingest.AlertObservation]:
    return ingest.parse_alertmanager({"alerts": list(alerts)}, now, ingest.parse_rfc3339)


def test_a_start_ahead_of_the_receiver_is_the_receive_time() -> None:
    for ahead in (3600.0 * 24 * 365, 31.0, 5.0):
        [a] = parse(alert(startsAt=rfc3339(NOW + ahead)))
        assert a.time == a.verdict.since == NOW, ahead
        assert a.claim == pytest.approx(NOW + ahead)  # kept, to be counted when beyond the skew
    [a] = parse(alert(startsAt=rfc3339(NOW - 600)))  # one that started before it arrived: as sent
    assert a.time == a.verdict.since == pytest.approx(NOW - 600)


@pytest.mark.parametrize("fields", [{}, {"startsAt": ""}, {"startsAt": None},
                                    {"startsAt": "0001-01-01T00:00:00Z", "endsAt": "0001-01-01T00:00:00Z"}])
def test_no_start_is_the_receive_time(fields: dict[str, Any]) -> None:
    [a] = parse(alert(**fields))
    assert a.time == a.claim == NOW


@pytest.mark.parametrize(("field", "value"), [
    ("startsAt", "yesterday"), ("startsAt", 1_700_000_000), ("startsAt", "2026-13-01T00:00:00Z"),
    ("startsAt", ["2026-12-01T00:00:00Z"]), ("endsAt", "soon"), ("endsAt", 0), ("startsAt", "2" * 100)])
def test_a_time_that_is_not_one_is_a_bad_request_naming_the_alert_and_field(field: str, value: Any) -> None:
    good = alert(startsAt=rfc3339(NOW - 60))
    with pytest.raises(ingest.BadRequest, match=rf"^alerts\[1\]\.{field}: expected an RFC 3339 time"):
        parse(good, {**alert(node="dgx02"), field: value})


def test_a_bad_time_on_an_alert_about_no_node_is_ignored_with_the_alert() -> None:
    other = {"status": "firing", "labels": {"alertname": "Else", "instance": "x"}, "startsAt": "never"}
    assert parse(other) == []


async def _post(s: aiohttp.ClientSession, url: str, body: Any) -> tuple[int, Any]:
    async with s.post(f"{url}/v1/alertmanager", json=body, headers={"Authorization": "Bearer ctok"}) as r:
        return r.status, await r.json()


def _clock_ahead(agg: Any) -> float:
    return float(agg.metrics.clock_ahead._value.get())


async def test_the_webhook_times_alerts_by_the_receivers_clock(tmp_path: Path) -> None:
    async with running(config(tmp_path, auth=AUTH), [MemFencer()]) as (agg, url), aiohttp.ClientSession() as s:
        skew = agg.cfg.max_clock_skew
        t0 = time.time()
        far = {"alerts": [alert("dgx01", startsAt=rfc3339(t0 + 86400)),  # a day ahead: its arrival, counted
                          alert("dgx02", startsAt=rfc3339(t0 + skew / 3)),  # within the skew: its arrival
                          alert("dgx03", startsAt=rfc3339(t0 - 600))]}  # started before: as sent
        st, out = await _post(s, url, far)
        t1 = time.time()
        assert st == 200 and out["applied"] == 3, out
        [c1], [c2], [c3] = (agg.mem.conditions_of(n) for n in ("dgx01", "dgx02", "dgx03"))
        assert t0 <= c1.since <= t1 and t0 <= c2.since <= t1
        assert c3.since == pytest.approx(t0 - 600, abs=0.01)
        assert _clock_ahead(agg) == 1
        assert agg.mem.nodes["dgx01"].clock_ahead == 0  # Alertmanager's clock, not the node's


async def test_a_webhook_with_a_bad_time_is_a_400_and_changes_nothing(tmp_path: Path) -> None:
    async with running(config(tmp_path, auth=AUTH), [MemFencer()]) as (agg, url), aiohttp.ClientSession() as s:
        before = agg.store.counts() if agg.store else None
        body = {"alerts": [alert("dgx01", startsAt=rfc3339(time.time() - 60)),
                           alert("dgx02", startsAt="2026-12-01 25:00", endsAt="0001-01-01T00:00:00Z")]}
        st, out = await _post(s, url, body)
        assert st == 400 and out["error"].startswith("alerts[1].startsAt: expected an RFC 3339 time"), out
        assert agg.mem.conditions_of("dgx01") == [] and agg.mem.conditions_of("dgx02") == []
        assert agg.store is not None and agg.store.counts() == before
        assert agg.metrics.ingest_requests.labels("alertmanager", "bad_request")._value.get() == 1


@pytest.mark.parametrize(("text", "utc"), [
    ("2026-12-01T10:20:30.123456789+02:00", "2026-12-01T08:20:30.123456+00:00"),
    ("2026-12-01T10:20:30.5-05:00", "2026-12-01T15:20:30.5+00:00"),
    ("2026-12-01T10:20:30-05:00", "2026-12-01T15:20:30+00:00"),
    ("2026-12-01T10:20:30.123Z", "2026-12-01T10:20:30.123+00:00"),
    ("2026-12-01 10:20:30z", "2026-12-01T10:20:30+00:00")])
def test_a_start_with_a_fraction_keeps_its_offset(text: str, utc: str) -> None:
    """The fraction's digits were read together with the offset's: "...30.5-05:00" was 10:20:30.505
    UTC, five hours before it was sent, so the alert had already outlasted any rule's min_duration."""
    assert ingest.parse_rfc3339(text) == pytest.approx(datetime.fromisoformat(utc).timestamp())


@pytest.mark.parametrize("text", ["2026-12-01", "2026-W48-2", "2026-12-01T10:20:30", "2026-12-01T10:20:30.5ZZZ",
                                  "2026-12-01T10:20:30.Z", "\uff12\uff10\uff12\uff16-12-01T10:20:30Z"])
def test_what_rfc_3339_does_not_write_is_not_a_time(text: str) -> None:
    assert ingest.parse_rfc3339(text) is None
