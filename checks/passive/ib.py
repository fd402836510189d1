"""InfiniBand / RDMA network checks: every port judged against its role, error counters (and
the ones that can no longer count), link flaps.

- ib_port: each port's role (checks/passive/ib_roles.py, from the profile's `network` rules and pins),
  then its state, physical state, rate, link layer and bonding against that role; per role, how
  many links are present against how many the profile expects. A port with no role is reported,
  never failed.
- ib_errors: error counters rising over the window; a counter stuck at its maximum (it saturates,
  it does not wrap) is a WARN that names it, its width and how to clear it, and the port is then
  judged from what still moves (hw_counters).
- ib_flap: downs per port within the profile's flap window (state transitions and link_downed
  deltas, kept by checks/ib_links.LinkTracker in the Evaluator).

A port that is down counts against `network.down_max_s` only where there is history (the agent);
a one-shot check (`podhealth check`, handover) has none and judges what it sees at once.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Iterable

from podhealth.checks.passive import ib_counters
from podhealth.checks.passive.context import Context
from podhealth.checks.passive.ib_links import LinkEvent, LinkTracker
from podhealth.checks.ib_profile import NetworkProfile, RoleSpec
from podhealth.checks.passive.ib_roles import (Assignment, PortFacts, PortKey, classify, count_roles,
                                              other_link_layer)
from podhealth.checks.passive.result import fail, ok, unknown, warn
from podhealth.collectors.ib_parse import is_bond_device, is_kernel_fallback_rate
from podhealth.vocab import Action, CheckResult, Sample, Status

IB_ACTIVE = 4
PHYS_LINKUP = 5
# ports/N/state (IBA PortState): 1 DOWN, 2 INIT, 3 ARMED, 4 ACTIVE, 5 ACTIVE_DEFER (active,
# transmitting while the SM defers). 0 (NOP) or a number outside the spec is not a state at all.
_UP_STATES = frozenset({IB_ACTIVE, 5})
_DOWN_STATES = frozenset({1, 2, 3})
# ports/N/phys_state: 1 Sleep, 2 Polling, 3 Disabled, 4 PortConfigurationTraining, 6
# LinkErrorRecovery, 7 PhyTest say the link is not up; 5 LinkUp, 0 or an unknown number
# leave the verdict to state.
_PHYS_NOT_UP = frozenset({1, 2, 3, 4, 6, 7})


def _entity(device: str, port: str) -> str:
    return f"{device}/{port}"


def _by_port(samples: Iterable[Sample]) -> dict[PortKey, Sample]:
    return {(s.label("device"), s.label("port")): s for s in samples}


@dataclass(frozen=True)
class PortView:
    """What this evaluation knows about one port."""

    facts: PortFacts
    state: Sample | None
    phys: Sample | None
    rate_gbps: float | None

    @property
    def active(self) -> bool | None:
        if self.state is None or self.state.value not in _UP_STATES | _DOWN_STATES:
            return None  # unread, or a value no kernel prints for a port: not known, not down
        return self.state.value in _UP_STATES and (self.phys is None or self.phys.value not in _PHYS_NOT_UP)

    def evidence(self) -> dict[str, object]:
        f = self.facts
        ev: dict[str, object] = {
            "state": (self.state.label("state") or int(self.state.value)) if self.state else "unread",
            "phys_state": self.phys.label("state") if self.phys else "n/a",
        }
        if self.rate_gbps is not None:
            r = round(self.rate_gbps, 3)  # 2.5 (1X SDR) must not read as 2
            ev["rate_gbps"] = int(r) if r == int(r) else r
        for k, v in (("link_layer", f.link_layer), ("pci", f.pci), ("numa", f.numa), ("netdev", f.netdev)):
            if v is not None:
                ev[k] = v
        if f.bond_slaves:
            ev["bond_slaves"] = " ".join(f.bond_slaves)
        return ev


def port_views(ctx: Context) -> tuple[dict[PortKey, PortView], int]:
    """Every port the snapshot shows, with its facts; and how many devices showed no port at all
    (their ports directory could not be read: they may hold the ports a role is missing).
    Made once per evaluation (ib_port, ib_flap and the link history all read it)."""
    return ctx.derived("ib.port_views", lambda: _port_views(ctx))


def assigned_roles(ctx: Context, views: dict[PortKey, PortView]) -> dict[PortKey, tuple[PortFacts, Assignment]]:
    """classify() of `views` (port_views'), once per evaluation."""
    return ctx.derived("ib.assigned", lambda: classify([v.facts for v in views.values()], ctx.profile.network))


def _port_views(ctx: Context) -> tuple[dict[PortKey, PortView], int]:
    states = _by_port(ctx.samples("infiniband_port_state"))
    phys = _by_port(ctx.samples("infiniband_port_physical_state"))
    rates = _by_port(ctx.samples("infiniband_port_rate_bytes_per_second"))
    layers = _by_port(ctx.samples("infiniband_port_link_layer_info"))
    netdevs = _by_port(ctx.samples("infiniband_port_netdev_info"))
    info = {s.label("device"): s for s in ctx.samples("infiniband_info")}
    pci = {s.label("device"): s for s in ctx.samples("infiniband_device_pci_info")}
    keys = sorted(set(states) | set(phys) | set(rates) | set(layers))
    facts = []
    for dev, port in keys:
        nd = netdevs.get((dev, port))
        slaves = tuple((nd.label("bond_slaves") or "").split()) if nd else ()
        p = pci.get(dev)
        numa = p.label("numa_node") if p else ""
        facts.append(PortFacts(
            device=dev, port=port,
            link_layer=layers[(dev, port)].label("link_layer") if (dev, port) in layers else None,
            hca_type=(info[dev].label("hca_type") or None) if dev in info else None,
            pci=(p.label("pci_address") or None) if p else None,
            numa=int(numa) if numa and numa.lstrip("-").isdigit() else None,
            netdev=nd.label("netdev") if nd else None,
            bond_slaves=slaves or None,
            bonded=is_bond_device(dev) or bool(slaves),
        ))
    views: dict[PortKey, PortView] = {}
    for f in facts:
        r = rates.get(f.key)
        views[f.key] = PortView(f, states.get(f.key), phys.get(f.key), r.value * 8 / 1e9 if r is not None else None)
    portless = len({d for d in info} - {d for d, _ in keys})
    return views, portless


def _verdict(spec: RoleSpec | None, entity: str, summary: str, **ev: object) -> CheckResult:
    """A present port's fault, as its role says: FAIL (DRAIN) or WARN; unassigned ports WARN."""
    if spec is not None and spec.port_fault == "fail":
        return fail("ib_port", entity, summary, Action.DRAIN, **ev)
    return warn("ib_port", entity, summary, **ev)


def _judge_port(ctx: Context, v: PortView, a: Assignment, spec: RoleSpec | None, up_links: int = 0) -> CheckResult:
    """`up_links`: links of the port's role that are up; a down port of a role that has all its
    links up without it is a spare (an adapter with no cable, a second card), not a fault."""
    f = v.facts
    e = _entity(f.device, f.port)
    ev = {"role": a.role or ("undecided" if a.undecided else "unassigned"), "how": a.how, **v.evidence()}
    if a.role is None:
        # Not ours to judge: shown so an operator can pin it (network.pins) if it matters.
        return ok("ib_port", e, f"no role ({a.how})", **ev)
    assert spec is not None
    if v.active is None:
        why = "could not be read" if v.state is None else f"{v.state.value:g} is not an IBA port state"
        return unknown("ib_port", e, f"port state {why}", **ev)
    if not v.active and spec.count and up_links >= spec.count:
        return ok("ib_port", e, f"down, not needed: {up_links} of {spec.count} {spec.name} links are up without it",
                  surplus="true", **ev)
    if not v.active:
        what = f"port {ev['state']} / {ev['phys_state']}"
        links = ctx.ib_links
        if links is None:  # one-shot: no history to wait on
            return _verdict(spec, e, what, **ev)
        down = links.down_for(f.key, ctx.now) or 0.0
        limit = ctx.profile.network.down_max_s
        ev["down_s"] = round(down)
        if down >= limit:
            return _verdict(spec, e, f"{what} for {down:.0f}s (limit {limit:.0f}s)", **ev)
        return warn("ib_port", e, f"{what} for {down:.0f}s (a {spec.name} port down over {limit:.0f}s is a fault)", **ev)
    if f.link_layer is not None and f.link_layer not in spec.link_layers:
        return _verdict(spec, e, f"link layer {f.link_layer}, a {spec.name} port must be {'/'.join(spec.link_layers)}",
                        expected_link_layers=",".join(spec.link_layers), **ev)
    if spec.bonded == "forbidden" and f.bonded:
        return _verdict(spec, e, f"bonded, a {spec.name} port must not be", **ev)
    if spec.bonded == "required" and not f.bonded:
        return _verdict(spec, e, f"not bonded, a {spec.name} port must be", **ev)
    if v.rate_gbps is not None and not spec.rate_ok(v.rate_gbps):
        want = "/".join(str(r) for r in spec.rate_gbps)
        if v.rate_gbps <= 0:  # rate_show() never prints 0 (width >= 1X): not a rate to judge
            return unknown("ib_port", e, "port rate 0 Gb/s on an active port is not a rate", expected_gbps=want, **ev)
        if f.link_layer != "Ethernet" and is_kernel_fallback_rate(v.rate_gbps):
            # rate_show() prints SDR for any speed the running kernel does not know: a link
            # faster than the kernel (XDR on an older one) reads as "10 Gb/sec (4X SDR)" on
            # every node of that build. A real fall back to SDR is rare; neither is a verdict.
            # (RoCE ports map Ethernet speeds: 10GbE is "10 Gb/sec (1X QDR)", a real rate.)
            return unknown("ib_port", e, f"port rate {v.rate_gbps:g} Gb/s (SDR): the kernel prints SDR for a link "
                           "speed it does not know, and for a link trained down to SDR", expected_gbps=want, **ev)
        return _verdict(spec, e, f"port rate {v.rate_gbps:.0f} Gb/s below {want} Gb/s for a {spec.name} port",
                        expected_gbps=want, **ev)
    return ok("ib_port", e, **ev)


def ib_port(ctx: Context) -> list[CheckResult]:
    net = ctx.profile.network
    views, portless = port_views(ctx)
    assigned = assigned_roles(ctx, views)
    out: list[CheckResult] = []
    for rc in count_roles(assigned, net):
        spec = net.roles[rc.role]
        members = sorted(_entity(*k) for k, (_, a) in assigned.items() if a.role == rc.role)
        ev = dict(present=rc.present, expected=rc.expected, ports=" ".join(members) or "none")
        e = f"role/{rc.role}"
        if rc.expected == 0 and not members:
            continue
        if not rc.short:
            out.append(ok("ib_port", e, **ev))
        elif spec.missing == "ok":
            out.append(ok("ib_port", e, f"{rc.present} of {rc.expected} {rc.role} links present (optional)", **ev))
        elif (not rc.decided or portless) and spec.missing == "warn":
            # The shortfall may be real or may be the ports that could not be told apart; either
            # way the role's verdict is a WARN that fences nothing. UNKNOWN is for where the answer
            # could change the action: here it cannot, so the worst reading stands, and says why.
            undecided = sorted(_entity(*k) for k, (_, a) in assigned.items() if a.undecided)
            out.append(warn("ib_port", e, f"{rc.present} of {rc.expected} {rc.role} links told apart, "
                            f"{rc.uncertain} uncertain (a bond of unknown size or a port not classified): "
                            f"at worst a missing {rc.role} link, which only warns", uncertain=rc.uncertain,
                            undecided=" ".join(undecided) or "none", devices_without_ports=portless, **ev))
        elif not rc.decided or portless:
            # Ports that could not be classified (a fact sysfs did not give, a bond of unknown
            # size) or devices whose ports could not be listed may be the missing ones: a FAIL
            # (REBOOT) or an OK hangs on them, so the role's count is UNKNOWN.
            undecided = sorted(_entity(*k) for k, (_, a) in assigned.items() if a.undecided)
            out.append(unknown("ib_port", e, f"{rc.present} of {rc.expected} {rc.role} links told apart; "
                               "the rest could not be classified", undecided=" ".join(undecided) or "none",
                               devices_without_ports=portless, **ev))
        elif not members and len(strangers := other_link_layer(assigned, net, rc.role)) >= rc.expected:
            # Not one port of the role's link layer, and enough of another on the same adapters:
            # this build's fabric is not the one the profile describes (RoCE rails on a profile
            # for InfiniBand). Every node of the build would fail alike; no node is at fault.
            layers = sorted({views[k].facts.link_layer or "" for k in strangers})
            out.append(unknown("ib_port", e, f"no {'/'.join(spec.link_layers)} {rc.role} port, but {len(strangers)} "
                               f"{'/'.join(layers)} ports on the adapters a {rc.role} rule takes: the fabric is not the "
                               "profile's; state it in network.roles", other_link_layer=" ".join(
                                   _entity(*k) for k in strangers), **ev))
        elif spec.missing == "fail":
            # An adapter gone from the PCIe bus (or its driver) comes back with a reboot, if at all.
            out.append(fail("ib_port", e, f"{rc.present} of {rc.expected} {rc.role} links present", Action.REBOOT, **ev))
        else:
            out.append(warn("ib_port", e, f"{rc.present} of {rc.expected} {rc.role} links present", **ev))
    up_links: dict[str, int] = {}
    for key, (facts, a) in assigned.items():
        if a.role is not None and views[key].active:
            up_links[a.role] = up_links.get(a.role, 0) + (facts.links or 1)
    judged: list[tuple[PortFacts, Assignment, CheckResult]] = []
    for key in sorted(views):
        facts, a = assigned[key]
        v = PortView(facts, views[key].state, views[key].phys, views[key].rate_gbps)
        spec = net.roles.get(a.role) if a.role else None
        r = _judge_port(ctx, v, a, spec, up_links.get(a.role or "", 0))
        judged.append((facts, a, r))
    return out + _spares_do_not_fail(judged, net)


def _spares_do_not_fail(judged: list[tuple[PortFacts, Assignment, CheckResult]], net: NetworkProfile) -> list[CheckResult]:
    """A failing port of a role whose healthy ports already give all `count` links is one more
    than the role needs (a card in a spare slot, an adapter for another purpose that a rule
    also takes): a WARN to pin or fix it, never a FAIL that fences a node with every rail good.
    A pinned port is the operator's word that it belongs to the role: judged as it is."""
    healthy: dict[str, int] = {}
    for f, a, r in judged:
        if a.role is not None and r.status is Status.OK and "surplus" not in dict(r.evidence):
            healthy[a.role] = healthy.get(a.role, 0) + (f.links or 1)
    out = []
    for f, a, r in judged:
        spec = net.roles.get(a.role) if a.role else None
        if (r.status is Status.FAIL and a.how != "pin" and spec is not None and spec.count
                and healthy.get(spec.name, 0) >= spec.count):
            r = warn(r.check, r.entity, f"{r.summary} (not needed: {healthy[spec.name]} of {spec.count} "
                     f"{spec.name} links are good without it)", surplus="true", **dict(r.evidence))
        out.append(r)
    return out


# --- error counters --------------------------------------------------------------------------


def ib_errors(ctx: Context) -> list[CheckResult]:
    t = ctx.profile.thresholds
    meanings = ib_counters.load()
    layers = {k: s.label("link_layer") for k, s in _by_port(ctx.samples("infiniband_port_link_layer_info")).items()}
    rising: dict[PortKey, list[str]] = {}
    saturated: dict[PortKey, list[str]] = {}
    stuck_other: dict[PortKey, list[str]] = {}  # saturated, but not error counters (congestion)
    seen: set[PortKey] = set()
    reset: dict[PortKey, list[str]] = {}
    for c in ctx.samples("infiniband_port_stat"):
        key = (c.label("device"), c.label("port"))
        seen.add(key)
        name = c.label("counter")
        if name in meanings.widths and ctx.reset_within_window(c):
            reset.setdefault(key, []).append(name)
        width = meanings.saturated_width(name, c.value)
        if width is not None:
            where = saturated if name in meanings.errors else stuck_other
            # the exact maximum: a float sample cannot hold 2^64 - 1
            where.setdefault(key, []).append(f"{name}={(1 << width) - 1} ({width}-bit)")
            continue  # stuck: its increase is 0 and says nothing
        if name not in meanings.rising:
            continue
        inc = ctx.increase(c)
        if inc is None or inc <= 0:
            continue
        limit_key = meanings.rising[name]
        if limit_key is None:
            rising.setdefault(key, []).append(f"{name}+{int(inc)}")
        else:
            r = ctx.rate_per_hour(c)
            if r is not None and r > t[limit_key]:
                rising.setdefault(key, []).append(f"{name}={r:.0f}/h")
    moving: dict[PortKey, list[str]] = {}
    # (only a saturated port's retries are looked at: none, the usual case, reads none of ~400)
    for h in ctx.samples("infiniband_port_hw_stat") if saturated else ():
        key = (h.label("device"), h.label("port"))
        limit = meanings.substitutes.get(h.label("counter"))
        if key not in saturated or limit is None:
            continue
        r = ctx.rate_per_hour(h)
        if r is not None and r > limit:
            moving.setdefault(key, []).append(f"{h.label('counter')}={r:.0f}/h")
    out: list[CheckResult] = []
    for key in sorted(seen):
        e = _entity(*key)
        ev: dict[str, object] = {}
        if key in stuck_other:
            ev["saturated_not_errors"] = " ".join(stuck_other[key])
        if key in reset:
            # A counter that went back was cleared, not a negative rate: only what it counted
            # since is judged (a saturated one can count again).
            ev["reset"] = " ".join(reset[key]) + ": went back (perfquery -R, a driver reload or an HCA reset)"
        if key in rising:
            ev["counters"] = " ".join(rising[key])
        if key in saturated:
            ev["saturated"] = " ".join(saturated[key])
            # Not a fault by itself: the counter stopped at its maximum (no wrap, no rate), so
            # what it says is "at least this many since the last clear, and blind from now on".
            ev["meaning"] = "stuck at its maximum: no rate, no new errors counted until cleared"
            ev["clear_with"] = meanings.how_to_clear(layers.get(key), *key)
            ev["still_moving"] = " ".join(moving.get(key, [])) or "no hw_counters retry rising"
            names = ", ".join(s.split("=")[0] for s in saturated[key])
            more = "; error counters rising" if key in rising else ""
            out.append(warn("ib_errors", e, f"{names} saturated: can no longer count new errors{more}", **ev))
        elif key in rising:
            out.append(warn("ib_errors", e, "error counters rising", **ev))
        else:
            out.append(ok("ib_errors", e, **ev))
    return out


# --- link flaps ------------------------------------------------------------------------------


def _downed_blind(value: float) -> bool:
    """link_downed at or past its 8-bit maximum: stuck, or counted by a driver in a wider width
    whose jumps (a glitch, a firmware counter) must not become dozens of downs at once. Downs
    are then counted from state transitions only, so no FLAPPING (DRAIN) rests on its delta."""
    top = ib_counters.load().max_value("link_downed")
    return top is not None and value >= top


def observe_links(tracker: LinkTracker, ctx: Context) -> None:
    """Feed this evaluation's port states and link_downed counters to the tracker."""
    downed = {(s.label("device"), s.label("port")): s for s in ctx.samples("infiniband_port_stat")
              if s.label("counter") == "link_downed"}
    views, _ = port_views(ctx)
    for key, v in views.items():
        d = downed.get(key)
        tracker.observe(key, ctx.now, v.active, d.value if d is not None else None,
                        d is not None and _downed_blind(d.value))


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def _events(events: tuple[LinkEvent, ...], limit: int = 8) -> str:
    shown = [f"{_when(e.t)} {e.kind}" + (f"x{e.downs}" if e.downs > 1 else "") + f" ({e.source})"
             for e in events[-limit:]]
    return "; ".join(shown) + (f"; (+{len(events) - limit} earlier)" if len(events) > limit else "")


def ib_flap(ctx: Context) -> list[CheckResult]:
    links = ctx.ib_links
    if links is None:
        return []  # a one-shot check has no history to count flaps in
    net = ctx.profile.network
    views, _ = port_views(ctx)
    assigned = assigned_roles(ctx, views)
    saturated_downed = {(s.label("device"), s.label("port")) for s in ctx.samples("infiniband_port_stat")
                        if s.label("counter") == "link_downed" and _downed_blind(s.value)}
    out: list[CheckResult] = []
    hours = net.flap_window_s / 3600
    for key in sorted(views):
        e = _entity(*key)
        _, a = assigned[key]
        n, events = links.downs(key, ctx.now, net.flap_window_s)
        ev: dict[str, object] = {"role": a.role or "unassigned", "downs": n, "window_h": round(hours, 2)}
        if events:
            ev["transitions"] = _events(events)
        if key in saturated_downed:
            ev["link_downed"] = "saturated (255 or more): downs counted from state transitions only"
        spec = net.roles.get(a.role) if a.role else None
        if n >= net.flap_count:
            summary = f"FLAPPING: down {n} times in {hours:g}h (limit {net.flap_count})"
            if spec is not None and spec.port_fault == "fail":
                out.append(fail("ib_flap", e, summary, Action.DRAIN, **ev))
            else:
                out.append(warn("ib_flap", e, summary, **ev))
        elif n:
            out.append(warn("ib_flap", e, f"link went down {n} time(s) in {hours:g}h", **ev))
        else:
            out.append(ok("ib_flap", e, **ev))
    return out
