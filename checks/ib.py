"""InfiniBand checks: port state, rate, error counters over the window, expected port count."""

from __future__ import annotations

from podhealth.checks.context import Context
from podhealth.checks.result import fail, ok, warn
from podhealth.vocab import Action, CheckResult

IB_ACTIVE = 4
PHYS_LINKUP = 5


def _entity(device: str, port: str) -> str:
    return f"{device}/{port}"


def ib_port(ctx: Context) -> list[CheckResult]:
    p = ctx.profile
    out: list[CheckResult] = []
    states = ctx.samples("infiniband_port_state")
    expected_ports = p.compute_hcas + p.storage_hcas
    if expected_ports and len(states) < expected_ports:
        out.append(fail("ib_port", "node", f"{len(states)} of {expected_ports} InfiniBand ports present",
                        Action.REBOOT, present=len(states), expected=expected_ports))
    phys = {(s.label("device"), s.label("port")): s for s in ctx.samples("infiniband_port_physical_state")}
    rate = {(s.label("device"), s.label("port")): s for s in ctx.samples("infiniband_port_rate_bytes_per_second")}
    want_bps = p.ib_rate_gbps * 1e9 / 8
    for s in states:
        key = (s.label("device"), s.label("port"))
        e = _entity(*key)
        ph = phys.get(key)
        ev = {"state": s.label("state") or int(s.value), "phys_state": ph.label("state") if ph else "n/a"}
        if s.value != IB_ACTIVE or (ph is not None and ph.value != PHYS_LINKUP):
            out.append(fail("ib_port", e, f"port {ev['state']} / {ev['phys_state']}", Action.DRAIN, **ev))
            continue
        r = rate.get(key)
        if want_bps and r is not None and r.value < want_bps:
            out.append(fail("ib_port", e, f"port rate {r.value * 8 / 1e9:.0f} Gb/s below {p.ib_rate_gbps} Gb/s",
                            Action.DRAIN, rate_gbps=r.value * 8 / 1e9, expected_gbps=p.ib_rate_gbps, **ev))
            continue
        out.append(ok("ib_port", e, **ev))
    return out


# counter -> (kind, threshold key or None for "any increase")
_ERROR_RULES: dict[str, str | None] = {
    "link_downed": None,
    "link_error_recovery": None,
    "symbol_error": "ib_symbol_errors_per_hour",
    "port_rcv_errors": "ib_rcv_errors_per_hour",
    "excessive_buffer_overrun_errors": None,
    "local_link_integrity_errors": None,
}


def ib_errors(ctx: Context) -> list[CheckResult]:
    t = ctx.profile.thresholds
    per_port: dict[tuple[str, str], list[str]] = {}
    fatal: dict[tuple[str, str], list[str]] = {}
    seen: set[tuple[str, str]] = set()
    for c in ctx.samples("infiniband_port_stat"):
        key = (c.label("device"), c.label("port"))
        seen.add(key)
        name = c.label("counter")
        if name not in _ERROR_RULES:
            continue
        inc = ctx.increase(c)
        if inc is None or inc <= 0:
            continue
        limit_key = _ERROR_RULES[name]
        if name == "link_downed":
            if inc > t["ib_link_downed_max_increase"]:
                fatal.setdefault(key, []).append(f"link_downed+{int(inc)}")
        elif limit_key is None:
            per_port.setdefault(key, []).append(f"{name}+{int(inc)}")
        else:
            r = ctx.rate_per_hour(c)
            if r is not None and r > t[limit_key]:
                per_port.setdefault(key, []).append(f"{name}={r:.0f}/h")
    out: list[CheckResult] = []
    for key in sorted(seen):
        e = _entity(*key)
        if key in fatal:
            out.append(fail("ib_errors", e, "link went down within the window", Action.DRAIN,
                            counters=" ".join(fatal[key] + per_port.get(key, []))))
        elif key in per_port:
            out.append(warn("ib_errors", e, "error counters rising", counters=" ".join(per_port[key])))
        else:
            out.append(ok("ib_errors", e))
    return out
