"""GPU checks over the nvml collector's samples (docs/metrics.md "nvml").

Actions follow NVIDIA's guidance: a volatile uncorrectable ECC error or a pending row remap is
cleared by a GPU reset (the remap is applied then); a row-remap failure means the bank ran out of
spare rows: the GPU needs replacing. A GPU that fell off the bus needs at least a node reboot.
"""

from __future__ import annotations

from collections import Counter

from podhealth.checks.passive import rules
from podhealth.checks.passive.context import Context, gpu_entity
from podhealth.checks.passive.result import fail, ok, unknown, warn
from podhealth.vocab import Action, CheckResult, Sample, Status


def _version_tuple(v: str) -> tuple[int, ...]:
    out = []
    for part in v.split("."):
        digits = "".join(ch for ch in part if ch.isdigit())
        out.append(int(digits) if digits else 0)
    return tuple(out)


# The nvml collector's readings (gpu_field_unreadable `field`) each per-GPU check stands on: when
# NVML refused one of them (an error, not NOT_SUPPORTED) the check cannot clear that GPU: a FAIL
# or WARN from what it did read stands, an OK (or no verdict at all) becomes UNKNOWN.
NEEDS: dict[str, tuple[str, ...]] = {
    "ecc": ("ecc_uncorrected_volatile", "ecc_corrected_volatile"),
    "row_remap": ("remapped_rows",),
    "retired_pages": ("retired_sbe", "retired_dbe", "retired_pending"),
    "pcie": ("pcie_gen", "pcie_width"),
    "temperature": ("temperature", "memory_temperature"),
    "fabric": ("fabric",),
    "persistence": ("persistence_mode",),
    "clocks": ("clocks_event_reasons",),
}


def _unreadable(ctx: Context, check: str) -> dict[str, list[str]]:
    """GPU -> the readings `check` needs that NVML refused this collection."""
    need = NEEDS.get(check, ())
    out: dict[str, list[str]] = {}
    for s in ctx.samples("gpu_field_unreadable"):
        if s.value >= 1 and s.label("field") in need:
            out.setdefault(s.label("gpu"), []).append(s.label("field"))
    return out


def _each_gpu(ctx: Context, check: str) -> tuple[list[CheckResult], list[Sample]]:
    """GPUs that answer; lost ones get UNKNOWN here (gpu_lost reports them as FAIL)."""
    out, up = [], []
    for s in ctx.samples("gpu_up"):
        if s.value >= 1:
            up.append(s)
        else:
            out.append(unknown(check, gpu_entity(s), "GPU does not answer NVML", uuid=s.label("uuid")))
    return out, up


def _settle(ctx: Context, check: str, results: list[CheckResult]) -> list[CheckResult]:
    """`results` with every answering GPU where NVML refused a reading `check` needs (NEEDS) not
    cleared: its OK, or its missing verdict, is UNKNOWN; its FAIL / WARN stands."""
    refused = _unreadable(ctx, check)
    if not refused:
        return results
    up = {gpu_entity(s): s for s in ctx.samples("gpu_up") if s.value >= 1 and s.label("gpu") in refused}

    def cannot(e: str) -> CheckResult:
        g = up[e]
        return unknown(check, e, "NVML refused a reading this check needs",
                       unreadable=",".join(refused[g.label("gpu")]), uuid=g.label("uuid"))

    out = [cannot(r.entity) if r.entity in up and r.status is Status.OK else r for r in results]
    judged = {r.entity for r in results}
    return out + [cannot(e) for e in up if e not in judged]


def gpu_count(ctx: Context) -> list[CheckResult]:
    p = ctx.profile
    n = ctx.value("gpu_devices")
    if n is None:
        return [unknown("gpu_count", "node", "NVML reported no device count")]
    models = sorted({s.label("model") for s in ctx.samples("gpu_up") if s.value >= 1})
    if p.gpu_count and n < p.gpu_count:
        return [fail("gpu_count", "node", f"{int(n)} of {p.gpu_count} GPUs visible", Action.REBOOT,
                     visible=int(n), expected=p.gpu_count)]
    if p.gpu_model and models and any(m != p.gpu_model for m in models):
        return [warn("gpu_count", "node", f"GPU model {', '.join(models)} is not the profile's {p.gpu_model}",
                     models=", ".join(models), expected=p.gpu_model)]
    return [ok("gpu_count", "node", visible=int(n), expected=p.gpu_count or int(n))]


