"""The kernel-log reader on its own (collectors/kmsg_reader.py): /dev/kmsg records replayed from a
script of reads and errors, and a followed file. Through the collector: test_kmsg_collector.py
(growth, truncation, rotation, EPIPE counting) and test_kmsg_stream.py (FIFOs, readiness)."""

from __future__ import annotations

from pathlib import Path

from podhealth.collectors.kmsg_reader import FileFollower, KmsgDeviceReader

X79 = "NVRM: Xid (PCI:0000:18:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."


class Records:
    """Stands in for os.read on /dev/kmsg: a script of records and errors."""

    def __init__(self, script: list[bytes | BaseException]) -> None:
        self.script = script

    def __call__(self, fd: int, n: int) -> bytes:
        if not self.script:
            raise BlockingIOError(11, "EAGAIN")
        item = self.script.pop(0)
        if isinstance(item, BaseException):
            raise item
        return item



def test_kmsg_device_reopen_does_not_repeat_records(tmp_path: Path) -> None:
    dev = tmp_path / "fake-kmsg"
    dev.write_text("")
    recs = [f"3,{i},{i}000000,-;{X79}\n".encode() for i in (1, 2)]
    script: list[bytes | BaseException] = [*recs, OSError(5, "EIO")]
    reader = KmsgDeviceReader(dev, from_start=True, read_fn=Records(script))
    assert len(reader.read(10, 1 << 20).lines) == 2 and reader.read(0, 0).error == ""
    script += [*recs, f"3,3,3000000,-;{X79}\n".encode()]  # reopened from the start: 1 and 2 again
    assert [ln.split(",")[1] for ln in reader.read(10, 1 << 20).lines] == ["3"]


def test_file_follower_survives_binary_junk(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_bytes(b"\xff\xfe garbage \x00\nNVRM: Xid (PCI:0000:18:00): 79\n")
    batch = FileFollower(log, from_start=True).read(100, 1 << 20)
    assert len(batch.lines) == 2 and batch.lines[1].endswith(": 79")
