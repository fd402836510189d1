"""The kernel-log parser: own table of every line shape, plus the real-capture corpus."""

from __future__ import annotations

import csv
import re
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest

from podhealth.collectors.xid_parse import (
    LineAssembler, Malformed, ParsedLine, is_candidate, parse, parse_line, parse_nvlink5,
    parse_recovery,
)
from podhealth.pci import normalise as normalise_pci

OWN = Path(__file__).resolve().parent.parent / "fixtures" / "kmsg"


def _rows(name: str) -> list[dict[str, str]]:
    with open(OWN / name, encoding="utf-8", newline="") as f:
        return list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))


def _expected_time(spec: str) -> tuple[float | None, float | None]:
    if not spec:
        return None, None
    kind, _, val = spec.partition(":")
    if kind == "mono":
        return None, float(val)
    if kind == "utc":
        return datetime.fromisoformat(val).replace(tzinfo=timezone.utc).timestamp(), None
    return time.mktime(time.strptime(val, "%Y-%m-%d %H:%M:%S")), None  # local, as dmesg -T prints


@pytest.mark.parametrize("row", _rows("lines.tsv") + _rows("generations.tsv"), ids=lambda r: r["line"][:50])
def test_own_line_table(row: dict[str, str]) -> None:
    p = parse(row["line"], year=2025)
    kind = row["kind"]
    if kind == "none":
        assert p is None and not is_candidate(row["line"])
        return
    if kind == "malformed":
        assert isinstance(p, Malformed) and is_candidate(row["line"])
        assert parse_line(row["line"]) is None
        return
    assert isinstance(p, ParsedLine), p
    assert (p.kind, p.code) == (kind, int(row["code"]))
    if kind != "sxid":
        assert p.pci_bus_id == row["pci"]
    assert p.pid == (int(row["pid"]) if row["pid"] else None)
    assert p.process == row["process"]
    assert p.device == row["device"]
    assert p.subcode == (int(row["subcode"], 0) if row["subcode"] else None)
    wall, mono = _expected_time(row["time"])
    assert p.wall_time == pytest.approx(wall) if wall is not None else p.wall_time is None or mono is not None
    if mono is not None:
        assert p.mono_time == pytest.approx(mono)
    assert p.message.startswith(("NVRM:", "nvidia-nvswitch")), "timestamp prefix must not leak into the text"


@pytest.mark.parametrize("raw, want", [
    ("PCI:0000:18:00", "0000:18:00.0"),
    ("0000:18:00.0", "0000:18:00.0"),
    ("18:00.0", "0000:18:00.0"),
    ("00000000:B3:00.1", "0000:b3:00.1"),
    ("PCI:0008:01:00", "0008:01:00.0"),
    ("", None),
    ("PCI:zz:00", None),
])
def test_pci_forms(raw: str, want: str | None) -> None:
    assert normalise_pci(raw) == want


def test_recovery_action_and_nvlink5_payload() -> None:
    r = parse_recovery("GPU recovery action changed from 0x4 (Drain and Reset) to 0x1 (GPU Reset Required)")
    assert r is not None and (r.from_value, r.from_name, r.to_value, r.to_name) == (4, "Drain and Reset", 1, "GPU Reset Required")
    n = parse_nvlink5("TLW_RX/TLW_RX_PIPE0 Fatal XC0 i1 Link 12 (0x0000000a 0x00000004 0x00000000 0x00000000)")
    assert n is not None
    assert (n.unit, n.fatal, n.cross_contain, n.injected, n.link) == ("TLW_RX/TLW_RX_PIPE0", True, 0, 1, 12)
    assert (n.intr_info, n.error_status) == (0xA, 4)
    truncated = parse_nvlink5("NETIR Fatal XC0 i0 Link -1 (0x000fe406")
    assert truncated is not None and truncated.registers == (0x000FE406,) and truncated.error_status is None
    assert parse_nvlink5("RLW_REMAP Nonfatal XC1 i0 Link 10 ").registers == ()  # type: ignore[union-attr]


