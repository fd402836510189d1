"""Network adapters by role as a node shows them, for `podhealth profile capture` and `diff`.

Roles are told apart by the profile's own rules and pins (checks/passive/ib_roles.py), so a captured
profile states, per role, what the ib_port check will later judge: how many links, at which
rates, on which link layers, bonded or not, and the HCA firmware of the role's adapters.
"""

from __future__ import annotations

from podhealth.checks.passive import ib_roles
from podhealth.checks.passive.context import Context
from podhealth.checks.passive.ib import PortView, port_views
from podhealth.checks.profiles.capture import Seen
from podhealth.checks.profiles.catalog import Profile
from podhealth.checks.passive.rates import RateTracker
from podhealth.snapshot import Snapshot


def _views(snap: Snapshot, prof: Profile) -> dict[ib_roles.PortKey, PortView]:
    """Every port with its facts and rate, as the ib_port check reads them (checks/passive/ib.py)."""
    ctx = Context(snapshot=snap, profile=prof, now=snap.time, rates=RateTracker(60.0))
    return port_views(ctx)[0]


def observe_roles(snap: Snapshot, prof: Profile) -> tuple[dict[str, Seen | None], list[str]]:
    """(role -> observed {count, rate_gbps, link_layers, bonded}, comment lines), the ports told
    apart by `prof`'s network rules and pins."""
    net = prof.network
    if snap.stale("infiniband"):
        return {role: None for role in net.roles}, []
    views = _views(snap, prof)
    assigned = ib_roles.classify([v.facts for v in views.values()], net)
    rate = {k: round(v.rate_gbps) for k, v in views.items() if v.rate_gbps is not None}
    fw = {s.label("device"): s.label("firmware_version") for s in snap.samples("infiniband_info")}
    counts = {c.role: c for c in ib_roles.count_roles(assigned, net)}
    out: dict[str, Seen | None] = {}
    for role in net.roles:
        ports = [(f, a) for f, a in assigned.values() if a.role == role]
        value = {
            "count": counts[role].present,
            "rate_gbps": sorted({rate[f.key] for f, _ in ports if f.key in rate}),
            "link_layers": sorted({f.link_layer for f, _ in ports if f.link_layer}),
            "bonded": any(f.bonded for f, _ in ports),
        }
        devices = ", ".join(f"{f.device}/{f.port}" for f, _ in ports) or "none"
        firmware = sorted({fw[f.device] for f, _ in ports if fw.get(f.device)})
        how = sorted({a.how for _, a in ports})
        src = f"infiniband: {devices} ({'; '.join(how) or 'no port'}{'; firmware ' + ', '.join(firmware) if firmware else ''})"
        out[role] = Seen(value, src, f"{counts[role].uncertain} uncertain" if counts[role].uncertain else "")
    notes = [f"{f.device}/{f.port}: {a.how} ({f.link_layer or '?'}, {rate.get(f.key, '?')} Gb/s) - not in any role"
             for f, a in assigned.values() if a.role is None]
    return out, notes
