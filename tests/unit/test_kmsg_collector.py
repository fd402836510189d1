"""The kmsg collector: following files (growth, truncation, rotation), /dev/kmsg records, NVML
XID events with de-duplication, counters, bounds and failure handling."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest

from podhealth.collectors import REGISTRY, factory
from podhealth.collectors.kmsg import KmsgCollector, create
from podhealth.collectors.kmsg_reader import KmsgDeviceReader
from podhealth.collectors.nvml_events import NvmlUnusable, NvmlXid
from podhealth.config import Config, loads
from podhealth.vocab import Sample
from tests.unit.test_kmsg_reader import Records

OWN = Path(__file__).resolve().parent.parent / "fixtures" / "kmsg"
REPO = Path(__file__).resolve().parents[2]
X79 = "NVRM: Xid (PCI:0000:18:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."


def cfg_for(path: Path, from_start: bool = True, keep: int = 256) -> Config:
    return loads(f"paths: {{kmsg: {path}}}\ncollectors: {{kmsg: {{from_start: {str(from_start).lower()}, "
                 f"keep_events: {keep}}}}}\n")


class Clock:
    def __init__(self, t: float = 1_700_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def value(samples: tuple[Sample, ...], name: str, **labels: str) -> float | None:
    for s in samples:
        if s.name == name and all(s.label(k) == v for k, v in labels.items()):
            return s.value
    return None


def collector(path: Path, **kw: Any) -> KmsgCollector:
    from_start = kw.pop("from_start", True)
    keep = kw.pop("keep", 256)
    kw.setdefault("nvml", None)
    kw.setdefault("boot_time", lambda: 1_699_000_000.0)
    return create(cfg_for(path, from_start, keep), **kw)


def test_registered_and_metrics_documented() -> None:
    assert REGISTRY["kmsg"] == "podhealth.collectors.kmsg:create"
    assert factory("kmsg") is create
    doc = (REPO / "docs" / "metrics.md").read_text(encoding="utf-8")
    section = doc.split("## kmsg", 1)[1].split("\n## ", 1)[0]
    documented = set(re.findall(r"^\| (\w+) \|", section, re.M))
    assert set(KmsgCollector.metrics) == documented


def test_follows_a_growing_file_and_returns_only_new_events(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text(f"[ 10.0] {X79}\n")
    c = collector(log)
    first = c.collect()
    assert [(e.kind, e.code, e.pci_bus_id, e.source) for e in first.events] == [("xid", 79, "0000:18:00.0", "kmsg")]
    assert first.events[0].time == pytest.approx(1_699_000_010.0)  # boot + monotonic stamp
    assert c.collect().events == ()
    with open(log, "a") as f:
        f.write("[ 11.0] NVRM: Xid (PCI:0000:19:00): 48, pid='<unknown>', name=<unknown>, DBE")  # no newline yet
    assert c.collect().events == ()  # a half-written line waits
    with open(log, "a") as f:
        f.write(" detected\n[ 12.0] nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 20034, Fatal, Link 1 LTSSM Fault Up\n")
    got = c.collect()
    assert [(e.kind, e.code) for e in got.events] == [("xid", 48), ("sxid", 20034)]
    assert got.events[0].text.endswith("DBE detected")
    assert value(got.samples, "xid_events", code="79", pci_bus_id="0000:18:00.0") == 1
    assert value(got.samples, "sxid_events", device="nvswitch0", code="20034") == 1
    assert value(got.samples, "kmsg_lines") == 3
    c.close()


def test_truncation_and_rotation(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text(f"{X79}\n" * 3)
    c = collector(log)
    assert len(c.collect().events) == 3
    log.write_text("NVRM: Xid (PCI:0000:1a:00): 43, pid=1, name=a, Ch 00000008\n")  # truncated in place, rewritten
    assert [e.code for e in c.collect().events] == [43]
    with open(log, "a") as f:
        f.write("NVRM: Xid (PCI:0000:1a:00): 31, pid=1, name=a, old file tail\n")
    os.rename(log, tmp_path / "kern.log.1")  # rotated: the tail of the old file must not be lost
    log.write_text("NVRM: Xid (PCI:0000:1a:00): 94, pid=1, name=a, new file\n")
    assert [e.code for e in c.collect().events] == [31, 94]
    with open(log, "a") as f:
        f.write("NVRM: Xid (PCI:0000:1a:00): 45, pid=1, name=a, more\n")
    assert [e.code for e in c.collect().events] == [45]
    c.close()


def test_from_start_false_skips_history(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text(f"{X79}\n")
    c = collector(log, from_start=False)
    assert c.collect().events == ()
    with open(log, "a") as f:
        f.write(f"{X79}\n")
    assert len(c.collect().events) == 1


def test_missing_file_appears_later(tmp_path: Path) -> None:
    log = tmp_path / "later.log"
    c = collector(log, nvml=lambda: FakeSource())
    first = c.collect()
    assert any("cannot open" in e for e in first.errors) and first.events == ()
    assert not any("cannot open" in e for e in c.collect().errors)  # said once
    log.write_text(f"{X79}\n")
    assert [e.code for e in c.collect().events] == [79]


def test_neither_source_readable_fails_the_collection(tmp_path: Path) -> None:
    c = collector(tmp_path / "nope.log")
    with pytest.raises(OSError, match="cannot open"):
        c.collect()


def test_kmsg_record_file_malformed_line_counted_and_skipped(tmp_path: Path) -> None:
    c = collector(OWN / "kmsg_records.log")
    got = c.collect()
    assert [(e.code, e.pci_bus_id, e.pid, e.process) for e in got.events] == [
        (13, "0000:2a:00.0", 8801, "python3"), (13, "0000:2a:00.0", 8801, "python3"),
        (94, "0000:4c:00.0", None, ""),
    ]
    assert got.events[0].time == pytest.approx(1_699_000_000.0 + 5012.345690)
    assert value(got.samples, "kmsg_malformed_lines") == 1
    assert value(got.samples, "kmsg_lines") == 6


def test_syslog_file_sxid_continuations_not_counted(tmp_path: Path) -> None:
    c = collector(OWN / "syslog_kern.log", clock=Clock())
    got = c.collect()
    assert [(e.device, e.code) for e in got.events] == [("nvswitch1", 20034), ("nvswitch3", 11012)]
    assert value(got.samples, "sxid_events", device="nvswitch1", code="20034") == 1
    assert all(e.pci_bus_id == "" for e in got.events)


def test_bounded_reads(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text("".join(f"NVRM: Xid (PCI:0000:18:00): 43, pid={i}, name=a, Ch 1\n" for i in range(25)))
    c = collector(log, max_records=10)
    sizes = [len(c.collect().events) for _ in range(4)]
    assert sizes == [10, 10, 5, 0]
    assert [e.pid for e in c.recent] == list(range(25))
    small = collector(log, max_bytes=100)  # ~55 bytes a line: 1 line per call, nothing lost
    assert sum(len(small.collect().events) for _ in range(30)) == 25


def test_keep_events_bounded(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text("".join(f"NVRM: Xid (PCI:0000:18:00): 43, pid={i}, name=a, Ch 1\n" for i in range(20)))
    c = collector(log, keep=5)
    assert len(c.collect().events) == 20
    assert [e.pid for e in c.recent] == [15, 16, 17, 18, 19]


def test_pci_to_gpu_mapping_seam(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text(f"{X79}\n")
    c = collector(log, gpu_index_of={"0000:18:00.0": 3}.get)
    got = c.collect()
    assert got.events[0].gpu == 3
    assert value(got.samples, "xid_events", gpu="3", code="79") == 1


# ---- /dev/kmsg ---------------------------------------------------------------------------------


def test_kmsg_device_records_epipe_and_eagain(tmp_path: Path) -> None:
    dev = tmp_path / "fake-kmsg"
    dev.write_text("")  # something to open; reads come from the script
    script: list[bytes | BaseException] = [
        f"3,100,2000000,-;{X79}\n SUBSYSTEM=pci\n DEVICE=+pci:0000:18:00.0\n".encode(),
        BrokenPipeError(32, "EPIPE"),
        b"6,150,2100000,-;mlx5_core 0000:1a:00.0: Port module event\n",
        OSError(22, "EINVAL"),
        b"3,152,2200000,-;NVRM: Xid (PCI:0000:18:00): 48, pid='<unknown>', name=<unknown>, DBE\n",
    ]
    reader = KmsgDeviceReader(dev, from_start=True, read_fn=Records(script))
    c = KmsgCollector(cfg_for(dev), reader=reader, boot_time=lambda: 1000.0, clock=Clock(5000.0))
    got = c.collect()
    assert [(e.code, e.time) for e in got.events] == [(79, 1002.0), (48, 1002.2)]
    # Counted by the sequence gaps: 101-149 overwritten (EPIPE), 151 too big for the buffer (EINVAL).
    assert value(got.samples, "kmsg_records_lost") == 49 + 1
    assert value(got.samples, "kmsg_lines") == 3
    assert c.collect().events == ()  # EAGAIN straight away: nothing new
    c.close()


def test_real_dev_kmsg_reads_until_eagain() -> None:
    dev = Path("/dev/kmsg")
    if not dev.exists() or not os.access(dev, os.R_OK):
        pytest.skip("/dev/kmsg not readable here")
    c = create(loads("paths: {kmsg: /dev/kmsg}\n"), nvml=None)
    got = c.collect()  # bounded, non-blocking: returns even though /dev/kmsg never ends
    assert isinstance(c._reader, KmsgDeviceReader)
    assert (value(got.samples, "kmsg_lines") or 0) > 0
    c.close()


# ---- NVML --------------------------------------------------------------------------------------


class FakeSource:
    def __init__(self, pci_map: dict[str, int] | None = None) -> None:
        self.queue: list[NvmlXid] = []
        self.pci_map = pci_map or {}
        self.fail = False
        self.closed = False

    def poll(self, max_events: int) -> list[NvmlXid]:
        if self.fail:
            raise RuntimeError("NVML_ERROR_UNKNOWN")
        out, self.queue = self.queue[:max_events], self.queue[max_events:]
        return out

    def gpu_index_by_pci(self) -> dict[str, int]:
        return dict(self.pci_map)

    def close(self) -> None:
        self.closed = True


def test_nvml_and_kernel_line_for_one_xid_count_once(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text("")
    clock = Clock()
    src = FakeSource({"0000:18:00.0": 0})
    c = collector(log, nvml=lambda: src, clock=clock, boot_time=lambda: clock.t - 100.0)
    assert c.collect().events == ()
    with open(log, "a") as f:
        f.write(f"[ 100.2] {X79}\n")
    src.queue.append(NvmlXid("0000:18:00.0", 0, 79, clock.t + 0.5))
    clock.t += 1
    got = c.collect()
    assert [(e.code, e.source, e.gpu) for e in got.events] == [(79, "kmsg", 0)]
    clock.t += 5
    assert c.collect().events == ()  # the held NVML duplicate is never released
    assert value(c.collect().samples, "xid_events", gpu="0", code="79") == 1


def test_nvml_event_first_then_kernel_line_counts_once(tmp_path: Path) -> None:
    """The simulator's (and a busy node's) order: NVML delivers before the kernel line is read."""
    log = tmp_path / "kern.log"
    log.write_text("")
    clock = Clock()
    src = FakeSource({"0000:18:00.0": 0})
    c = collector(log, nvml=lambda: src, clock=clock, boot_time=lambda: clock.t - 100.0)
    src.queue.append(NvmlXid("0000:18:00.0", 0, 79, clock.t))
    assert c.collect().events == ()  # held, waiting for its kernel line
    with open(log, "a") as f:
        f.write(f"[ 100.3] {X79}\n")
    clock.t += 0.5
    got = c.collect()
    assert [(e.code, e.source, e.gpu) for e in got.events] == [(79, "kmsg", 0)]
    clock.t += 5
    assert c.collect().events == ()  # the matched NVML event is never released on its own
    assert value(c.collect().samples, "xid_events", gpu="0", code="79") == 1


def test_nvml_only_event_is_released_after_the_hold(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text("")
    clock = Clock()
    src = FakeSource({"0000:3b:00.0": 2})
    c = collector(log, nvml=lambda: src, clock=clock)
    src.queue.append(NvmlXid("0000:3b:00.0", 2, 48, clock.t))
    assert c.collect().events == ()  # held, waiting for its kernel line
    clock.t += 3
    got = c.collect()
    assert [(e.code, e.source, e.gpu, e.pci_bus_id) for e in got.events] == [(48, "nvml", 2, "0000:3b:00.0")]
    # Two different XIDs on the same GPU are not merged.
    src.queue += [NvmlXid("0000:3b:00.0", 2, 48, clock.t), NvmlXid("0000:3b:00.0", 2, 63, clock.t)]
    clock.t += 3
    c.collect()
    clock.t += 3
    assert value(c.collect().samples, "xid_events", gpu="2", code="48") == 2


def test_nvml_unusable_or_failing_falls_back_to_kernel_log(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text(f"{X79}\n")

    def broken() -> FakeSource:
        raise NvmlUnusable("nvmlInit failed: Driver Not Loaded")

    c = collector(log, nvml=broken)
    got = c.collect()
    assert [e.code for e in got.events] == [79]
    assert any("kernel log only" in e and "Driver Not Loaded" in e for e in got.errors)
    assert c.collect().errors == ()  # the reason is given once
    src = FakeSource()
    c2 = collector(log, nvml=lambda: src)
    c2.collect()
    src.fail = True
    assert any("NVML XID event wait failed" in e for e in c2.collect().errors)
    assert c2.collect().errors == ()
    c2.close()
    assert src.closed
