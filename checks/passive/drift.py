"""Version drift: driver, VBIOS, HCA firmware, OFED and kernel against the versions the profile
states (a site golden profile, checks/profiles/site.py).

One result per field (entity = the field). A field the profile does not state is OK and only
reports what the node runs, so the aggregator's fleet view (`GET /v1/fleet/versions`) can count
versions from any node's report. A field that differs gets the profile's `drift.<field>` verdict
(WARN by default; FAIL asks for DRAIN; OK only shows it). A stated version that cannot be read
(stale collector, no HCA, no OFED) is UNKNOWN: an unreadable source never fails a node.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Mapping

from podhealth.checks.passive.context import Context
from podhealth.checks.passive.result import fail, ok, unknown, warn
from podhealth.snapshot import Snapshot
from podhealth.vocab import Action, CheckResult, Sample

FIELDS = ("driver", "vbios", "hca_fw", "ofed", "kernel")
# field -> (collector, sample name, label holding the version)
_SOURCES: dict[str, tuple[str, str, str]] = {
    "driver": ("nvml", "gpu_info", "driver_version"),
    "vbios": ("nvml", "gpu_info", "vbios_version"),
    "hca_fw": ("infiniband", "infiniband_info", "firmware_version"),
    "ofed": ("host", "host_ofed_info", "version"),
    "kernel": ("host", "host_kernel_info", "release"),
}


@dataclass(frozen=True)
class Seen:
    """One reading of a version: where (gpu3, mlx5_0, node), what, and the HCA board id (hca_fw)."""

    where: str
    version: str
    board: str = ""


def _where(field: str, s: Sample) -> str:
    if field in ("driver", "vbios"):
        return f"gpu{s.label('gpu')}"
    if field == "hca_fw":
        return s.label("device")
    return "node"


def observe(snap: Snapshot, samples: Callable[[str], Iterable[Sample]] | None = None,
            ) -> dict[str, tuple[Seen, ...] | None]:
    """What the node runs, per field; None when the field's source has no fresh data or gave
    nothing (unreadable), never a guess. Shared by the drift check and `podhealth profile`.
    `samples`: series by name (the check passes its Context's index; default: a scan)."""
    by_name = samples or snap.samples
    out: dict[str, tuple[Seen, ...] | None] = {}
    for field, (collector, name, label) in _SOURCES.items():
        if snap.stale(collector):
            out[field] = None
            continue
        seen = tuple(Seen(_where(field, s), s.label(label), s.label("board_id"))
                     for s in by_name(name) if s.label(label))
        out[field] = seen or None
    return out


def distinct(seen: Iterable[Seen]) -> list[str]:
    return sorted({s.version for s in seen})


def _differs(field: str, expected: object, seen: tuple[Seen, ...]) -> tuple[list[Seen], list[Seen]]:
    """(readings that differ, HCA readings whose board the profile does not list)."""
    if field == "hca_fw":
        by_board = expected if isinstance(expected, Mapping) else {}
        unlisted = [s for s in seen if s.board not in by_board]
        return [s for s in seen if s.board in by_board and s.version != str(by_board[s.board])], unlisted
    return [s for s in seen if s.version != expected], []


def _stated(expected: object) -> bool:
    return bool(expected)


def drift(ctx: Context) -> list[CheckResult]:
    p = ctx.profile
    observed = observe(ctx.snapshot, ctx.samples)
    out: list[CheckResult] = []
    for field in FIELDS:
        expected = p.versions.get(field)
        seen = observed[field]
        shown = ", ".join(distinct(seen)) if seen else ""
        # HCA firmware per board: compute and storage adapters are different boards with their own
        # firmware lines, and "16 nodes run X, 16 run Y" must not read like 32 nodes (fleet versions).
        boards = ({"boards": ", ".join(sorted({f"{s.board or '?'}={s.version}" for s in seen}))}
                  if field == "hca_fw" and seen else {})
        # The version is in the summary as well as the evidence: a heartbeat lease vouches for
        # summaries, not evidence, so an upgrade reaches the aggregator's fleet view at once.
        if not _stated(expected):
            out.append(ok("drift", field, f"{shown or 'not read'} (not stated in the profile)", observed=shown, **boards))
            continue
        want = (" ".join(f"{b}={v}" for b, v in sorted(expected.items())) if isinstance(expected, Mapping)
                else str(expected))
        if seen is None:
            collector = _SOURCES[field][0]
            out.append(unknown("drift", field, f"{field} version could not be read ({collector})", expected=want))
            continue
        differ, unlisted = _differs(field, expected, seen)
        ev: dict[str, object] = {"observed": shown, "expected": want, **boards}
        if unlisted:
            ev["unlisted"] = " ".join(f"{s.where}:{s.board or '?'}={s.version}" for s in unlisted)
        if not differ:
            if unlisted and len(unlisted) == len(seen):
                out.append(unknown("drift", field, "no HCA board here is listed in the profile", **ev))
            else:
                out.append(ok("drift", field, shown, **ev))
            continue
        ev["differs"] = " ".join(f"{s.where}={s.version}" for s in differ)
        summary = f"{field} {', '.join(distinct(differ))} where the profile states {want}"
        verdict = p.drift.get(field, "WARN")
        if verdict == "FAIL":
            out.append(fail("drift", field, summary, Action.DRAIN, **ev))
        elif verdict == "OK":
            out.append(ok("drift", field, summary + " (drift: OK)", **ev))
        else:
            out.append(warn("drift", field, summary, **ev))
    return out
