"""PCIe AER rules: a fatal error on a GPU's, HCA's or NVSwitch's link fences; error rates warn.

`pcie_aer_fatal`: aer_dev_fatal's TOTAL counts since boot and only a reboot (or a hot reset)
clears it, so a fatal count on a GPU / HCA / NVSwitch, or on a port above one of them (the ABI:
errors may be counted at the link partner, not at the endpoint), is a DRAIN that holds until the
node is rebooted. A fatal error elsewhere (a management NIC, a port serving none of them) warns.
`pcie_aer`: correctable messages per hour over checks.rate_window above the profile's
pcie_aer_correctable_per_hour, or any new uncorrectable non-fatal message, warn; rules.yaml makes
them hold for several readings first.
"""

from __future__ import annotations

from typing import Any

from podhealth.checks.passive.context import Context
from podhealth.checks.passive.result import fail, ok, unknown, warn
from podhealth.collectors.pcie_aer import ENDPOINT_KINDS
from podhealth.pci import normalise as normalise_pci
from podhealth.vocab import Action, CheckResult, Sample


def _gpu_index_by_pci(ctx: Context) -> dict[str, str]:
    out: dict[str, str] = {}
    for s in ctx.samples("gpu_up"):
        pci = normalise_pci(s.label("pci_bus_id"))
        if pci:
            out[pci] = s.label("gpu")
    return out


def _name(pci: str, kind: str, device: str, gpus: dict[str, str]) -> str:
    if kind == "gpu" and pci in gpus:
        return f"gpu{gpus[pci]}"
    if kind == "hca" and device:
        return device
    return f"{kind}:{pci}" if kind in ("gpu", "nvswitch") else f"pci:{pci}"


def _serves(s: Sample, gpus: dict[str, str]) -> str:
    """A port's `serves` label with GPU PCI addresses turned into gpuN names."""
    names = []
    for item in filter(None, s.label("serves").split(",")):
        kind, _, pci = item.partition(":")
        names.append(_name(pci, kind, "", gpus) if pci and kind == "gpu" else item)
    return ",".join(names)


def _bits(ctx: Context, pci: str, severity: str) -> str:
    bits = [f"{b.label('error')}={int(b.value)}" for b in ctx.samples("pcie_aer_error_bits")
            if b.label("pci") == pci and b.label("severity") == severity]
    return " ".join(sorted(bits)) or "n/a"


def _no_stats(ctx: Context, check: str) -> CheckResult | None:
    n = ctx.value("pcie_aer_devices")
    if not n:
        return unknown(check, "node", "no PCIe AER statistics in sysfs (AER off, or a kernel older than 4.19)")
    return None


def pcie_aer_fatal(ctx: Context) -> list[CheckResult]:
    missing = _no_stats(ctx, "pcie_aer_fatal")
    if missing:
        return [missing]
    gpus = _gpu_index_by_pci(ctx)
    out: list[CheckResult] = []
    for s in ctx.samples("pcie_aer_errors"):
        if s.label("severity") != "fatal" or s.value <= 0:
            continue
        pci, kind = s.label("pci"), s.label("kind")
        serves = _serves(s, gpus)
        ent = _name(pci, kind, s.label("device"), gpus)
        ev = dict(pci=pci, kind=kind, fatal=int(s.value), errors=_bits(ctx, pci, "fatal"))
        if kind in ENDPOINT_KINDS:
            out.append(fail("pcie_aer_fatal", ent, f"fatal PCIe AER error on {ent}'s link ({int(s.value)} since boot)",
                            Action.DRAIN, **ev))
        elif serves:
            out.append(fail("pcie_aer_fatal", ent, f"fatal PCIe AER error on the port above {serves}",
                            Action.DRAIN, serves=serves, **ev))
        else:
            out.append(warn("pcie_aer_fatal", ent, f"fatal PCIe AER error on {kind} {pci} (no GPU, HCA or NVSwitch below)",
                            **ev))
    out.extend(_hierarchy_fatal(ctx, gpus, out))
    return out or [ok("pcie_aer_fatal", "node", "no fatal AER error since boot",
                      functions=int(ctx.value("pcie_aer_devices") or 0))]


