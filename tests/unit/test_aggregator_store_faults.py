"""Faults of the state store said out loud, state never stuck.

- A full database at runtime: the report is refused (503, an honest reason), memory is as it
  was, /healthz says the store cannot write; the resend after space is back is applied.
- A fence whose pending record cannot be written leaves the node as it was (never `fencing`
  with no action), and an operator fence answers 503; both work once the store writes again.
- A corrupt, locked-by-another-aggregator or read-only database at start-up: one line, exit 2.

"Full" is SQLite's own SQLITE_FULL, made by `PRAGMA max_page_count` on the writer's connection;
a failing action record is a TEMP trigger on `actions` (no code of the store is patched).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import aiohttp
import pytest

from podhealth.aggregator.lease import FileLease, LeaseHeld
from podhealth.aggregator.model import FenceMode
from podhealth.aggregator.service import Aggregator, OperatorError
from podhealth.aggregator.store import NodeRow, Store, StoreError
from podhealth.vocab import Status
from tests.harness.agg import MemFencer, config, running
from tests.harness.proc import free_port, http_get, wait_until

pytestmark = pytest.mark.timeout(90)


def _report(node: str, t: float, status: str, padding: int = 0) -> dict[str, Any]:
    """`padding` OK results make the stored report bigger than any page the store has free."""
    return {"node": node, "time": t, "results": [
        {"check": "xid", "entity": "GPU0", "status": status, "action": "RESET_GPU" if status != "OK" else "NONE",
         "summary": "x" * 400}] + [{"check": "pad", "entity": f"e{i}", "status": "OK", "summary": "p" * 400}
                                   for i in range(padding)]}


async def until(pred: Any, timeout: float = 15.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not pred():
        if loop.time() > deadline:
            raise AssertionError("timed out")
        await asyncio.sleep(0.02)


async def _full(agg: Aggregator, full: bool) -> None:
    """Cap the database at its current size (SQLITE_FULL on growth), or lift the cap."""
    assert agg.writer is not None

    def cap(s: Store) -> None:
        pages = s.conn.execute("PRAGMA page_count").fetchone()[0]
        s.conn.execute(f"PRAGMA max_page_count = {pages if full else 1 << 30}")
    await agg.writer.call(cap)


async def _healthz(s: aiohttp.ClientSession, url: str) -> tuple[int, dict[str, Any]]:
    async with s.get(f"{url}/healthz") as r:
        return r.status, await r.json()


async def test_a_full_database_refuses_the_report_and_memory_stays_as_it_was(tmp_path: Path) -> None:
    fencer = MemFencer()
    async with running(config(tmp_path), [fencer]) as (agg, url), aiohttp.ClientSession() as s:
        async with s.post(f"{url}/v1/reports", json=_report("dgx01", 10, "OK")) as r:
            assert r.status == 200
        assert (await _healthz(s, url))[0] == 200
        await _full(agg, True)
        async with s.post(f"{url}/v1/reports", json=_report("dgx01", 20, "FAIL", padding=100)) as r:
            status, body = r.status, await r.json()
        assert status == 503, body
        assert "full" in body["error"] and "nothing was applied" in body["error"]
        assert agg.mem is not None
        rec = agg.mem.nodes["dgx01"]
        assert rec.status is Status.OK and not agg.mem.conditions_of("dgx01")
        code, hz = await _healthz(s, url)
        assert code == 503 and hz["status"] == "store_failing" and "full" in hz["error"]
        assert fencer.count("fence") == 0 and rec.fence is FenceMode.NONE
        await _full(agg, False)
        async with s.post(f"{url}/v1/reports", json=_report("dgx01", 21, "FAIL", padding=100)) as r:
            assert r.status == 200 and (await r.json())["applied"] == 1  # the resend is applied, not "unchanged"
        await until(lambda: "dgx01" in fencer.fenced and not agg.pending)
        assert (await _healthz(s, url))[0] == 200


async def _refuse_actions(agg: Aggregator, on: bool) -> None:
    assert agg.writer is not None

    def trig(s: Store) -> None:
        if on:
            s.conn.execute("CREATE TEMP TRIGGER no_room BEFORE INSERT ON main.actions "
                           "BEGIN SELECT RAISE(ABORT, 'database or disk is full'); END")
        else:
            s.conn.execute("DROP TRIGGER temp.no_room")
    await agg.writer.call(trig)


async def test_an_unrecorded_policy_fence_leaves_the_node_as_it_was(tmp_path: Path) -> None:
    fencer = MemFencer()
    async with running(config(tmp_path), [fencer]) as (agg, url), aiohttp.ClientSession() as s:
        assert agg.mem is not None
        await _refuse_actions(agg, True)
        runs = agg.metrics.decisions._value.get()
        assert agg.writer is not None
        failures = agg.writer.failures
        async with s.post(f"{url}/v1/reports", json=_report("dgx01", 10, "FAIL")) as r:
            assert r.status == 200
        # decide ran and tried to fence; the record failed: the node is not left `fencing`
        await until(lambda: agg.metrics.actions.labels("fence", "unrecorded")._value.get() >= 1)
        await until(lambda: not agg._action_tasks)
        assert agg.metrics.decisions._value.get() > runs
        rec = agg.mem.nodes["dgx01"]
        assert rec.fence is FenceMode.NONE and not agg.pending and fencer.count("fence") == 0
        assert agg.mem.fleet().nodes["dgx01"].fence is FenceMode.NONE  # no cap slot held
        # The failed commit is counted. /healthz's store_failing is not asserted here: it is the
        # last write's state, and any later commit that succeeds (a fleet sample, a last-seen
        # flush: only the actions table refuses) rightly clears it (the full-disk test above has it).
        assert agg.writer.failures > failures
        # an operator's fence is refused out loud, and changes nothing either
        with pytest.raises(OperatorError) as e:
            await agg.operator_fence("dgx02", "bad fan", "alice", wait=5)
        assert e.value.status == 503 and "cannot write" in str(e.value)
        assert agg.mem.nodes["dgx02"].fence is FenceMode.NONE and not agg.mem.nodes["dgx02"].hold
        await _refuse_actions(agg, False)
        agg.poke()
        await until(lambda: "dgx01" in fencer.fenced and not agg.pending)
        assert agg.mem.nodes["dgx01"].fence is FenceMode.FENCED
        res = await agg.operator_fence("dgx02", "bad fan", "alice", wait=10)
        assert res["state"] == "done" and agg.mem.nodes["dgx02"].fence is FenceMode.FENCED


async def test_a_second_aggregator_on_the_same_store_is_refused_naming_the_holder(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    async with running(cfg, [MemFencer()]) as (first, _):
        assert first.lease_info is not None and first.lease_info.epoch == 1
        # open() builds nothing when the lease is held: there is no half-built second aggregator
        with pytest.raises(LeaseHeld, match=rf"in use by another aggregator \(aggregator pid {os.getpid()} on "):
            await Aggregator.open(cfg, fencers=[MemFencer()])
    # released on stop: the next one takes it, with the next epoch (the fencing token)
    async with running(cfg, [MemFencer()]) as (third, _):
        assert third.lease_info is not None and third.lease_info.epoch == 2


def test_the_lease_dies_with_its_holder(tmp_path: Path) -> None:
    code = ("import sys, time; from pathlib import Path; from podhealth.aggregator.lease import FileLease; "
            "FileLease(Path(sys.argv[1]), 'the-killed-one').lock(0.0); print('held', flush=True); time.sleep(60)")
    p = subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "agg.db")], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == "held"
        with pytest.raises(LeaseHeld, match="the-killed-one"):
            FileLease(tmp_path / "agg.db").lock(1.0)
        p.send_signal(signal.SIGKILL)
        p.wait(10)
        lease = FileLease(tmp_path / "agg.db")
        lease.lock(2.0)  # no expiry to wait out
        lease.release()
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(10)


# ---- start-up: one clear line and exit 2 ------------------------------------------------------


def _start(db: Path, extra_env: dict[str, str] | None = None) -> tuple[int, list[str]]:
    port = free_port()
    p = subprocess.run([sys.executable, "-m", "podhealth", "aggregator", "--listen", f"127.0.0.1:{port}",
                        "--db", str(db)], capture_output=True, text=True, timeout=60,
                       env={**os.environ, **(extra_env or {})})
    lines = [ln for ln in (p.stdout + p.stderr).splitlines() if ln.strip()]
    return p.returncode, lines


def _seeded(db: Path) -> None:
    s = Store(db)
    s.apply([Store.op_node_insert(NodeRow(f"dgx{i:04d}")) for i in range(3000)])
    s.close()


def test_start_on_a_corrupt_database_is_one_line(tmp_path: Path) -> None:
    db = tmp_path / "agg.db"
    _seeded(db)
    raw = bytearray(db.read_bytes())
    for off in range(2 * 4096, len(raw), 4096):  # every page after the schema: the tables' pages
        raw[off:off + 100] = b"\xee" * 100
    db.write_bytes(bytes(raw))
    code, lines = _start(db)
    assert code == 2 and len(lines) == 1, lines
    assert "malformed" in lines[0] and str(db) in lines[0] and "Traceback" not in lines[0]


def test_start_while_another_aggregator_holds_the_store_is_one_line(tmp_path: Path) -> None:
    db = tmp_path / "agg.db"
    lease = FileLease(db, "aggregator pid 1 on elsewhere")
    lease.lock(0.0)
    try:
        code, lines = _start(db)
    finally:
        lease.release()
    assert code == 2 and len(lines) == 1, lines
    assert "in use by another aggregator (aggregator pid 1 on elsewhere)" in lines[0]
    assert not db.exists()  # refused before the store was even opened (nothing migrated)


def test_start_on_a_database_another_program_holds_locked_is_one_line(tmp_path: Path) -> None:
    db = tmp_path / "agg.db"
    _seeded(db)
    other = sqlite3.connect(db, isolation_level=None, timeout=1)
    other.execute("BEGIN EXCLUSIVE")  # e.g. an sqlite3 shell left in a transaction
    try:
        t0 = time.monotonic()
        code, lines = _start(db)
        took = time.monotonic() - t0
    finally:
        other.execute("ROLLBACK")
        other.close()
    assert code == 2 and len(lines) == 1, lines
    assert "database is locked" in lines[0] and str(db) in lines[0]
    assert took < 40  # the store's busy timeout (10 s), not forever


@contextlib.contextmanager
def _read_only_dir(where: Path) -> Iterator[Path]:
    """A small tmpfs remounted read-only (as a full or read-only /var/lib would be); unmounted after."""
    if os.geteuid() != 0:
        pytest.skip("mounting a read-only filesystem needs root")
    where.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(where)], capture_output=True,
                      timeout=10).returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    try:
        yield where
    finally:
        subprocess.run(["umount", str(where)], capture_output=True, timeout=10)


def test_start_on_a_read_only_database_is_one_line(tmp_path: Path) -> None:
    with _read_only_dir(tmp_path / "ro") as ro:
        _seeded(ro / "agg.db")
        for side in ("agg.db-wal", "agg.db-shm"):
            assert not (ro / side).exists()
        subprocess.run(["mount", "-o", "remount,ro", str(ro)], check=True, capture_output=True, timeout=10)
        code, lines = _start(ro / "agg.db")
    assert code == 2 and len(lines) == 1, lines
    assert "read-only" in lines[0].lower() or "readonly" in lines[0].lower(), lines


def test_a_store_error_is_what_the_writer_reports_after_a_failed_write(tmp_path: Path) -> None:
    s = Store(tmp_path / "a.db")
    pages = s.conn.execute("PRAGMA page_count").fetchone()[0]
    s.conn.execute(f"PRAGMA max_page_count = {pages}")
    with pytest.raises(sqlite3.OperationalError, match="full"):
        s.apply([Store.op_node_insert(NodeRow(f"n{i}")) for i in range(2000)])
    s.close()
    assert issubclass(StoreError, Exception)


def test_healthz_of_a_running_subprocess_aggregator(tmp_path: Path) -> None:
    port = free_port()
    p = subprocess.Popen([sys.executable, "-m", "podhealth", "aggregator", "--listen", f"127.0.0.1:{port}",
                          "--db", str(tmp_path / "agg.db")], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_until(lambda: _ok(port), what="healthz")
        code, lines = _start(tmp_path / "agg.db")
        assert code == 2 and len(lines) == 1 and f"aggregator pid {p.pid} on" in lines[0], lines
    finally:
        p.terminate()
        p.wait(20)


def _ok(port: int) -> bool:
    try:
        return http_get(f"http://127.0.0.1:{port}/healthz", timeout=1)[0] == 200
    except OSError:
        return False
