"""Kernel-log lines the project has not seen: other driver generations and log readers, damaged
bytes, cut records, and the verdict rules that must hold for any of them (application XIDs never
fence, unknown codes get the catalog's default, XID 154 states the action).

Line shapes: tests/fixtures/kmsg/generations.tsv (its columns are checked in test_xid_parse.py);
here they go through the reader and the collector as bytes, and through evaluate_xids."""

from __future__ import annotations

import csv
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from podhealth.checks.passive.xid import evaluate_xids, load_catalog
from podhealth.collectors.kmsg import KmsgCollector, create
from podhealth.collectors.kmsg_reader import FileFollower
from podhealth.collectors.xid_parse import MAX_TEXT, Malformed, ParsedLine, parse, parse_nvlink5
from podhealth.config import loads
from podhealth.vocab import Action, CheckResult, Event, Status
from tests.harness.fuzz import fuzz_settings

OWN = Path(__file__).resolve().parent.parent / "fixtures" / "kmsg"
NOW = 1_000_000.0
WINDOW = 3600.0
CAT = load_catalog()
GPUS = {f"0000:{0x18 + i:02x}:00.0": (i, f"GPU-{i:08d}") for i in range(8)}


def _rows() -> list[dict[str, str]]:
    with open(OWN / "generations.tsv", encoding="utf-8", newline="") as f:
        return list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))


def xid(code: int, t: float, gpu: int = 0, detail: str = "test") -> Event:
    return Event(kind="xid", code=code, time=t, pci_bus_id=f"0000:{0x18 + gpu:02x}:00.0", source="kmsg",
                 text=f"NVRM: Xid (PCI:0000:{0x18 + gpu:02x}:00): {code}, pid='<unknown>', name=<unknown>, {detail}")


def rec(t: float, to: str, gpu: int = 0) -> Event:
    return xid(154, t, gpu, f"GPU recovery action changed from 0x0 (None) to {to}")


def run(*events: Event) -> dict[str, CheckResult]:
    return {r.entity: r for r in evaluate_xids(list(events), CAT, NOW, WINDOW, GPUS)}


# ---- bytes as the kernel and the log readers hand them over ------------------------------------------


def test_file_follower_counts_bytes_not_characters_when_it_gives_lines_back(tmp_path: Path) -> None:
    # Invalid UTF-8 decodes to U+FFFD (1 byte -> 3): the position the follower went back to was
    # measured in re-encoded characters, so it seeked before the lines (or before 0: EINVAL, and
    # the kernel log was never read again) whenever more lines waited than one read may take.
    lines = [b"junk \xff\xfe\xff\xfe\xff line %d" % i for i in range(7)]
    lines.insert(3, b"NVRM: Xid (PCI:0000:1b:00): 13, pid=1, name=x\xe9y, Graphics Exception")
    log = tmp_path / "kern.log"
    log.write_bytes(b"\n".join(lines) + b"\n")
    follower = FileFollower(log, from_start=True)
    got: list[str] = []
    for _ in range(10):
        batch = follower.read(2, 1 << 20)
        assert batch.error == ""
        got += batch.lines
    assert got == [x.decode("utf-8", "replace") for x in lines]


def test_every_generation_through_the_collector_as_bytes(tmp_path: Path) -> None:
    """The table's lines written with CRLF ends, NUL runs, non-UTF-8 bytes and a cut record
    between them, read three lines per collect: every line's event comes out once, in order,
    with its code, address and GPU; nothing raises; the malformed ones are counted."""
    rows = _rows()
    junk = [b"\x00\x00\x00\x00", b"\xff\xfe invalid utf-8 \xc3", b"NVRM: Xid (PCI:0000:1b:0", b"\r"]
    data = b""
    for i, row in enumerate(rows):
        data += row["line"].encode("utf-8") + (b"\r\n" if i % 2 else b"\n") + junk[i % len(junk)] + b"\n"
    log = tmp_path / "kern.log"
    log.write_bytes(data)
    index = {"0000:1b:00.0": 1, "0000:9c:00.0": 4}
    c: KmsgCollector = create(loads(f"paths: {{kmsg: {log}}}\ncollectors: {{kmsg: {{from_start: true}}}}\n"),
                              nvml=None, boot_time=lambda: 1_699_000_000.0, gpu_index_of=index.get,
                              clock=lambda: 1_737_000_000.0, max_records=3)
    events: list[Event] = []
    for _ in range(len(rows) * 2):
        events += c.collect().events
    want = [r for r in rows if r["kind"] in ("xid", "sxid", "fallen_off_bus")]
    assert [(e.code, e.pci_bus_id or e.device) for e in events] == [
        (int(r["code"]), r["pci"] or r["device"]) for r in want]
    assert all(e.gpu == index.get(e.pci_bus_id) for e in events if e.kind != "sxid")
    samples = {s.name: s.value for s in c.collect().samples if not s.labels}
    assert samples["kmsg_malformed_lines"] == sum(r["kind"] == "malformed" for r in rows)
    assert samples["kmsg_lines"] == 2 * len(rows)