def _hierarchy_fatal(ctx: Context, gpus: dict[str, str], found: list[CheckResult]) -> list[CheckResult]:
    """A root port counted ERR_FATAL messages (aer_rootport_total_err_fatal) that no function's
    own counters explain: the error came from below it (a function without AER statistics, or
    one reset since): the port's GPUs / HCAs are what it threatens."""
    named = {dict(r.evidence).get("pci", "") for r in found} | {r.entity for r in found}
    port_serves = {s.label("pci"): _serves(s, gpus) for s in ctx.samples("pcie_aer_errors") if s.label("kind") == "port"}
    out: list[CheckResult] = []
    for s in ctx.samples("pcie_aer_rootport_errors"):
        if s.label("severity") != "fatal" or s.value <= 0:
            continue
        pci = s.label("pci")
        serves = port_serves.get(pci, "")
        if pci in named or any(name in named for name in serves.split(",") if name):
            continue  # a function in this hierarchy already carries the error
        ev = dict(pci=pci, kind="port", rootport_fatal=int(s.value))
        if serves:
            out.append(fail("pcie_aer_fatal", f"pci:{pci}", f"fatal PCIe AER error reported below the root port of {serves}",
                            Action.DRAIN, serves=serves, **ev))
        else:
            out.append(warn("pcie_aer_fatal", f"pci:{pci}", "fatal PCIe AER error reported below a root port "
                            "with no GPU, HCA or NVSwitch", **ev))
    return out


def pcie_aer(ctx: Context) -> list[CheckResult]:
    missing = _no_stats(ctx, "pcie_aer")
    if missing:
        return [missing]
    gpus = _gpu_index_by_pci(ctx)
    limit = ctx.profile.threshold("pcie_aer_correctable_per_hour")
    # one WARN per function, whatever mix of correctable rate and new non-fatal errors it shows
    found: dict[str, tuple[list[str], dict[str, object]]] = {}
    for s in ctx.samples("pcie_aer_errors"):
        sev, pci, kind = s.label("severity"), s.label("pci"), s.label("kind")
        ent = _name(pci, kind, s.label("device"), gpus)
        if sev == "correctable":
            rate = ctx.rate_per_hour(s)
            if rate is None or rate <= limit:
                continue
            what, ev = f"correctable PCIe AER errors at {rate:.0f}/h", {"per_hour": round(rate, 1), "limit": limit}
        elif sev == "nonfatal":
            inc = ctx.increase(s)
            if inc is None or inc <= 0:
                continue
            what, ev = f"{int(inc)} new uncorrectable (non-fatal) PCIe AER errors", {"nonfatal_new": int(inc)}
        else:
            continue
        whats, evidence = found.setdefault(ent, ([], {"pci": pci, "kind": kind}))
        whats.append(what)
        evidence.update(ev, **{f"{sev}_errors": _bits(ctx, pci, sev)})
        if s.label("serves"):
            evidence["serves"] = _serves(s, gpus)
    out = [warn("pcie_aer", ent, f"{'; '.join(whats)} on {ent}", **ev) for ent, (whats, ev) in found.items()]
    return out or [ok("pcie_aer", "node", "AER error rates within limits", limit_per_hour=limit)]


def kernel_aer(ctx: Context) -> list[CheckResult]:
    """A fatal AER line in the kernel log (collectors/ras_parse.py), judged as it arrives: the
    fast path of pcie_aer_fatal, whose sysfs counters are polled every 30 s. A GPU's fatal error
    drains at once; a device this agent cannot name (an HCA, a switch) is a WARN here and is
    judged by pcie_aer_fatal at its next reading, which knows the topology."""
    recent = [e for e in ctx.events if e.kind == "aer" and e.time >= ctx.now - ctx.window]
    if not recent:
        return [ok("kernel_aer", "node", "no fatal PCIe AER error in the kernel log")]
    gpus = _gpu_index_by_pci(ctx)
    by_pci: dict[str, list[Any]] = {}
    for e in recent:
        by_pci.setdefault(normalise_pci(e.device) or e.device, []).append(e)
    out: list[CheckResult] = []
    for pci, evs in sorted(by_pci.items()):
        last = max(evs, key=lambda e: e.time)
        ev = dict(pci=pci, lines=len(evs), last=last.text)
        if pci in gpus:
            ent = f"gpu{gpus[pci]}"
            out.append(fail("kernel_aer", ent, f"fatal PCIe AER error on {ent}'s link (kernel log)", Action.DRAIN, **ev))
        else:
            out.append(warn("kernel_aer", f"pci:{pci}", f"fatal PCIe AER error on {pci} (kernel log; not a GPU "
                            "this agent knows: pcie_aer_fatal judges it at its next reading)", **ev))
    return out
