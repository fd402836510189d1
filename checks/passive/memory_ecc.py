"""Host memory rules: an uncorrectable ECC error fences, a correctable rate warns, naming the DIMM.

`edac_ue`: EDAC's ue_count (and ue_noinfo_count) count since the driver loaded; an uncorrectable
error that the node survived has poisoned a page, and the DIMM must be looked at before the node
runs jobs again: DRAIN, with the DIMM labels that counted it in evidence (what a technician swaps).
`edac_ce`: corrected errors per hour on a memory controller over checks.rate_window above the
profile's edac_ce_per_hour warn (a DIMM on its way out; rules.yaml holds it for a few readings).
`kernel_ras`: the same facts from the kernel log, for nodes whose EDAC sysfs is missing or late:
an `EDAC ... UE` summary line or an MCE record whose MCi_STATUS has UC set, within the window.
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
        rate = ctx.rate_per_hour(s)
        if rate is not None and rate > limit:
            out.append(warn("edac_ce", mc, f"corrected memory errors at {rate:.0f}/h on {mc}",
                            per_hour=round(rate, 1), limit=limit, ce=int(s.value), dimms=_dimms(ctx, mc, "ce", True)))
        else:
            out.append(ok("edac_ce", mc, ce=int(s.value)))
    return out


def kernel_ras(ctx: Context) -> list[CheckResult]:
    recent = [e for e in ctx.events if e.kind in ("edac", "mce") and e.time >= ctx.now - ctx.window]
    bad = [e for e in recent if e.subcode == 1]
    if bad:
        last = max(bad, key=lambda e: e.time)
        return [fail("kernel_ras", "node", f"{len(bad)} uncorrectable memory / machine-check errors in the kernel log",
                     Action.DRAIN, lines=len(bad), last=last.text, source=last.device)]
    corrected = sum(e.code for e in recent if e.kind == "edac")
    return [ok("kernel_ras", "node", "no uncorrectable memory or machine-check error in the kernel log",
               corrected_in_window=corrected, mce_lines=sum(1 for e in recent if e.kind == "mce"))]