def test_not_ours_vs_malformed() -> None:
    assert parse("NVRM: GPU Board Serial Number: 1650423013443") is None
    assert parse("random text mentioning Xid without the shape") is None
    assert isinstance(parse("NVRM: Xid (PCI:0000:01:00): abc"), Malformed)
    # A truncated line still carries its code: it parses.
    p = parse_line("[1.0] nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 20009, Non-fatal, Li")
    assert p is not None and p.code == 20009 and p.fatal is False


def test_assembler_joins_split_fallen_off_bus_and_absorbs_sxid_continuations() -> None:
    a = LineAssembler()
    lines = [
        "[ 1843.308145] NVRM: The NVIDIA GPU 0000:b3:00.0",
        "               NVRM: (PCI ID: 10de:26b5) installed in this system has",
        "               NVRM: fallen off the bus and is not responding to commands.",
        "[2.0] nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 20034, Fatal, Link 48 LTSSM Fault Up",
        "[2.0] nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 20034, Severity 1 Engine instance 48 Sub-engine instance 00",
        "[2.0] nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 20034, Data {0x1, 0x2}",
        "[2.1] nvidia-nvswitch2: SXid (PCI:0000:07:00.0): 20034, Severity 1 Engine instance 60 Sub-engine instance 00",
    ]
    out = [p for p in (a.feed(x) for x in lines) if p is not None] + a.drain()
    assert isinstance(out[0], ParsedLine) and out[0].mono_time == pytest.approx(1843.308145)
    assert [(p.kind, p.code, p.device or p.pci_bus_id) for p in out if isinstance(p, ParsedLine)] == [
        ("fallen_off_bus", 79, "0000:b3:00.0"),
        ("sxid", 20034, "nvswitch1"),
        ("sxid", 20034, "nvswitch2"),  # its header was never seen: the continuation stands for it
    ]


# The record shape of NVSwitch SXids as printed by `dmesg | grep SXid` (Lambda's troubleshooting
# guide, docs.lambdalabs.com "Troubleshooting and debugging", four 22013 records on nvswitch3):
# header, "Severity ... Engine instance <link>", "Data {...}". Here the three lines of one record
# arrive out of order and another switch's records interleave, as journald relays them.
_SXID_22013 = [
    "[   60.006338] kernel: nvidia-nvswitch3: SXid (PCI:0000:0a:00.0): 22013, Non-fatal, Link 55 Minion Link DLREQ interrupt",
    "[   60.008040] kernel: nvidia-nvswitch3: SXid (PCI:0000:0a:00.0): 22013, Severity 0 Engine instance 55 Sub-engine instance 00",
    "[   60.010058] kernel: nvidia-nvswitch3: SXid (PCI:0000:0a:00.0): 22013, Data {0x00000037, 0x00000037, 0x00000000, 0x00000037, 0x80005302, 0x00000000, 0x00000000, 0x00000000, 0x00000000}",
    "[   60.015379] kernel: nvidia-nvswitch3: SXid (PCI:0000:0a:00.0): 22013, Severity 0 Engine instance 54 Sub-engine instance 00",
    "[   60.017388] kernel: nvidia-nvswitch3: SXid (PCI:0000:0a:00.0): 22013, Data {0x00000036, 0x00000036, 0x00000000, 0x00000036, 0x80005302, 0x00000000, 0x00000000, 0x00000000, 0x00000000}",
    "[   60.013283] kernel: nvidia-nvswitch3: SXid (PCI:0000:0a:00.0): 22013, Non-fatal, Link 54 Minion Link DLREQ interrupt",
    *[f"[   60.0{19 + i}000] kernel: nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 20009, Non-fatal, Link {i:02d} RX Short Error Rate"
      for i in range(20)],
    "[   60.020455] kernel: nvidia-nvswitch3: SXid (PCI:0000:0a:00.0): 22013, Non-fatal, Link 51 Minion Link DLREQ interrupt",
    *[f"[   60.0{40 + i}000] kernel: nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 20009, Data {{0x{i:08x}}}" for i in range(20)],
    "[   60.022557] kernel: nvidia-nvswitch3: SXid (PCI:0000:0a:00.0): 22013, Severity 0 Engine instance 51 Sub-engine instance 00",
    "[   60.024563] kernel: nvidia-nvswitch3: SXid (PCI:0000:0a:00.0): 22013, Data {0x00000033, 0x00000033, 0x00000000, 0x00000033, 0x80005302, 0x00000000, 0x00000000, 0x00000000, 0x00000000}",
]


