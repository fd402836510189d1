"""Host memory rules: an uncorrectable ECC error fences, a correctable rate warns, naming the DIMM.

`edac_ue`: EDAC's ue_count (and ue_noinfo_count) count since the driver loaded; an uncorrectable
error that the node survived has poisoned a page, and the DIMM must be looked at before the node
runs jobs again: DRAIN, with the DIMM labels that counted it in evidence (what a technician swaps).
`edac_ce`: corrected errors per hour on a memory controller over checks.rate_window above the
profile's edac_ce_per_hour warn (a DIMM on its way out; rules.yaml holds it for a few readings).
`kernel_ras`: the same facts from the kernel log, for nodes whose EDAC sysfs is missing or late:
an `EDAC ... UE` summary line or an MCE record whose MCi_STATUS has UC set, within the window, and
the corrected errors that `EDAC MCn: <count> CE ...` lines report, judged per memory controller by
the same rate rule as edac_ce (`ce_rate_verdict`). The lines carry their own times, so the rate is
over the span they cover (at least the profile's edac_ce_min_span_s): a DIMM that logs 16 corrected
errors in 8 s (a site's "faulty RAM") is 16 per 5 minutes, ~2x the hourly limit, not 16 an hour.
Corrected machine-check records (`mce: ... Bank N: <status>`, UC clear) are counted the same way
under entity "mce", for nodes whose EDAC driver does not decode them into a memory controller.
"""

from __future__ import annotations

from podhealth.checks.passive.context import Context
from podhealth.checks.passive.result import fail, ok, unknown, warn
from podhealth.vocab import Action, CheckResult

MAX_LABELS = 4


def _no_edac(ctx: Context, check: str) -> CheckResult | None:
    if not ctx.value("edac_memory_controllers"):
        return unknown(check, "node", "no EDAC memory controllers (EDAC driver not loaded): memory errors are not visible")
    return None


def _dimms(ctx: Context, mc: str, kind: str, increased: bool = False) -> str:
    """The DIMMs of `mc` with `kind` errors (or, with increased, whose count grew in the window)."""
    found: list[tuple[float, str]] = []
    for s in ctx.samples("edac_dimm_errors"):
        if s.label("mc") != mc or s.label("type") != kind:
            continue
        n = ctx.increase(s) if increased else s.value
        if n:
            found.append((n, f"{s.label('label') or s.label('dimm')}={int(n)}"))
    return ", ".join(t for _, t in sorted(found, reverse=True)[:MAX_LABELS]) or "not pinned to a DIMM"


def edac_ue(ctx: Context) -> list[CheckResult]:
    missing = _no_edac(ctx, "edac_ue")
    if missing:
        return [missing]
    out: list[CheckResult] = []
    noinfo = {s.label("mc"): s.value for s in ctx.samples("edac_mc_noinfo_errors") if s.label("type") == "ue"}
    for s in ctx.samples("edac_mc_errors"):
        if s.label("type") != "ue":
            continue
        mc = s.label("mc")
        n = max(s.value, noinfo.get(mc, 0.0))
        if n > 0:
            out.append(fail("edac_ue", mc, f"{int(n)} uncorrectable memory errors on {mc} since boot", Action.DRAIN,
                            ue=int(s.value), ue_noinfo=int(noinfo.get(mc, 0)), dimms=_dimms(ctx, mc, "ue")))
        else:
            out.append(ok("edac_ue", mc))
    return out


def edac_ce(ctx: Context) -> list[CheckResult]:
    missing = _no_edac(ctx, "edac_ce")
    if missing:
        return [missing]
    limit = ctx.profile.threshold("edac_ce_per_hour")
    out: list[CheckResult] = []
    for s in ctx.samples("edac_mc_errors"):
        if s.label("type") != "ce":
            continue
        mc = s.label("mc")
        out.append(ce_rate_verdict("edac_ce", mc, ctx.rate_per_hour(s), limit, "edac sysfs ce_count",
                                   ce=int(s.value), dimms=_dimms(ctx, mc, "ce", True)))
    return out


def ce_rate_verdict(check: str, mc: str, rate: float | None, limit: float, source: str,
                    **evidence: object) -> CheckResult:
    """THE corrected-memory-error rate rule, whichever source counted the errors: above the
    profile's edac_ce_per_hour it WARNs (a DIMM on its way out; replace it at the next window)."""
    if rate is not None and rate > limit:
        return warn(check, mc, f"corrected memory errors at {rate:.0f}/h on {mc} ({source})",
                    per_hour=round(rate, 1), limit=limit, source=source, **evidence)
    return ok(check, mc, **evidence)


def kernel_ce_rates(ctx: Context) -> dict[str, tuple[float, int, str]]:
    """mc -> (corrected errors per hour, errors, the DIMM labels) from the EDAC lines in the
    window, over the span they cover but at least edac_ce_min_span_s (one line reporting 16384 is
    a rate; one error alone is not an hour's worth)."""
    floor = ctx.profile.threshold("edac_ce_min_span_s")
    by_mc: dict[str, list[tuple[float, int, str]]] = {}
    for e in ctx.events:
        if e.kind == "edac" and e.subcode == 0 and e.time >= ctx.now - ctx.window:
            by_mc.setdefault(e.device or "mc?", []).append((e.time, e.code, e.text))
        elif e.kind == "mce" and e.subcode == 0 and e.device.startswith("bank") and e.time >= ctx.now - ctx.window:
            # a corrected machine-check record (MCi_STATUS UC clear) where no EDAC driver decodes
            # it into a memory controller: counted under "mce", one error per record
            by_mc.setdefault("mce", []).append((e.time, e.code, e.text))
    out: dict[str, tuple[float, int, str]] = {}
    for mc, evs in sorted(by_mc.items()):
        n = sum(c for _, c, _ in evs)
        span = max(max(t for t, _, _ in evs) - min(t for t, _, _ in evs), floor, 1.0)
        out[mc] = (n / span * 3600.0, n, max(evs)[2])
    return out


def kernel_ras(ctx: Context) -> list[CheckResult]:
    recent = [e for e in ctx.events if e.kind in ("edac", "mce") and e.time >= ctx.now - ctx.window]
    bad = [e for e in recent if e.subcode == 1]
    if bad:
        last = max(bad, key=lambda e: e.time)
        return [fail("kernel_ras", "node", f"{len(bad)} uncorrectable memory / machine-check errors in the kernel log",
                     Action.DRAIN, lines=len(bad), last=last.text, source=last.device)]  # the DRAIN covers the CEs
    corrected = sum(e.code for e in recent if e.kind == "edac")
    limit = ctx.profile.threshold("edac_ce_per_hour")
    per_mc = [ce_rate_verdict("kernel_ras", mc, rate, limit, "kernel log EDAC lines", ce_in_window=n, last=last)
              for mc, (rate, n, last) in kernel_ce_rates(ctx).items()]
    return [ok("kernel_ras", "node", "no uncorrectable memory or machine-check error in the kernel log",
               corrected_in_window=corrected, mce_lines=sum(1 for e in recent if e.kind == "mce")), *per_mc]