def gpu_lost(ctx: Context) -> list[CheckResult]:
    out = []
    for s in ctx.samples("gpu_up"):
        lost = ctx.value("gpu_lost", gpu=s.label("gpu")) or 0
        if lost >= 1:
            out.append(fail("gpu_lost", gpu_entity(s), "GPU has fallen off the bus", Action.REBOOT,
                            uuid=s.label("uuid"), pci_bus_id=s.label("pci_bus_id")))
        elif s.value < 1:
            # Timed out, wedged for a call, or refusing every call, but NVML did not say lost: the
            # GPU cannot be judged now (UNKNOWN). A GPU really gone shows as GPU_IS_LOST or XID 79.
            out.append(unknown("gpu_lost", gpu_entity(s), "GPU does not answer NVML (not reported lost)",
                               uuid=s.label("uuid"), pci_bus_id=s.label("pci_bus_id")))
        else:
            out.append(ok("gpu_lost", gpu_entity(s)))
    return out


def ecc(ctx: Context) -> list[CheckResult]:
    out, up = _each_gpu(ctx, "ecc")
    t = ctx.profile.thresholds
    unc = ctx.per_gpu("gpu_ecc_errors", type="uncorrected", scope="volatile")
    cor = ctx.per_gpu("gpu_ecc_errors", type="corrected", scope="volatile")
    for g in up:
        i, e = g.label("gpu"), gpu_entity(g)
        u = unc.get(i)
        if u is not None and u.value > t["ecc_uncorrected_volatile"]:
            out.append(fail("ecc", e, f"{int(u.value)} uncorrectable ECC errors since driver load", Action.RESET_GPU,
                            uncorrected_volatile=int(u.value), uuid=g.label("uuid")))
            continue
        c = cor.get(i)
        rate = ctx.rate_per_hour(c) if c is not None else None
        if rate is not None and rate > t["ecc_corrected_per_hour"]:
            out.append(warn("ecc", e, f"corrected ECC errors at {rate:.0f}/h", corrected_per_hour=round(rate, 1),
                            limit=t["ecc_corrected_per_hour"], uuid=g.label("uuid")))
            continue
        out.append(ok("ecc", e, uncorrected_volatile=int(u.value) if u else "n/a"))
    return _settle(ctx, "ecc", out)


def row_remap(ctx: Context) -> list[CheckResult]:
    out, up = _each_gpu(ctx, "row_remap")
    pending = ctx.per_gpu("gpu_remapped_rows_pending")
    failure = ctx.per_gpu("gpu_remapped_rows_failure")
    unc = ctx.per_gpu("gpu_remapped_rows", type="uncorrectable")
    limit = ctx.profile.thresholds["remap_uncorrectable_max"]
    banks = _remap_banks(ctx)
    for g in up:
        i, e = g.label("gpu"), gpu_entity(g)
        if i not in pending and i not in failure:
            continue  # pre-Ampere: no row remapping (retired pages instead)
        f, p = failure.get(i), pending.get(i)
        u = unc.get(i)
        ev = {"uncorrectable_remaps": int(u.value) if u else "n/a", "uuid": g.label("uuid")}
        if f is not None and f.value >= 1:
            out.append(fail("row_remap", e, "row remapping failed: no spare rows left", Action.REPLACE, **ev))
        elif p is not None and p.value >= 1:
            out.append(fail("row_remap", e, "row remap pending: reset the GPU to apply it", Action.RESET_GPU, **ev))
        elif u is not None and u.value > limit:
            out.append(warn("row_remap", e, f"{int(u.value)} uncorrectable row remaps", limit=limit, **ev))
        elif banks.get(i, {}).get("none", 0) >= 1 or banks.get(i, {}).get("low", 0) >= 1:
            # Before the XID: a bank with no (or few) spare rows left cannot remap its next
            # uncorrectable error, which then becomes XID 64 (remap failure) and a REPLACE.
            b = banks[i]
            what = (f"{int(b['none'])} memory bank(s) with no spare rows left" if b.get("none", 0) >= 1
                    else f"{int(b['low'])} memory bank(s) low on spare rows")
            out.append(warn("row_remap", e, f"{what}: plan the GPU's replacement", **ev,
                            banks=" ".join(f"{k}={int(v)}" for k, v in b.items())))
        else:
            out.append(ok("row_remap", e, **ev))
    return _settle(ctx, "row_remap", out)


