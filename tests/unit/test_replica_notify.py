"""A follower hands a FAIL to the leader at once: LISTEN/NOTIFY wakes the leader's read-back
(issue 32 §2). The periodic read-back is set to ten minutes here, so a fence can only come from
the notify; the tests wait for the fence state, never for a time. A LISTEN connection that is
lost is opened again (the one backoff), and a follower's FAIL is then handed over as before.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, AsyncIterator

import aiohttp
import pytest

from podhealth.aggregator import service
from podhealth.aggregator.service import Aggregator
from podhealth.config_aggregator import CapsConfig, RetryConfig, StoreConfig
from tests.harness.agg import MemFencer, config, running
from tests.harness.pg import pg_fixture
from tests.unit.test_aggregator_service import fail_report, until

pytestmark = pytest.mark.timeout(90)
pg = pg_fixture()
LEASE = 2.0
LONG = 600.0


@contextlib.asynccontextmanager
async def leader_and_follower(tmp_path: Path, url: str, fencer: MemFencer
                              ) -> AsyncIterator[tuple[Aggregator, str, Aggregator, str]]:
    cfg = config(tmp_path, nodes=6, store=StoreConfig(url=url, lease=LEASE),
                 caps=CapsConfig(max_percent_per_partition=100.0), retries=RetryConfig(backoff=0.1))
    async with contextlib.AsyncExitStack() as stack:
        lead, lurl = await stack.enter_async_context(running(cfg, [fencer]))
        await until(lambda: lead.acting() and lead.listener is not None and lead.listener.connects > 0,
                    timeout=3 * LEASE + 5)
        follower, furl = await stack.enter_async_context(running(cfg, [fencer]))
        assert not follower.acting()
        yield lead, lurl, follower, furl


async def post(http: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> None:
    async with http.post(f"{url}/v1/reports", json=body) as r:
        assert r.status == 200, await r.text()


async def test_a_fail_ingested_by_a_follower_is_fenced_without_waiting_for_the_sync(
        tmp_path: Path, pg: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(service, "SYNC_INTERVAL", LONG)
    fencer = MemFencer()
    async with leader_and_follower(tmp_path, pg.new_database(), fencer) as (lead, lurl, follower, furl), \
            aiohttp.ClientSession() as http:
        await post(http, lurl, {**fail_report("dgx03", 10, "OK"), "boot_id": "b", "seq": 10})
        await post(http, furl, {**fail_report("dgx03", 11), "boot_id": "b", "seq": 11})
        await until(lambda: "dgx03" in fencer.fenced and not lead.pending, timeout=20)
        assert lead.listener.notifies >= 1 and fencer.count("fence", "dgx03") == 1
        # an OK (nothing to act on) sends no notify
        seen = lead.listener.notifies
        await post(http, furl, {**fail_report("dgx04", 12, "OK"), "boot_id": "c", "seq": 1})
        await post(http, furl, {**fail_report("dgx05", 13), "boot_id": "d", "seq": 1})
        await until(lambda: "dgx05" in fencer.fenced and not lead.pending, timeout=20)
        assert lead.listener.notifies == seen + 1


async def test_a_lost_listen_connection_is_opened_again_and_hands_over_as_before(
        tmp_path: Path, pg: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import psycopg

    monkeypatch.setattr(service, "SYNC_INTERVAL", LONG)
    fencer = MemFencer()
    url = pg.new_database()
    async with leader_and_follower(tmp_path, url, fencer) as (lead, lurl, follower, furl), \
            aiohttp.ClientSession() as http:
        listener = lead.listener
        pid = listener.backend_pid
        assert pid is not None
        with psycopg.connect(url, autocommit=True) as admin:
            assert admin.execute("SELECT pg_terminate_backend(%s)", (pid,)).fetchone()[0]
        await until(lambda: listener.connects >= 2 and listener.backend_pid not in (None, pid), timeout=20)
        assert lead.acting()
        await post(http, furl, fail_report("dgx02", 20))
        await until(lambda: "dgx02" in fencer.fenced and not lead.pending, timeout=20)
