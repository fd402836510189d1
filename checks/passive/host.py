"""Host checks: the systemd units a GPU node cannot work without."""

from __future__ import annotations

from podhealth.checks.passive.context import Context
from podhealth.checks.passive.result import fail, ok, unknown
from podhealth.vocab import Action, CheckResult

# Losing the fabric manager un-trains the NVSwitch fabric: only a reboot brings a node back cleanly.
_UNIT_ACTION = {"nvidia-fabricmanager.service": Action.REBOOT}


def systemd_units(ctx: Context) -> list[CheckResult]:
    states = {s.label("unit"): s.label("state") for s in ctx.samples("systemd_unit_state_info")}
    out: list[CheckResult] = []
    # the config's list, then what this kind of node needs (a GB200 tray: nvidia-imex.service)
    for unit in dict.fromkeys([*ctx.required_units, *ctx.profile.units]):
        st = states.get(unit)
        if st is None or st == "unknown":
            out.append(unknown("systemd_unit", unit, "unit state not known"))
        elif st != "active":
            out.append(fail("systemd_unit", unit, f"required unit is {st}", _UNIT_ACTION.get(unit, Action.DRAIN), state=st))
        else:
            out.append(ok("systemd_unit", unit, state=st))
    return out