def test_nul_and_carriage_return_around_a_line() -> None:
    p = parse("\x00\x00\x00[ 9.5] NVRM: Xid (PCI:0000:1b:00): 79, pid='<unknown>', name=<unknown>, "
              "GPU has fallen off the bus.\r\n")
    assert isinstance(p, ParsedLine) and (p.code, p.pci_bus_id, p.mono_time) == (79, "0000:1b:00.0", 9.5)
    assert p.detail == "GPU has fallen off the bus."


def test_a_record_cut_at_the_kernel_limit_still_parses_and_stays_bounded() -> None:
    # printk keeps ~1 KiB of text per record: a long 13 (warp exception with an ESR dump) is cut.
    line = ("NVRM: Xid (PCI:0000:2a:00): 13, pid=77, name=python, Graphics Exception: ESR "
            + " ".join(f"0x{i:06x}=0x{i * 7:08x}" for i in range(200)))[:1024]
    p = parse(line)
    assert isinstance(p, ParsedLine) and (p.code, p.pid, p.process) == (13, 77, "python")
    assert len(p.message) <= MAX_TEXT and len(p.detail) <= MAX_TEXT


def test_nvlink5_registers_cut_mid_number_are_not_read() -> None:
    whole = "RLW_REMAP Nonfatal XC1 i0 Link 10 (0x00000082 0x00000040 0x00000000 0x00000000 0x00000000 0x00000000)"
    p = parse_nvlink5(whole)
    assert p is not None and (p.intr_info, p.error_status) == (0x82, 0x40)
    cut = parse_nvlink5("RLW_REMAP Nonfatal XC1 i0 Link 10 (0x00000082 0x0000")
    assert cut is not None and (cut.intr_info, cut.error_status) == (0x82, None)  # not 0x0000
    at_a_space = parse_nvlink5("RLW_REMAP Nonfatal XC1 i0 Link 10 (0x00000082 0x00000040 ")
    assert at_a_space is not None and at_a_space.error_status == 0x40  # whole registers stay


@fuzz_settings(300)
@given(st.binary(max_size=300), st.integers(0, 300))
def test_any_bytes_around_a_marker_never_raise(junk: bytes, cut: int) -> None:
    line = (junk + b"NVRM: Xid (PCI:0000:1b:00): 154, GPU recovery action changed from 0x0 (None) to 0x2 "
            b"(Node Reboot Required)" + junk)[: cut + 40].decode("utf-8", "replace")
    p = parse(line, year=2025)
    assert p is None or isinstance(p, (ParsedLine, Malformed))


# ---- verdicts ---------------------------------------------------------------------------------------

APP_CODES = (13, 31, 43, 45)


@fuzz_settings(200)
@given(st.lists(st.tuples(st.sampled_from(APP_CODES), st.integers(0, 7), st.floats(0, WINDOW - 1)),
                min_size=1, max_size=60))
def test_application_xids_never_fail_a_node(events: list[tuple[int, int, float]]) -> None:
    # NVIDIA's immediate bucket for 13/31 is RESTART_APP, for 43 IGNORE, for 45 its workflow
    # (NONE when solo): however often and wherever they repeat, no FAIL.
    res = evaluate_xids([xid(c, NOW - dt, g) for c, g, dt in events], CAT, NOW, WINDOW, GPUS)
    assert all(r.status is not Status.FAIL for r in res), [(r.entity, r.summary) for r in res]


