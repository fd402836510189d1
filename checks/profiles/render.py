"""Write an Observation as a site golden profile (YAML), each value with a comment saying where
it came from, and render a profile diff as a table."""

from __future__ import annotations

import time
from typing import Any, TextIO

import yaml

from podhealth.checks.profiles import catalog
from podhealth.checks.profiles.capture import Diff, Observation, Seen

# Top-level keys in the order a reader checks them.
_TOP_KEYS = ("gpu_count", "gpu_model", "gpu_memory_mib", "nvlink_links", "pcie_gen", "pcie_width", "power_limit_w",
             "nfs_mounts")
_VERSIONS = ("driver", "vbios", "ofed", "kernel", "hca_fw")


def _flow(v: Any) -> str:
    text = yaml.safe_dump(v, default_flow_style=True, width=10_000, sort_keys=False).strip()
    return text.removesuffix("...").strip()


def _line(indent: int, key: str, value: Any, seen: Seen | None, width: int = 44) -> str:
    head = f"{'  ' * indent}{key}: {_flow(value)}"
    comment = seen.source + (f"; differs within the node: {seen.detail}" if seen and seen.detail else "") if seen else ""
    return f"{head.ljust(width)}  # {comment}" if comment else head


def _role(base: catalog.Profile, role: str, seen: Seen) -> dict[str, Any]:
    spec = base.network.roles[role]
    got = seen.value
    bonded = spec.bonded
    if got.get("bonded") and bonded == "forbidden":
        bonded = "allowed"  # this site bonds the role's ports: that is its healthy build
    return {"count": got["count"], "rate_gbps": got["rate_gbps"] or list(spec.rate_gbps),
            "link_layers": got["link_layers"] or list(spec.link_layers), "bonded": bonded,
            "missing": spec.missing, "port_fault": spec.port_fault}


def capture_yaml(obs: Observation, extends: str, why: str, origin: str, now: float | None = None,
                 nccl_gate: tuple[float, str] | None = None) -> str:
    """The site profile text. Values the node could not show are left out (and said so), so the
    profile inherits them from `extends` rather than stating a guess."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now if now is not None else time.time()))
    base = catalog.load(extends)
    out = [
        f"# podhealth site golden profile, captured {stamp} from {origin}.",
        "# Every value is what that node showed; the comment after it says where it came from.",
        "# Review it (keep what every good node of this build must match), install it on the nodes and set",
        "#   checks.profile_file: /etc/podhealth/site-profile.yaml",
        "# `podhealth profile diff FILE --node NAME` shows how a node differs from it.",
        _line(0, "extends", extends, Seen(extends, f"closest shipped profile: {why}")),
        _line(0, "name", f"{extends}-site", Seen("", "shown as the node's profile in reports")),
    ]
    left_out: list[str] = []
    for key in _TOP_KEYS:
        seen = obs.values.get(key)
        if seen is None:
            left_out.append(key)
            continue
        out.append(_line(0, key, seen.value, seen))
    roles = {k.removeprefix("network.roles."): v for k, v in obs.values.items() if k.startswith("network.roles.")}
    if roles and all(v is not None for v in roles.values()):
        out += ["network:", "  roles:                                    # adapters by role, told apart by the "
                f"{extends} rules (checks/passive/ib_roles.py)"]
        for role, seen in roles.items():
            assert seen is not None
            out.append(_line(2, role, _role(base, role, seen), seen, 0))
    elif roles:
        left_out.append("network.roles")
    out.append("versions:")
    for f in _VERSIONS:
        seen = obs.values.get(f"versions.{f}")
        if seen is None:
            out.append(f"  # {f}: not readable on this node, not stated")
        elif f == "hca_fw":  # a version per HCA board
            out.append(f"  hca_fw:                                    # {seen.source}")
            for board, version in seen.value.items():
                out.append(_line(2, board, version, Seen(version, "fw_ver", seen.detail if seen.detail else "")))
        else:
            out.append(_line(1, f, seen.value, seen))
    if nccl_gate is not None:
        out += ["thresholds:", _line(1, "nccl_multinode_busbw_gbps", nccl_gate[0],
                                      Seen(nccl_gate[0], f"this site's fabric: {nccl_gate[1]}"))]
    else:
        out.append(f"# thresholds.nccl_multinode_busbw_gbps: not measured here (inherited from {extends}; "
                   "0 = UNKNOWN): `profile capture --nccl FILE` states this fabric's own")
    out += ["# What differs from these versions gets the drift check's verdict: WARN unless set here",
            "# (per field: OK, WARN or FAIL; an unreadable version is UNKNOWN, never FAIL).",
            "drift: {driver: WARN, vbios: WARN, hca_fw: WARN, ofed: WARN, kernel: WARN}"]
    if left_out:
        out.append(f"# Not captured (their source had no fresh data; inherited from {extends}): {', '.join(left_out)}")
    out += [f"# {n}" for n in obs.notes]
    return "\n".join(out) + "\n"


def _cell(v: Any) -> str:
    if v is None:
        return "?"
    return _flow(v) if isinstance(v, (list, dict)) else str(v)


def diff_table(d: Diff, out: TextIO, verbose: bool = False) -> None:
    rows = [r for r in d.rows if verbose or r.status != "same"]
    verdict = {0: "same as the profile", 1: "DIFFERS from the profile", 2: "cannot tell (some values unreadable)"}
    out.write(f"{d.node or 'node'} vs {d.profile}: {verdict[d.exit_code]}"
              f" ({sum(r.status == 'same' for r in d.rows)} of {len(d.rows)} stated values the same)\n")
    if not rows:
        return
    table = [("KEY", "PROFILE", "NODE", "STATUS", "DETAIL")] + [
        (r.key, _cell(r.expected), _cell(r.observed), r.status, r.detail) for r in rows]
    widths = [min(48, max(len(row[i]) for row in table)) for i in range(4)]
    for row in table:
        cells = [row[i][:widths[i]].ljust(widths[i]) for i in range(4)]
        out.write("  ".join(cells) + ("  " + row[4] if row[4] else "") + "\n")
