"""/dev/kmsg read as the kernel offers it: the record reader on a real FIFO (the simulated node's
kernel log) and on scripted /dev/kmsg errors, the scheduler collecting when the descriptor turns
readable, and the simulated node writing its records to the stream."""

from __future__ import annotations

import asyncio
import errno
import os
import time
from pathlib import Path
from typing import Iterator

import pytest

from podhealth.agent.scheduler import Scheduler
from podhealth.agent.store import SnapshotStore
from podhealth.collectors.base import Collection
from podhealth.collectors.kmsg import KmsgCollector
from podhealth.collectors.kmsg_reader import KmsgDeviceReader, open_reader
from podhealth.config import loads
from podhealth.sim.node import SimNode
from podhealth.sim.state import Fault

pytestmark = pytest.mark.timeout(60)

X79 = "NVRM: Xid (PCI:0000:18:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."


def rec(seq: int, text: str = X79, prio: int = 3) -> bytes:
    return f"{prio},{seq},{seq}000000,-;{text}\n".encode()


@pytest.fixture
def fifo(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "kmsg.fifo"
    os.mkfifo(path)
    yield path


def writer(path: Path) -> int:
    return os.open(path, os.O_WRONLY | os.O_NONBLOCK)


def test_open_reader_picks_the_record_reader_for_a_fifo(fifo: Path) -> None:
    r = open_reader(fifo, from_start=True)
    assert isinstance(r, KmsgDeviceReader)
    assert r.fileno() is None  # opened on first use
    assert r.read(10, 1 << 20).lines == ()
    assert r.fileno() is not None
    r.close()


def test_fifo_records_split_across_writes_and_dictionary_lines(fifo: Path) -> None:
    r = KmsgDeviceReader(fifo, from_start=True, fifo=True)
    assert r.open() == ""
    w = writer(fifo)
    try:
        whole = rec(1) + b" SUBSYSTEM=pci\n DEVICE=+pci:0000:18:00.0\n" + rec(2, "NVRM: GPU at PCI:0000:18:00: x", 6)
        os.write(w, whole[:30])  # a record cut in the middle: nothing whole yet
        assert r.read(10, 1 << 20).lines == ()
        os.write(w, whole[30:])
        got = r.read(10, 1 << 20)
        assert [ln.split(",")[1] for ln in got.lines] == ["1", "2"]
        assert got.lost == 0
    finally:
        os.close(w)
        r.close()


def test_fifo_more_records_than_max_lines_are_kept_for_the_next_read(fifo: Path) -> None:
    r = KmsgDeviceReader(fifo, from_start=True, fifo=True)
    r.open()
    w = writer(fifo)
    try:
        os.write(w, b"".join(rec(i) for i in range(1, 8)))
        first = r.read(3, 1 << 20).lines
        rest = r.read(100, 1 << 20).lines
        assert [ln.split(",")[1] for ln in first + rest] == [str(i) for i in range(1, 8)]
    finally:
        os.close(w)
        r.close()


def test_fifo_survives_its_writer_closing_and_coming_back(fifo: Path) -> None:
    r = KmsgDeviceReader(fifo, from_start=True, fifo=True)
    r.open()
    fd = r.fileno()
    assert fd is not None
    w = writer(fifo)
    os.write(w, rec(1))
    os.close(w)  # the simulated kernel (a CLI process) exits
    assert len(r.read(10, 1 << 20).lines) == 1
    # No endless EOF after the writer left: the descriptor is not readable, reads say EAGAIN.
    import select
    assert select.select([fd], [], [], 0)[0] == []
    assert r.read(10, 1 << 20) == r.read(10, 1 << 20) == type(r.read(0, 0))()
    w = writer(fifo)
    os.write(w, rec(2))
    os.close(w)
    assert [ln.split(",")[1] for ln in r.read(10, 1 << 20).lines] == ["2"]
    assert r.fileno() == fd
    r.close()


def test_fifo_malformed_records_are_lines_the_collector_counts(fifo: Path, tmp_path: Path) -> None:
    r = KmsgDeviceReader(fifo, from_start=True, fifo=True)
    r.open()
    cfg = loads(f"paths: {{kmsg: {fifo}}}\n")
    c = KmsgCollector(cfg, reader=r, nvml=None, boot_time=lambda: 1000.0, clock=lambda: 5000.0)
    w = writer(fifo)
    try:
        os.write(w, b"\xff\xfe junk without a header\n")
        os.write(w, b"3,x,y,-;NVRM: Xid (PCI:0000:18:00): abc, pid=1\n")  # bad header, bad Xid code
        os.write(w, b"no newline for a long time " + b"A" * (40 * 1024))
        assert c.collect().events == ()
        os.write(w, b"A" * (30 * 1024))  # over MAX_LINE without a newline: cut, never buffered on
        assert c.collect().events == ()
        os.write(w, b"B\n" + rec(9))
        got = c.collect()
        assert [e.code for e in got.events] == [79]
        lines = {s.name: s.value for s in got.samples if not s.labels}
        assert lines["kmsg_lines"] == 5  # junk, bad, the long line's first 64 KiB, its tail "B", the record
        assert lines["kmsg_malformed_lines"] == 1
    finally:
        os.close(w)
        c.close()


def test_fifo_sequence_restart_is_not_dropped(fifo: Path) -> None:
    """A FIFO never repeats records: a lower sequence number means the writer started over."""
    r = KmsgDeviceReader(fifo, from_start=True, fifo=True)
    r.open()
    w = writer(fifo)
    try:
        os.write(w, rec(5) + rec(6) + rec(1))
        assert [ln.split(",")[1] for ln in r.read(10, 1 << 20).lines] == ["5", "6", "1"]
    finally:
        os.close(w)
        r.close()


class Script:
    def __init__(self, items: list[bytes | BaseException]) -> None:
        self.items = items
        self.calls = 0

    def __call__(self, fd: int, n: int) -> bytes:
        self.calls += 1
        if not self.items:
            raise BlockingIOError(errno.EAGAIN, "EAGAIN")
        item = self.items.pop(0)
        if isinstance(item, BaseException):
            raise item
        return item


def test_epipe_continues_with_the_next_record_and_counts_the_overwritten(tmp_path: Path) -> None:
    dev = tmp_path / "dev"
    dev.write_text("")
    script = Script([rec(10), BrokenPipeError(errno.EPIPE, "EPIPE"), rec(17), rec(18),
                     BrokenPipeError(errno.EPIPE, "EPIPE")])
    r = KmsgDeviceReader(dev, from_start=True, read_fn=script)
    got = r.read(100, 1 << 20)
    assert [ln.split(",")[1] for ln in got.lines] == ["10", "17", "18"]
    assert got.lost == 6  # 11-16
    # The EPIPE at the end of a read: counted when the next record shows the gap.
    script.items += [rec(30)]
    got = r.read(100, 1 << 20)
    assert got.lost == 11 and [ln.split(",")[1] for ln in got.lines] == ["30"]
    r.close()


def test_epipe_on_the_first_read_counts_one(tmp_path: Path) -> None:
    dev = tmp_path / "dev"
    dev.write_text("")
    r = KmsgDeviceReader(dev, from_start=False, read_fn=Script([BrokenPipeError(errno.EPIPE, "EPIPE"), rec(500)]))
    got = r.read(100, 1 << 20)
    assert got.lost == 1 and len(got.lines) == 1  # no earlier sequence number to measure by
    r.close()


def test_errors_that_read_nothing_cannot_spin_forever(tmp_path: Path) -> None:
    dev = tmp_path / "dev"
    dev.write_text("")

    def always_einval(fd: int, n: int) -> bytes:
        raise OSError(errno.EINVAL, "EINVAL")

    r = KmsgDeviceReader(dev, from_start=True, read_fn=always_einval)
    got = r.read(10, 1 << 20)
    assert got.lines == () and got.error == ""  # returns, bounded
    r.close()


def test_eio_closes_and_reports(tmp_path: Path) -> None:
    dev = tmp_path / "dev"
    dev.write_text("")
    r = KmsgDeviceReader(dev, from_start=True, read_fn=Script([rec(1), OSError(errno.EIO, "EIO")]))
    got = r.read(10, 1 << 20)
    assert len(got.lines) == 1 and "EIO" in got.error
    assert r.fileno() is None  # reopened on the next read
    r.close()


# ---- the scheduler collects on readiness --------------------------------------------------------


class PipeCollector:
    """Reads whatever is in a pipe; its read end is the readable descriptor."""

    name = "pipe"

    def __init__(self) -> None:
        self.r, self.w = os.pipe()
        os.set_blocking(self.r, False)
        self.got: list[bytes] = []
        self.runs = 0

    def readable_fd(self) -> int | None:
        return self.r

    def collect(self) -> Collection:
        self.runs += 1
        try:
            while chunk := os.read(self.r, 4096):
                self.got.append(chunk)
        except BlockingIOError:
            pass
        return Collection(samples=())

    def close(self) -> None:
        os.close(self.r)
        os.close(self.w)


async def _wait(pred: object, timeout: float) -> None:
    async def poll() -> None:
        while not pred():  # type: ignore[operator]
            await asyncio.sleep(0.01)
    await asyncio.wait_for(poll(), timeout)


def test_scheduler_collects_when_the_descriptor_turns_readable() -> None:
    async def main() -> None:
        store = SnapshotStore()
        sched = Scheduler(store)
        c = PipeCollector()
        sched.add("pipe", c, interval=300.0, timeout=5.0)  # the interval alone would take 5 minutes
        sched.start()
        try:
            await _wait(lambda: c.runs == 1 and not sched.in_flight("pipe"), 10)
            os.write(c.w, b"record 1\n")
            await _wait(lambda: c.got == [b"record 1\n"], 10)
            await _wait(lambda: not sched.in_flight("pipe"), 10)
            os.write(c.w, b"record 2\n")
            await _wait(lambda: b"".join(c.got) == b"record 1\nrecord 2\n", 10)
            runs = c.runs
            assert runs >= 3
        finally:
            await sched.stop()
        assert not asyncio.get_running_loop().remove_reader(c.r)  # stop() stopped watching it

    asyncio.run(main())


def test_a_watched_collector_ticks_at_its_watched_interval() -> None:
    """While the descriptor is watched the interval is only a fallback (collectors.kmsg
    .watched_interval): readiness collects, the 50 ms interval does not."""
    async def main(watched: float | None) -> int:
        sched = Scheduler(SnapshotStore())
        c = PipeCollector()
        sched.add("pipe", c, interval=0.05, timeout=5.0, watched_interval=watched)
        sched.start()
        try:
            await _wait(lambda: c.runs >= 1 and not sched.in_flight("pipe"), 10)
            os.write(c.w, b"record\n")
            await _wait(lambda: c.got == [b"record\n"] and not sched.in_flight("pipe"), 10)
            before = c.runs
            if watched is None:
                await _wait(lambda: c.runs >= before + 5, 10)  # the interval keeps ticking
            else:
                await asyncio.sleep(0.6)  # twelve 50 ms intervals: none of them may collect
            assert not store_stale(sched)
            return c.runs - before
        finally:
            await sched.stop()

    # At most the one tick that was already scheduled (at the 50 ms interval) before the watch.
    assert asyncio.run(main(300.0)) <= 1
    assert asyncio.run(main(None)) >= 5


def store_stale(sched: Scheduler) -> bool:
    st = sched.store.get("pipe")
    return st is None or st.stale


def test_a_descriptor_epoll_refuses_leaves_the_interval(tmp_path: Path) -> None:
    """A regular file cannot be polled (epoll: EPERM): said once, then the interval alone."""
    plain = tmp_path / "kern.log"
    plain.write_text("")

    class FileCollector:
        name = "file"

        def __init__(self) -> None:
            self.fd = os.open(plain, os.O_RDONLY)
            self.asked = 0
            self.runs = 0

        def readable_fd(self) -> int:
            self.asked += 1
            return self.fd

        def collect(self) -> Collection:
            self.runs += 1
            return Collection(samples=())

        def close(self) -> None:
            os.close(self.fd)

    async def main() -> None:
        sched = Scheduler(SnapshotStore())
        c = FileCollector()
        sched.add("file", c, interval=0.05, timeout=5.0)
        sched.start()
        try:
            await _wait(lambda: c.runs >= 4, 10)
        finally:
            await sched.stop()
        assert c.asked == 1

    asyncio.run(main())


# ---- the simulated node writes its records to the stream ---------------------------------------


def test_sim_node_writes_records_to_an_attached_reader_and_replays_the_newest(tmp_path: Path) -> None:
    node = SimNode.create(tmp_path, "n1")
    node.inject(Fault(kind="xid", injected_at=time.time(), gpu=1, code=48))  # before any reader: kmsg.log only
    r = KmsgDeviceReader(node.kmsg_stream, from_start=True, fifo=True)
    assert node.attach_kmsg_reader(r.open, from_start=True) == ""
    replayed = r.read(100, 1 << 20).lines
    assert len(replayed) == 1 and ": 48, " in replayed[0]
    node.inject(Fault(kind="xid", injected_at=time.time(), gpu=3, code=79))
    lines = r.read(100, 1 << 20).lines
    assert any(": 79, " in ln for ln in lines)
    assert [ln.split(",")[1] for ln in replayed + lines] == [str(i) for i in range(1, len(lines) + 2)]
    r.close()
    # The reader gone: writing must not fail (ENXIO) and kmsg.log keeps the record.
    node.inject(Fault(kind="xid", injected_at=time.time(), gpu=2, code=48))
    assert node.kmsg_path.read_text().count(": 48, ") == 2


def test_sim_node_without_from_start_replays_nothing(tmp_path: Path) -> None:
    node = SimNode.create(tmp_path, "n1")
    node.inject(Fault(kind="xid", injected_at=time.time(), gpu=1, code=48))
    r = KmsgDeviceReader(node.kmsg_stream, from_start=False, fifo=True)
    assert node.attach_kmsg_reader(r.open, from_start=False) == ""
    assert r.read(100, 1 << 20).lines == ()
    r.close()


def test_simulated_agent_attaches_its_reader_on_the_first_read_only(tmp_path: Path) -> None:
    """`podhealth agent --simulate` wiring: setting the simulator up (as `profile capture
    --simulate` does too) neither takes records from a running agent's stream nor replays old
    ones into it; the kmsg collector's first read attaches and gets the newest records."""
    from podhealth.sim import agentnode
    from podhealth.config import Config
    from podhealth.sim import nvml_lib

    sim = agentnode.setup(Config(), "dgx-h100", tmp_path, "n1")
    try:
        node = sim.node
        assert sim.cfg.paths.kmsg == node.kmsg_stream
        node.inject(Fault(kind="xid", injected_at=time.time(), gpu=1, code=48))
        running = KmsgDeviceReader(node.kmsg_stream, from_start=False, fifo=True)  # an agent already there
        assert node.attach_kmsg_reader(running.open, from_start=False) == ""
        agentnode.setup(Config(), "dgx-h100", tmp_path, "n1")  # another command sets the node up
        assert running.read(100, 1 << 20).lines == ()
        running.close()
        reader = sim.seams["kmsg"]["reader"]
        assert reader.fileno() is None  # not attached before the collector reads
        got = reader.read(100, 1 << 20).lines
        assert len(got) == 1 and ": 48, " in got[0]
        node.inject(Fault(kind="xid", injected_at=time.time(), gpu=3, code=79))
        assert any(": 79, " in ln for ln in reader.read(100, 1 << 20).lines)
        reader.close()
    finally:
        nvml_lib.uninstall()


def test_readiness_starts_a_burst_at_once_and_a_storm_one_collection_per_gap() -> None:
    """A fault's records arrive as a burst (XID 79: five NVRM lines) and a collection may wake on
    the first: KICK_BURST collections start at once, then one per KICK_MIN_GAP, however long the storm."""
    from podhealth.agent.scheduler import KICK_BURST, KICK_MIN_GAP, _credit, _Slot

    slot = _Slot(name="kmsg", runner=None, interval=1.0)  # type: ignore[arg-type]
    now = 100.0
    for _ in range(KICK_BURST):  # back to back, the clock standing still
        assert _credit(slot, now) >= 1
        slot.kick_credit, slot.kicked = _credit(slot, now) - 1, now
    assert _credit(slot, now) < 1  # the burst is spent: the next waits
    assert _credit(slot, now + KICK_MIN_GAP * 1.01) >= 1  # for one gap
    started = 0
    for i in range(1, 201):  # a storm: a readiness every millisecond for 200 ms
        t = now + i * 0.001
        if _credit(slot, t) >= 1:
            slot.kick_credit, slot.kicked = _credit(slot, t) - 1, t
            started += 1
    assert started <= 200 * 0.001 / KICK_MIN_GAP + 1
    assert _credit(slot, now + 60.0) == KICK_BURST  # refilled, never beyond the burst