def test_repeated_xid13_on_one_gpu_is_shown_with_its_action_but_warns() -> None:
    r = run(*(xid(13, NOW - 3000 + 100 * i, gpu=3) for i in range(10)))["gpu3"]
    assert (r.status, r.action) == (Status.WARN, Action.DRAIN)
    assert "hardware suspected" in dict(r.evidence)["reason"]


@fuzz_settings(50)
@given(st.integers(0, 10**6).filter(lambda c: c not in CAT.xids))
def test_unknown_xid_gets_the_catalog_default(code: int) -> None:
    r = run(xid(code, NOW - 1))["gpu0"]
    assert (r.status, r.action) == (Status.WARN, CAT.unknown_xid.action)
    assert dict(r.evidence)["unknown_codes"] == str(code)


def test_unknown_xid_from_a_parsed_line_gets_the_catalog_default() -> None:
    row = next(r for r in _rows() if r["code"] == "201")
    p = parse(row["line"])
    assert isinstance(p, ParsedLine) and p.code not in CAT.xids
    ev = Event(kind="xid", code=p.code, time=NOW - 1, text=p.message, pci_bus_id=p.pci_bus_id)
    [r] = evaluate_xids([ev], CAT, NOW, WINDOW, {p.pci_bus_id: (2, "")})
    assert (r.entity, r.status, r.action) == ("gpu2", Status.WARN, CAT.unknown_xid.action)


def test_xid154_states_the_action_for_the_code_it_summarises() -> None:
    # Milder than the code's bucket: the driver's word (79 alone asks for a reboot).
    r = run(xid(79, NOW - 10), rec(NOW - 9.99, "0x1 (GPU Reset Required)"))["gpu0"]
    assert (r.status, r.action, dict(r.evidence)["code"]) == (Status.FAIL, Action.RESET_GPU, "154")
    # Stricter: a contained error (RESTART_APP alone) the driver wants drained and reset.
    r = run(xid(94, NOW - 10), rec(NOW - 9.99, "0x4 (Drain and Reset)"))["gpu0"]
    assert (r.status, r.action) == (Status.FAIL, Action.DRAIN)
    # Recovered: the driver says no action is needed any more.
    r = run(xid(95, NOW - 10), rec(NOW - 9.9, "0x1 (GPU Reset Required)"),
            xid(154, NOW - 5, detail="GPU recovery action changed from 0x1 (GPU Reset Required) to 0x0 (None)"))["gpu0"]
    assert (r.status, r.action) == (Status.OK, Action.NONE)
    assert dict(r.evidence)["codes"] == "95x1 154x2"


def test_xid154_short_action_name_is_read_by_its_value() -> None:
    r = run(xid(48, NOW - 10), rec(NOW - 9.99, "0x1 (Reset)"))["gpu0"]
    assert (r.status, r.action) == (Status.FAIL, Action.RESET_GPU)


def test_a_fault_after_the_last_xid154_is_judged_by_its_own_entry() -> None:
    r = run(rec(NOW - 600, "0x0 (None)"), xid(95, NOW - 10))["gpu0"]
    assert (r.status, r.action, dict(r.evidence)["code"]) == (Status.FAIL, Action.RESET_GPU, "95")


def test_an_unreadable_xid154_states_nothing() -> None:
    bad = xid(154, NOW - 9, detail="GPU recovery action changed")
    r = run(xid(95, NOW - 10), bad)["gpu0"]
    assert (r.status, r.action) == (Status.FAIL, Action.RESET_GPU)


def test_codes_the_catalog_does_not_link_to_xid154_keep_their_own_bucket() -> None:
    r = run(xid(46, NOW - 10), rec(NOW - 9.99, "0x0 (None)"))["gpu0"]  # 46: no 154 linkage
    assert (r.status, r.action) == (Status.FAIL, Action.RESET_GPU)


def test_recurrence_still_escalates_under_xid154() -> None:
    # The driver summarises one incident; a GPU that falls off twice in the window is podhealth's count.
    r = run(xid(79, NOW - 2000), rec(NOW - 1999.99, "0x2 (Node Reboot Required)"),
            xid(79, NOW - 10), rec(NOW - 9.99, "0x2 (Node Reboot Required)"))["gpu0"]
    assert (r.status, r.action) == (Status.FAIL, Action.REPLACE)