def _remap_banks(ctx: Context) -> dict[str, dict[str, float]]:
    """GPU -> {availability: banks} from nvmlDeviceGetRowRemapperHistogram (absent: not read)."""
    out: dict[str, dict[str, float]] = {}
    for s in ctx.samples("gpu_row_remap_banks"):
        out.setdefault(s.label("gpu"), {})[s.label("availability")] = s.value
    return out


def retired_pages(ctx: Context) -> list[CheckResult]:
    out, up = _each_gpu(ctx, "retired_pages")
    t = ctx.profile.thresholds
    sbe = ctx.per_gpu("gpu_retired_pages", cause="sbe")
    dbe = ctx.per_gpu("gpu_retired_pages", cause="dbe")
    pend = ctx.per_gpu("gpu_retired_pages_pending")
    for g in up:
        i, e = g.label("gpu"), gpu_entity(g)
        if i not in sbe and i not in dbe:
            continue  # Ampere and later replace page retirement with row remapping
        ns, nd = int(sbe[i].value) if i in sbe else 0, int(dbe[i].value) if i in dbe else 0
        if ns + nd >= t["retired_pages_sbe_max"] or nd > t["retired_pages_dbe_max"]:
            out.append(fail("retired_pages", e, f"{ns + nd} retired pages ({nd} DBE)", Action.REPLACE, sbe=ns, dbe=nd))
        elif i in pend and pend[i].value >= 1:
            out.append(fail("retired_pages", e, "page retirement pending: reset the GPU", Action.RESET_GPU, sbe=ns, dbe=nd))
        else:
            out.append(ok("retired_pages", e, sbe=ns, dbe=nd))
    return _settle(ctx, "retired_pages", out)


def pcie(ctx: Context) -> list[CheckResult]:
    out, up = _each_gpu(ctx, "pcie")
    p, t = ctx.profile, ctx.profile.thresholds
    gen, width = ctx.per_gpu("gpu_pcie_link_gen"), ctx.per_gpu("gpu_pcie_link_width")
    util = ctx.per_gpu("gpu_utilization_ratio")
    replay = ctx.per_gpu("gpu_pcie_replay")
    for g in up:
        i, e = g.label("gpu"), gpu_entity(g)
        w, gn = width.get(i), gen.get(i)
        ev = {"gen": int(gn.value) if gn else "n/a", "width": int(w.value) if w else "n/a",
              "expected": f"gen{p.pcie_gen} x{p.pcie_width}"}
        if p.pcie_width and w is not None and w.value < p.pcie_width:
            out.append(fail("pcie", e, f"PCIe link degraded to x{int(w.value)}", Action.DRAIN, **ev))
            continue
        # GPUs drop the link generation when idle to save power: a low gen only counts under load.
        busy = util.get(i) is not None and util[i].value >= 0.3
        if p.pcie_gen and gn is not None and gn.value < p.pcie_gen and busy:
            out.append(fail("pcie", e, f"PCIe link at gen{int(gn.value)} under load", Action.DRAIN, **ev))
            continue
        r = replay.get(i)
        rate = ctx.rate_per_hour(r) if r is not None else None
        if rate is not None and rate > t["pcie_replay_per_hour"]:
            out.append(warn("pcie", e, f"PCIe replays at {rate:.0f}/h", replay_per_hour=round(rate, 1), **ev))
            continue
        out.append(ok("pcie", e, **ev))
    return _settle(ctx, "pcie", out)


