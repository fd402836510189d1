"""Corrected memory errors reported only in the kernel log feed the edac_ce rate rule.

The lines below follow the real skx_edac / sb_edac summary format of
../shared/fixtures/host_errors/dmesg_T_edac_skx_ce_read_and_scrub_overflow_retry_rd_err_log.log
(`EDAC MC0: <n> CE memory read error on CPU_SrcID#0_MC#0_Chan#0_DIMM#1 (...)`): sixteen single
corrected errors within eight seconds, as a site saw before it called the DIMM faulty.
"""

from __future__ import annotations

from podhealth.checks import profiles
from podhealth.checks.passive import memory_ecc
from podhealth.checks.passive.context import Context
from podhealth.checks.passive.rates import RateTracker
from podhealth.collectors import ras_parse
from podhealth.collectors.xid_parse import line_timestamps
from podhealth.snapshot import Snapshot
from podhealth.vocab import Event, Status

LINE = ("[Wed Dec  6 21:24:{s:02d} 2023] EDAC MC0: 1 CE memory read error on CPU_SrcID#0_MC#0_Chan#0_DIMM#1 "
        "(channel:0 slot:1 page:0x20edba9 offset:0x4c0 grain:32 syndrome:0x0 - err_code:0x0101:0x0090 socket:0 "
        "imc:0 rank:0 bg:3 ba:2 row:0x106ce col:0x258)")


def _events(lines: list[str]) -> tuple[Event, ...]:
    out = []
    for line in lines:
        r = ras_parse.parse(line)
        assert r is not None, line
        wall, _ = line_timestamps(line[:r.start], 2023)
        assert wall is not None
        out.append(Event(kind=r.kind, code=r.count, time=wall, text=r.message, device=r.source,
                         subcode=int(bool(r.uncorrected))))
    return tuple(out)


def _judge(events: tuple[Event, ...], overrides: dict[str, object] | None = None) -> list:  # type: ignore[type-arg]
    now = max(e.time for e in events) + 30
    ctx = Context(snapshot=Snapshot(now, {}), profile=profiles.load("generic", overrides), now=now,
                  rates=RateTracker(3600), events=events, window=3600.0)
    return memory_ecc.kernel_ras(ctx)


def test_sixteen_corrected_errors_in_eight_seconds_warn_naming_the_controller() -> None:
    evs = _events([LINE.format(s=30 + i // 2) for i in range(16)])
    assert max(e.time for e in evs) - min(e.time for e in evs) <= 8
    res = {(r.check, r.entity): r for r in _judge(evs)}
    assert res[("kernel_ras", "node")].status is Status.OK  # nothing uncorrectable
    mc0 = res[("kernel_ras", "mc0")]
    assert mc0.status is Status.WARN, mc0
    ev = dict(mc0.evidence)
    assert ev["ce_in_window"] == "16" and ev["source"] == "kernel log EDAC lines"
    assert "DIMM#1" in ev["last"]


def test_a_corrected_error_now_and_then_is_no_rate() -> None:
    evs = _events([LINE.format(s=10), LINE.format(s=50)])
    assert all(r.status is Status.OK for r in _judge(evs))


def test_the_kernel_lines_use_edac_ce_s_limit() -> None:
    evs = _events([LINE.format(s=30 + i // 2) for i in range(16)])
    # the same profile threshold governs both sources: raised above the burst's rate, no WARN
    assert all(r.status is Status.OK for r in _judge(evs, {"thresholds.edac_ce_per_hour": 1000}))


# The Intel record format of arch/x86 mce (as ../shared/fixtures/host_errors' sb_edac capture
# decodes it: "Bank 7: cc00418000010091", UC bit 61 clear = corrected), without an EDAC driver.
MCE = "[Wed Dec  6 21:24:{s:02d} 2023] mce: [Hardware Error]: CPU 0: Machine Check: 0 Bank 7: cc00418000010091"


def test_corrected_machine_check_records_without_edac_feed_the_same_rule() -> None:
    evs = _events([MCE.format(s=30 + i // 2) for i in range(16)])
    assert {(e.kind, e.subcode, e.device) for e in evs} == {("mce", 0, "bank7")}
    res = {(r.check, r.entity): r for r in _judge(evs)}
    assert res[("kernel_ras", "mce")].status is Status.WARN
    assert res[("kernel_ras", "node")].status is Status.OK