def test_xid154_linkage_is_nvidias_column(shared_fixtures: Path) -> None:
    with open(shared_fixtures / "xid_catalog" / "nvidia_Xid-Catalog_sheet_Xids.csv", encoding="utf-8") as f:
        rows = list(csv.reader(f))
    head = [h.replace("\n", " ").strip() for h in rows[0]]
    code_i, link_i = head.index("Code"), head.index("Xid 154 linkage")
    linked = {int(r[code_i]) for r in rows[1:] if r[code_i].strip().isdigit() and r[link_i].strip()}
    assert CAT.xid154_linked == linked


def test_a_line_stamped_ahead_of_the_clock_is_an_event_of_now(tmp_path: Path) -> None:
    # rsyslog wrote it while the node's clock was two days ahead; NTP has stepped it back since.
    log = tmp_path / "kern.log"
    log.write_text("2025-01-17T03:00:00+00:00 dgx01 kernel: NVRM: Xid (PCI:0000:1b:00): 79, pid='<unknown>', "
                   "name=<unknown>, GPU has fallen off the bus.\n")
    now = 1_736_910_000.0  # 2025-01-15T03:00:00Z
    c = create(loads(f"paths: {{kmsg: {log}}}\ncollectors: {{kmsg: {{from_start: true}}}}\n"),
               nvml=None, boot_time=lambda: now - 1000, clock=lambda: now)
    [ev] = c.collect().events
    assert ev.time == now


def test_a_syslog_line_read_across_new_year_belongs_to_last_year(tmp_path: Path) -> None:
    # Syslog prints no year: "Dec 31" read on Jan 1 is last year's, not this December's.
    import time as _time
    log = tmp_path / "kern.log"
    log.write_text("Dec 31 23:59:00 dgx01 kernel: NVRM: Xid (PCI:0000:1b:00): 79, pid='<unknown>', "
                   "name=<unknown>, GPU has fallen off the bus.\n")
    now = _time.mktime((2025, 1, 1, 0, 10, 0, 0, 0, -1))
    c = create(loads(f"paths: {{kmsg: {log}}}\ncollectors: {{kmsg: {{from_start: true}}}}\n"),
               nvml=None, boot_time=lambda: now - 1000, clock=lambda: now)
    [ev] = c.collect().events
    assert ev.time == _time.mktime((2024, 12, 31, 23, 59, 0, 0, 0, -1))


def test_journal_multi_line_fallen_off_bus_takes_the_first_lines_address_and_time(tmp_path: Path) -> None:
    # R570+ open modules print it without an Xid; `journalctl -k -o short` indents the record's
    # continuation lines under the message instead of repeating the header.
    import time as _time
    log = tmp_path / "kern.log"
    log.write_text("Jan 15 03:12:44 dgx01 kernel: NVRM: The NVIDIA GPU 0000:4e:00.0\n"
                   "                              NVRM: (PCI ID: 10de:2330) installed in this system has\n"
                   "                              NVRM: fallen off the bus and is not responding to commands.\n"
                   "Jan 15 03:12:44 dgx01 kernel: NVRM: The NVIDIA probe routine failed for 1 device(s).\n")
    now = _time.mktime((2025, 1, 15, 3, 20, 0, 0, 0, -1))
    c = create(loads(f"paths: {{kmsg: {log}}}\ncollectors: {{kmsg: {{from_start: true}}}}\n"),
               nvml=None, boot_time=lambda: now - 1000, clock=lambda: now, gpu_index_of={"0000:4e:00.0": 2}.get)
    [ev] = c.collect().events
    assert (ev.kind, ev.code, ev.pci_bus_id, ev.gpu) == ("kernel", 79, "0000:4e:00.0", 2)
    assert ev.time == _time.mktime((2025, 1, 15, 3, 12, 44, 0, 0, -1))
    r = {x.entity: x for x in evaluate_xids([ev], CAT, now, WINDOW, {"0000:4e:00.0": (2, "")})}["gpu2"]
    assert (r.status, r.action) == (Status.FAIL, Action.REBOOT)