def clocks(ctx: Context) -> list[CheckResult]:
    """Clock-event reasons as ONE node-level finding naming the affected GPUs.

    What each reason means is data (rules.yaml `clock_reasons`). Power brake and thermal slowdown
    come from the node (PSU, BMC, rack power, airflow), not from one GPU: a per-GPU FAIL would say
    "replace GPU 3" where the fix is a power supply, and would repeat the same finding eight times.
    """
    samples = ctx.samples("gpu_up")
    if not samples:
        return []
    table = rules.load().clock_reasons
    active: dict[str, set[str]] = {}
    for s in ctx.samples("gpu_clocks_event_active"):
        if s.value >= 1:
            active.setdefault(s.label("gpu"), set()).add(s.label("reason"))
    refused = _unreadable(ctx, "clocks")
    up = [s.label("gpu") for s in samples if s.value >= 1 and s.label("gpu") not in refused]
    silent = [s.label("gpu") for s in samples if s.value < 1 or s.label("gpu") in refused]
    if not up:
        return [unknown("clocks", "node", "no GPU answers NVML with its clocks-event reasons",
                        gpus_not_answering=_gpu_list(silent))]
    # reason -> GPUs where it counts (a reason explained by another active one adds nothing)
    by_reason: dict[str, list[str]] = {}
    for g in up:
        mine = active.get(g, set())
        for reason in sorted(mine):
            rule = table.get(reason)
            if rule is None or rule.status is Status.OK or mine & set(rule.explained_by):
                continue
            by_reason.setdefault(reason, []).append(g)
    seen = {r for g in up for r in active.get(g, set())}
    ev: dict[str, object] = {"reasons": ",".join(sorted(seen)) or "none"}
    if silent:
        ev["gpus_not_answering"] = _gpu_list(silent)
    if not by_reason:
        return [ok("clocks", "node", **ev)]
    rank = {Status.WARN: 1, Status.FAIL: 2}
    order = sorted(by_reason, key=lambda r: (-rank[table[r].status], r))
    worst = table[order[0]]
    affected = sorted({g for r in order for g in by_reason[r]}, key=int)
    ev = {"gpus": _gpu_list(affected), **{r: _gpu_list(by_reason[r]) for r in order}, **ev}
    parts = [f"GPU{'s' if len(by_reason[r]) > 1 else ''} {_gpu_list(by_reason[r])}"
             + (f" ({len(by_reason[r])} of {len(up)})" if len(by_reason[r]) > 1 else "") + f": {table[r].means}"
             for r in order]
    summary = "; ".join(parts)
    if worst.status is Status.FAIL:
        action = max((table[r].action for r in order if table[r].status is Status.FAIL), key=lambda a: a.rank)
        return [fail("clocks", "node", summary, action, **ev)]
    return [warn("clocks", "node", summary, **ev)]


def _gpu_list(gpus: list[str]) -> str:
    return ",".join(sorted(gpus, key=lambda g: int(g) if g.isdigit() else 1 << 30))


def temperature(ctx: Context) -> list[CheckResult]:
    out, up = _each_gpu(ctx, "temperature")
    t = ctx.profile.thresholds
    core, mem = ctx.per_gpu("gpu_temperature_celsius"), ctx.per_gpu("gpu_memory_temperature_celsius")
    margin = ctx.per_gpu("gpu_thermal_margin_celsius")
    for g in up:
        i, e = g.label("gpu"), gpu_entity(g)
        c, m, tl = core.get(i), mem.get(i), margin.get(i)
        ev = {"gpu_c": c.value if c else "n/a", "memory_c": m.value if m else "n/a"}
        if tl is not None:
            ev["t_limit_margin_c"] = tl.value
        if (c and c.value >= t["gpu_temp_fail_c"]) or (m and m.value >= t["mem_temp_fail_c"]):
            out.append(fail("temperature", e, "GPU above its temperature limit", Action.DRAIN, **ev))
        elif (c and c.value >= t["gpu_temp_warn_c"]) or (m and m.value >= t["mem_temp_warn_c"]):
            out.append(warn("temperature", e, "GPU running hot", **ev))
        elif tl is not None and tl.value <= t["thermal_margin_warn_c"]:
            # Before the slowdown (and its XID-free lost throughput): the GPU's own T.Limit, which
            # differs per SKU (an L4's is ~86 C, an H100 SXM's ~87 C), is what it throttles at.
            out.append(warn("temperature", e, f"GPU {tl.value:g} C from its T.Limit (thermal slowdown near)", **ev))
        else:
            out.append(ok("temperature", e, **ev))
    return _settle(ctx, "temperature", out)


