"""NFS checks: required mounts present and answering, RTT and retransmissions over the window."""

from __future__ import annotations

from collections import defaultdict

from podhealth.checks.passive.context import Context
from podhealth.checks.passive.result import fail, ok, unknown, warn
from podhealth.vocab import Action, CheckResult


def nfs_mount(ctx: Context) -> list[CheckResult]:
    out: list[CheckResult] = []
    present = {s.label("mountpoint"): s.value for s in ctx.samples("nfs_mount_present")}
    probe = {s.label("mountpoint"): s for s in ctx.samples("nfs_probe_ok")}
    secs = {s.label("mountpoint"): s.value for s in ctx.samples("nfs_probe_seconds")}
    auto = {s.label("mountpoint") for s in ctx.samples("nfs_mount_automount") if s.value >= 1}
    wanted = sorted(set(present) | set(ctx.required_mounts) | auto)
    for m in wanted:
        if m not in present and m in auto:
            # An autofs trigger (auto.master): NFS is mounted when something walks into it, and
            # the probe's statfs does; its answer is the verdict.
            if m in probe and probe[m].value < 1:
                out.append(fail("nfs_mount", m, f"statfs did not answer within {secs.get(m, 0):.1f}s (automount)",
                                Action.DRAIN, probe_seconds=secs.get(m, 0), automount="true"))
            else:
                out.append(ok("nfs_mount", m, "autofs: mounted on demand", automount="true",
                              probe_seconds=round(secs.get(m, 0.0), 4)))
        elif m not in present:
            # "Missing" needs a mount table that was read and lacks the mount; without one
            # (mountstats unreadable, or the mount not among collectors.nfs.mounts) nobody looked.
            out.append(unknown("nfs_mount", m, "presence not known: the mount table was not read for this mount"))
        elif present[m] < 1:
            out.append(fail("nfs_mount", m, "NFS mount missing", Action.DRAIN))
        elif m in probe and probe[m].value < 1:
            out.append(fail("nfs_mount", m, f"statfs did not answer within {secs.get(m, 0):.1f}s (hung mount)",
                            Action.DRAIN, probe_seconds=secs.get(m, 0)))
        else:
            out.append(ok("nfs_mount", m, probe_seconds=round(secs.get(m, 0.0), 4)))
    return out


def nfs_latency(ctx: Context) -> list[CheckResult]:
    t = ctx.profile.thresholds
    rtt: dict[str, float] = defaultdict(float)
    reqs: dict[str, float] = defaultdict(float)
    trans: dict[str, float] = defaultdict(float)
    mounts: set[str] = set()
    for name, acc in (("nfs_operation_rtt_seconds", rtt), ("nfs_operation_requests", reqs),
                      ("nfs_operation_transmissions", trans)):
        for s in ctx.samples(name):
            m = s.label("mountpoint")
            mounts.add(m)
            inc = ctx.increase(s)
            if inc is not None and inc > 0:
                acc[m] += inc
    out: list[CheckResult] = []
    span = ctx.window / 60.0
    for m in sorted(mounts):
        n = reqs.get(m, 0.0)
        avg_ms = rtt[m] / n * 1000 if n > 0 else 0.0
        retrans = max(0.0, trans.get(m, 0.0) - n)
        retrans_per_min = retrans / span if span > 0 else 0.0
        ev = {"avg_rtt_ms": round(avg_ms, 2), "retrans_per_min": round(retrans_per_min, 2), "requests": int(n)}
        if n > 0 and avg_ms > t["nfs_rtt_ms_warn"]:
            out.append(warn("nfs_latency", m, f"average RTT {avg_ms:.0f} ms", limit_ms=t["nfs_rtt_ms_warn"], **ev))
        elif retrans_per_min > t["nfs_retrans_per_min_warn"]:
            out.append(warn("nfs_latency", m, f"{retrans_per_min:.0f} retransmissions/min", **ev))
        else:
            out.append(ok("nfs_latency", m, **ev))
    return out
