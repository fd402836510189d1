"""NVLink checks: links down (a GPU cut off from the NVSwitch fabric) and error counters rising."""

from __future__ import annotations

from podhealth.checks.passive.context import Context, gpu_entity
from podhealth.checks.passive.result import fail, ok, unknown, warn
from podhealth.vocab import Action, CheckResult, Sample


def _by_gpu(samples: list[Sample]) -> dict[str, list[Sample]]:
    out: dict[str, list[Sample]] = {}
    for s in samples:
        out.setdefault(s.label("gpu"), []).append(s)
    return out


def nvlink(ctx: Context) -> list[CheckResult]:
    expected_default = ctx.profile.nvlink_links
    if not expected_default:
        return []
    out: list[CheckResult] = []
    limit = ctx.profile.thresholds["nvlink_errors_per_hour"]
    # Each GPU's links and counters, grouped once (in their order) rather than scanned per GPU.
    errors = _by_gpu(ctx.samples("nvlink_errors"))
    link_states = _by_gpu(ctx.samples("nvlink_up"))
    expected = ctx.per_gpu("nvlink_links_expected")
    mig = ctx.per_gpu("gpu_mig_mode")
    counted = {s.label("gpu") for s in ctx.samples("nvlink_links_up")}
    for g in ctx.samples("nvlink_links_expected"):
        if g.label("gpu") not in counted:
            # The GPU did not answer, or NVML refused a link's state: no count, so no verdict.
            out.append(unknown("nvlink", gpu_entity(g), "NVLink link states not readable", uuid=g.label("uuid")))
    for s in ctx.samples("nvlink_links_up"):
        i, e = s.label("gpu"), gpu_entity(s)
        want = int(expected[i].value) if i in expected else expected_default
        links = link_states.get(i, [])
        if s.value < want and not links:
            # NVML says this GPU has no NVLink at all (every link NOT_SUPPORTED): a link that
            # failed still exists and reads inactive (nvidia-smi "<inactive>"). No link is seen
            # down: the node and its profile disagree (a PCIe build, a VM), not a fault to fence.
            out.append(unknown("nvlink", e, f"GPU reports no NVLink links; the profile expects {want}",
                               links_up=0, expected=want))
            continue
        down = sorted(int(l.label("link")) for l in links if l.value < 1)
        if s.value < want and i in mig and mig[i].value >= 1:
            # MIG instances do not use NVLink (no GPU-to-GPU P2P in MIG mode, NVIDIA MIG user
            # guide): links not up there take no job down and are no fence reason; not judged.
            out.append(unknown("nvlink", e, "MIG mode: NVLink links not judged", links_up=int(s.value),
                               expected=want, down=",".join(map(str, down)) or "?"))
            continue
        if s.value < want:
            # NVIDIA: a link that trained down does not come back without a GPU reset; on
            # NVSwitch systems the whole fabric partition is rebuilt, so reboot the node.
            out.append(fail("nvlink", e, f"{int(s.value)} of {want} NVLinks up", Action.REBOOT,
                            links_up=int(s.value), expected=want, down=",".join(map(str, down)) or "?"))
            continue
        rising = []
        for c in errors.get(i, ()):
            r = ctx.rate_per_hour(c)
            if r is not None and r > limit:
                rising.append(f"link{c.label('link')}:{c.label('type')}={r:.0f}/h")
        if rising:
            out.append(warn("nvlink", e, "NVLink error counters rising", rising=" ".join(sorted(rising)[:8]), limit_per_hour=limit))
        else:
            out.append(ok("nvlink", e, links_up=int(s.value), expected=want))
    return out