def fabric(ctx: Context) -> list[CheckResult]:
    if not ctx.profile.has_nvswitch_fabric:
        return []
    out, up = _each_gpu(ctx, "fabric")
    state, healthy = ctx.per_gpu("gpu_fabric_state"), ctx.per_gpu("gpu_fabric_healthy")
    degraded = ctx.per_gpu("gpu_fabric_degraded_bandwidth")
    domain, rack = _nvl_domain(ctx)
    names = {0: "not supported", 1: "not started", 2: "in progress", 3: "completed"}
    for g in up:
        i, e = g.label("gpu"), gpu_entity(g)
        s, h = state.get(i), healthy.get(i)
        if s is None:
            out.append(unknown("fabric", e, "GPU fabric state not reported"))
        elif s.value == 0:
            # NVML_GPU_FABRIC_STATE_NOT_SUPPORTED: this GPU / driver takes no part in a fabric it
            # can report on. No reading of a fabric fault: the profile and the node disagree.
            out.append(unknown("fabric", e, "GPU reports no NVSwitch fabric (state not supported)"))
        elif s.value != 3 or (h is not None and h.value < 1):
            out.append(fail("fabric", e, f"GPU fabric {names.get(int(s.value), int(s.value))}: check nvidia-fabricmanager",
                            Action.REBOOT, state=names.get(int(s.value), str(int(s.value)))))
        elif domain and i not in domain:
            out.append(fail("fabric", e, "GPU registered in no multi-node NVLink domain (zero cluster UUID)",
                            Action.REBOOT, state="completed"))
        elif domain and domain[i] != rack:
            out.append(fail("fabric", e, f"GPU in NVLink domain {domain[i][0]} clique {domain[i][1]}, its tray's "
                                         f"other GPUs in {rack[0]} clique {rack[1]}", Action.REBOOT,
                            cluster_uuid=domain[i][0], clique_id=domain[i][1]))
        elif degraded.get(i) is not None and degraded[i].value >= 1:
            out.append(warn("fabric", e, "NVLink bandwidth degraded (fabric health mask)", state="completed"))
        else:
            out.append(ok("fabric", e, state="completed", **({"cluster_uuid": domain[i][0]} if i in domain else {})))
    return _settle(ctx, "fabric", out)


def _nvl_domain(ctx: Context) -> tuple[dict[str, tuple[str, str]], tuple[str, str]]:
    """GPU -> (cluster UUID, clique) where the profile's NVLink domain spans nodes (GB200 NVL72),
    and the pair most of the node's GPUs share (what the odd one out is told apart from)."""
    if not ctx.profile.nvlink_domain.gpus:
        return {}, ("", "")
    got = {s.label("gpu"): (s.label("cluster_uuid"), s.label("clique_id")) for s in ctx.samples("gpu_fabric_info")}
    if not got:
        return {"": ("", "")}, ("", "")  # no GPU in any domain: each GPU's own verdict says so
    common = Counter(got.values()).most_common(1)[0][0]
    return got, common


def persistence(ctx: Context) -> list[CheckResult]:
    out, up = _each_gpu(ctx, "persistence")
    pm = ctx.per_gpu("gpu_persistence_mode")
    for g in up:
        i, e = g.label("gpu"), gpu_entity(g)
        if i in pm and pm[i].value < 1:
            out.append(warn("persistence", e, "persistence mode off (slow CUDA init, lost state between jobs)"))
        elif i in pm:
            out.append(ok("persistence", e))
    return _settle(ctx, "persistence", out)


def driver(ctx: Context) -> list[CheckResult]:
    versions = {s.label("driver_version") for s in ctx.samples("gpu_info") if s.label("driver_version")}
    if not versions:
        return [unknown("driver", "node", "driver version not reported")]
    v = sorted(versions)[0]
    need = ctx.profile.min_driver
    if _version_tuple(v) < _version_tuple(need):
        # Fleet policy, not a hardware fault: fails the handover, asks for no fence by itself.
        return [fail("driver", "node", f"driver {v} below fleet minimum {need}", Action.NONE, driver=v, minimum=need)]
    return [ok("driver", "node", driver=v, minimum=need)]