def test_sxid_one_event_per_record_whatever_the_line_order() -> None:
    a = LineAssembler()
    out = [p for p in (a.feed(x) for x in _SXID_22013) if isinstance(p, ParsedLine)] + a.drain()
    by = [(p.device, p.code) for p in out]
    # three records of 22013 (links 55, 54, 51), twenty of 20009 whose Data lines came 20 lines late
    assert by.count(("nvswitch3", 22013)) == 3, out
    assert by.count(("nvswitch1", 20009)) == 20
    assert all(p.fatal is False for p in out), "every record is its header (Non-fatal), not a bare continuation"


def test_sxid_record_without_its_header_counts_once() -> None:
    a = LineAssembler()
    lines = [x for x in _SXID_22013[:3] if "Non-fatal" not in x]  # Severity + Data of one record, header lost
    assert [a.feed(x) for x in lines] == [None, None]
    out = a.drain()
    assert [(p.device, p.code) for p in out] == [("nvswitch3", 22013)]
    assert a.drain() == []


@pytest.mark.parametrize("line", [
    # GSP-RM's wording on the RPC path (../shared/fixtures/xid_kernel_logs/dmesg_nv_err_gpu_is_lost_*)
    "[   35.564060] NVRM: nvCheckOkFailedNoLog: Check failed: GPU lost from the bus [NV_ERR_GPU_IS_LOST] "
    "(0x0000000F) returned from nvdEngineDumpCallbackHelper(pGpu, pPrbEnc, pNvDumpState, pEngineCallback) @ nv_debug_dump.c:274",
    "NVRM: GPU5 rpcRmApiFree_GSP: GspRmFree failed status=NV_ERR_GPU_IS_LOST",
    "[Sun Apr 14 12:48:42 2024] NVRM: GPU 0000:81:00.0: RmInitAdapter failed! (0x25:0x40:1470)",
    "[Sun Apr 14 12:48:42 2024] NVRM: GPU 0000:81:00.0: rm_init_adapter failed, device minor number 0",
])
def test_lost_gpu_phrasings_without_xid_are_xid79(line: str) -> None:
    p = parse_line(line, year=2024)
    assert p is not None and (p.kind, p.code) == ("fallen_off_bus", 79)
    if "0000:81:00.0" in line:
        assert p.pci_bus_id == "0000:81:00.0"


def test_address_less_lost_lines_after_an_xid79_are_its_echo() -> None:
    a = LineAssembler()
    lines = [
        "[  100.000000] NVRM: Xid (PCI:0000:91:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
        "[  100.000004] NVRM: GPU 0000:91:00.0: GPU has fallen off the bus.",
        "[  100.200000] NVRM: nvCheckOkFailedNoLog: Check failed: GPU lost from the bus [NV_ERR_GPU_IS_LOST] (0x0000000F)",
        "[  100.300000] NVRM: nvCheckOkFailedNoLog: Check failed: GPU lost from the bus [NV_ERR_GPU_IS_LOST] (0x0000000F)",
    ]
    out = [p for p in (a.feed(x) for x in lines) if isinstance(p, ParsedLine)]
    assert [(p.kind, p.code, p.pci_bus_id) for p in out] == [("xid", 79, "0000:91:00.0")]
    # the same line an hour later, with no Xid near it, is a GPU lost again
    later = a.feed("[ 3700.000000] NVRM: nvCheckOkFailedNoLog: Check failed: GPU lost from the bus [NV_ERR_GPU_IS_LOST]")
    assert isinstance(later, ParsedLine) and later.code == 79


