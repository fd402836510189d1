"""NVMe rules: a dead controller or a SMART critical warning takes the node's scratch and
container storage down; wear and spare warn before that.

Per controller, first match wins:
  - sysfs state dead / deleting                           FAIL DRAIN (the kernel gave up on it)
  - SMART log could not be read (nvme-cli failed)          UNKNOWN (never FAIL)
  - critical_warning != 0                                  FAIL DRAIN, or WARN when the profile's
                                                           nvme_critical_fail is 0
  - media_errors grew within checks.rate_window            WARN, or FAIL DRAIN when nvme_media_errors_fail is 1
  - percentage_used >= nvme_percentage_used_warn,
    available spare < nvme_available_spare_warn_pct,
    or state resetting / connecting                        WARN
Without nvme-cli the SMART series are absent: the controller is judged on its sysfs state alone.
"""

from __future__ import annotations

from podhealth.checks.passive.context import Context
from podhealth.checks.passive.result import fail, ok, unknown, warn
from podhealth.collectors.nvme_parse import decode_critical_warning
from podhealth.vocab import Action, CheckResult, Sample


def _by_ctrl(ctx: Context, name: str) -> dict[str, Sample]:
    return {s.label("controller"): s for s in ctx.samples(name)}


def nvme(ctx: Context) -> list[CheckResult]:
    t = ctx.profile.thresholds
    infos = _by_ctrl(ctx, "nvme_info")
    if not infos:
        return [ok("nvme", "node", "no NVMe controllers")]
    smart_up = _by_ctrl(ctx, "nvme_smart_up")
    crit = _by_ctrl(ctx, "nvme_critical_warning")
    media = _by_ctrl(ctx, "nvme_media_errors")
    used = _by_ctrl(ctx, "nvme_percentage_used")
    spare = _by_ctrl(ctx, "nvme_available_spare_percent")
    out: list[CheckResult] = []
    for ctrl, info in sorted(infos.items()):
        state = info.label("state")
        ev: dict[str, object] = {"model": info.label("model"), "serial": info.label("serial"), "state": state}
        if state in ("dead", "deleting"):
            out.append(fail("nvme", ctrl, f"NVMe controller {ctrl} is {state}", Action.DRAIN, **ev))
            continue
        up = smart_up.get(ctrl)
        if up is not None and up.value == 0:
            out.append(unknown("nvme", ctrl, "SMART log could not be read", **ev))
            continue
        if up is None:
            ev["smart"] = "not read (nvme-cli not installed)"
        c = crit.get(ctrl)
        if c is not None and c.value:
            bits = "; ".join(decode_critical_warning(int(c.value)))
            ev["critical_warning"] = f"0x{int(c.value):02x}"
            if t["nvme_critical_fail"]:
                out.append(fail("nvme", ctrl, f"NVMe critical warning: {bits}", Action.DRAIN, **ev))
            else:
                out.append(warn("nvme", ctrl, f"NVMe critical warning: {bits}", **ev))
            continue
        m = media.get(ctrl)
        inc = ctx.increase(m) if m is not None else None
        if inc is not None and inc > 0:
            ev["media_errors"] = int(m.value) if m is not None else "n/a"
            summary = f"{int(inc)} new NVMe media errors"
            if t["nvme_media_errors_fail"]:
                out.append(fail("nvme", ctrl, summary, Action.DRAIN, **ev))
            else:
                out.append(warn("nvme", ctrl, summary, **ev))
            continue
        u, sp = used.get(ctrl), spare.get(ctrl)
        if u is not None and u.value >= t["nvme_percentage_used_warn"]:
            out.append(warn("nvme", ctrl, f"NVMe wear: {u.value:.0f}% of rated life used",
                            limit=t["nvme_percentage_used_warn"], **ev))
        elif sp is not None and sp.value < t["nvme_available_spare_warn_pct"]:
            out.append(warn("nvme", ctrl, f"NVMe available spare {sp.value:.0f}%",
                            limit=t["nvme_available_spare_warn_pct"], **ev))
        elif state in ("resetting", "connecting"):
            out.append(warn("nvme", ctrl, f"NVMe controller {ctrl} is {state}", **ev))
        else:
            out.append(ok("nvme", ctrl, **ev))
    return out