# ---- real captures (../shared/fixtures) -----------------------------------------------------

# Independent oracle: the token after "Xid (...): " / "SXid (...): " is the code.
_ORACLE = re.compile(r"(S?)Xid \(PCI:[^)]*\):\s*([^\s,]*)")


def _oracle(line: str) -> tuple[str, int | None] | None:
    m = _ORACLE.search(line)
    if m:
        tok = m.group(2)
        return ("sxid" if m.group(1) else "xid", int(tok) if tok.isdigit() else None)
    if re.search(r"fallen off the bus|GPU lost from the bus|NV_ERR_GPU_IS_LOST|RmInitAdapter failed|rm_init_adapter failed",
                 line):
        return ("fallen_off_bus", 79)
    return None


def test_corpus_tsv_every_line_yields_its_code(shared_fixtures: Path) -> None:
    path = shared_fixtures / "xid_kernel_logs" / "xid_sxid_lines_from_unit_tests_nvsentinel_gpud.tsv"
    with open(path, encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    assert len(rows) == 183
    seen_codes = set()
    for row in rows:
        line = row["log_line"]
        want = _oracle(line)
        assert want is not None, f"corpus line of an unexpected shape: {line!r}"
        p = parse(line)
        if want[1] is None:
            assert isinstance(p, Malformed), line
            continue
        assert isinstance(p, ParsedLine), line
        assert (p.kind, p.code) == want, line
        if p.kind == "xid":
            assert re.fullmatch(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]", p.pci_bus_id), line
        pid = re.search(r"pid=(\d+)", line)
        assert p.pid == (int(pid.group(1)) if pid else None), line
        seen_codes.add(p.code)
    # The corpus' own summary of what it contains.
    assert {8, 13, 31, 32, 46, 48, 63, 64, 69, 74, 79, 94, 102, 119, *range(144, 151), 154} <= seen_codes
    assert {12028, 12033, 20009, 20034, 22013, 24007, 26006, 26007, 26008, 28006} <= seen_codes


def test_corpus_logs_every_marked_line_parses(shared_fixtures: Path) -> None:
    logs = sorted((shared_fixtures / "xid_kernel_logs").glob("*.log"))
    assert len(logs) >= 10
    total = 0
    for log in logs:
        for line in log.read_text(encoding="utf-8", errors="replace").splitlines():
            want = _oracle(line)
            if want is None:
                assert parse(line) is None, (log.name, line)
                continue
            total += 1
            p = parse(line, year=2024)
            assert isinstance(p, ParsedLine) and (p.kind, p.code) == want, (log.name, line)
            if not line[:1].isspace() and not log.name.startswith("kmsg_gb200_xid145"):  # that one has none
                assert p.wall_time is not None or p.mono_time is not None, f"{log.name}: timestamp lost: {line!r}"
    assert total > 600  # the xid13 capture alone holds 636 Xid lines


def test_corpus_recovery_actions_and_timestamps(shared_fixtures: Path) -> None:
    log = shared_fixtures / "xid_kernel_logs" / "kmsg_gb200_xid149_154_nvlink5_recovery_action.log"
    got = [p for p in map(parse_line, log.read_text().splitlines()) if p and p.code == 154]
    assert [(p.pci_bus_id, p.recovery.to_name if p.recovery else None) for p in got] == [
        ("0009:01:00.0", "Drain and Reset"), ("0019:01:00.0", "GPU Reset Required"),
        ("0018:01:00.0", "GPU Reset Required"), ("0008:01:00.0", "GPU Reset Required"),
    ]
    assert got[0].mono_time == pytest.approx(171167.621162)
    iso = shared_fixtures / "xid_kernel_logs" / "dmesg_iso_xid48_63_94_dbe_rowremap_contained_peermem.log"
    first = next(p for p in map(parse_line, iso.read_text().splitlines()) if p)
    assert first.code == 48
    assert first.wall_time == pytest.approx(datetime(2024, 11, 15, 12, 2, 3, 470068, tzinfo=timezone.utc).timestamp())
