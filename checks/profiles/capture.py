"""What a node shows, in the terms of a hardware profile: the input of `podhealth profile capture`
(write it down as a site golden profile) and `podhealth profile diff` (compare it with one).

Pure: a Snapshot in (collected now on this node, on a simulated node, or parsed from an agent's
/metrics), an Observation out. Every value says which collector and series it came from; a value
whose source had no fresh data is None, never a guess, and a diff says "unknown" for it.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from podhealth.checks.passive import drift
from podhealth.checks.profiles import catalog
from podhealth.snapshot import Snapshot
from podhealth.vocab import Sample

MIB = 1024 * 1024


@dataclass(frozen=True)
class Seen:
    """One observed profile value and where it came from ("nvml: gpu_devices")."""

    value: Any
    source: str
    detail: str = ""  # what differs within the node, e.g. "gpu3=17" when GPUs disagree


@dataclass(frozen=True)
class Observation:
    """Profile key (dotted) -> what the node shows; None = its source could not be read."""

    values: Mapping[str, Seen | None]
    notes: tuple[str, ...] = ()  # facts shown as comments only (HCA PCIe, collectors that were stale)
    node: str = ""

    def get(self, key: str) -> Any:
        s = self.values.get(key)
        return s.value if s is not None else None


def _fresh(snap: Snapshot, collector: str) -> bool:
    return not snap.stale(collector)


def _per_gpu(snap: Snapshot, name: str) -> dict[str, float]:
    return {s.label("gpu"): s.value for s in snap.samples(name)}


def _uniform(values: Mapping[str, float], fmt: str = "{}") -> tuple[int, str] | None:
    """The value every entity agrees on, or the lowest one with who differs: a golden node whose
    GPUs disagree is worth a second look, and the comment says so."""
    if not values:
        return None
    common = Counter(values.values()).most_common(1)[0][0]
    odd = {k: v for k, v in values.items() if v != common}
    detail = " ".join(f"{fmt.format(k)}={int(v)}" for k, v in sorted(odd.items()))
    return int(min(values.values())), detail


def _gpus(snap: Snapshot, out: dict[str, Seen | None]) -> None:
    keys = ("gpu_count", "gpu_model", "gpu_memory_mib", "pcie_gen", "pcie_width", "power_limit_w")
    if not _fresh(snap, "nvml"):
        out.update({k: None for k in keys})
        return
    count = next((s.value for s in snap.samples("gpu_devices")), None)
    out["gpu_count"] = Seen(int(count), "nvml: gpu_devices") if count is not None else None
    models = Counter(s.label("model") for s in snap.samples("gpu_up") if s.label("model"))
    if models:
        model, _ = models.most_common(1)[0]
        detail = "" if len(models) == 1 else "mixed: " + ", ".join(f"{m} x{n}" for m, n in models.items())
        out["gpu_model"] = Seen(model, "nvml: GPU name", detail)
    else:
        out["gpu_model"] = None
    for key, name, scale, src in (
            ("gpu_memory_mib", "gpu_memory_total_bytes", 1 / MIB, "nvml: memory total (MiB)"),
            ("pcie_gen", "gpu_pcie_link_gen_max", 1, "nvml: max PCIe link gen (GPU and host)"),
            ("pcie_width", "gpu_pcie_link_width_max", 1, "nvml: max PCIe link width"),
            ("power_limit_w", "gpu_power_limit_watts", 1, "nvml: enforced power limit (W)")):
        u = _uniform({g: round(v * scale) for g, v in _per_gpu(snap, name).items()}, "gpu{}")
        out[key] = Seen(u[0], src, u[1]) if u else None


def _nvlink(snap: Snapshot, out: dict[str, Seen | None]) -> None:
    if not _fresh(snap, "nvlink"):
        out["nvlink_links"] = None
        return
    u = _uniform(_per_gpu(snap, "nvlink_links_up"), "gpu{}")
    out["nvlink_links"] = Seen(u[0], "nvlink: links up per GPU (the fewest)", u[1]) if u else None


def _nfs(snap: Snapshot, out: dict[str, Seen | None]) -> None:
    if not _fresh(snap, "nfs"):
        out["nfs_mounts"] = None
        return
    # every mount in mountstats carries counter series; configured ones also nfs_mount_present
    mounts = {s.label("mountpoint") for s in snap.samples() if s.name.startswith("nfs_") and s.label("mountpoint")
              and not (s.name == "nfs_mount_present" and s.value < 1)
              and s.name not in ("nfs_probe_ok", "nfs_probe_seconds")}
    out["nfs_mounts"] = Seen(sorted(mounts), "nfs: mounts in mountstats")


def _versions(snap: Snapshot, out: dict[str, Seen | None]) -> None:
    seen = drift.observe(snap)
    sources = {"driver": "nvml: driver version", "vbios": "nvml: VBIOS", "ofed": "host: OFED version",
               "kernel": "host: kernel release (osrelease)", "hca_fw": "infiniband: fw_ver by board_id"}
    for f in ("driver", "vbios", "ofed", "kernel"):
        got = seen[f]
        if got is None:
            out[f"versions.{f}"] = None
            continue
        values = Counter(s.version for s in got)
        common = values.most_common(1)[0][0]
        odd = " ".join(f"{s.where}={s.version}" for s in got if s.version != common)
        src = sources[f]
        if f == "ofed":
            src += f" ({next(iter(snap.samples('host_ofed_info'))).label('source') or '?'})"
        out[f"versions.{f}"] = Seen(common, src, odd)
    fw = seen["hca_fw"]
    if fw is None:
        out["versions.hca_fw"] = None
        return
    by_board: dict[str, Counter[str]] = {}
    where: dict[str, list[str]] = {}
    for s in fw:
        if s.board:
            by_board.setdefault(s.board, Counter())[s.version] += 1
            where.setdefault(s.board, []).append(s.where)
    value = {b: c.most_common(1)[0][0] for b, c in sorted(by_board.items())}
    odd = " ".join(f"{s.where}={s.version}" for s in fw if s.board and s.version != value[s.board])
    boards = "; ".join(f"{b}: {', '.join(sorted(w))}" for b, w in sorted(where.items()))
    out["versions.hca_fw"] = Seen(value, f"{sources['hca_fw']} ({boards})", odd) if value else None


def _hca_pcie(snap: Snapshot) -> list[str]:
    """HCA PCIe links, when the collector exports them (a comment: the profile does not judge them)."""
    speed = {s.label("device"): s for s in snap.samples("infiniband_device_pcie_link_gen")}
    width = {s.label("device"): s for s in snap.samples("infiniband_device_pcie_link_width")}
    if not speed and not width:
        return []
    links = Counter(f"gen{int(speed[d].value) if d in speed else '?'} x{int(width[d].value) if d in width else '?'}"
                    for d in sorted(set(speed) | set(width)))
    return ["HCA PCIe links: " + ", ".join(f"{n} at {link}" for link, n in links.items())]


def observe(snap: Snapshot, network: Mapping[str, Seen | None] | None = None, node: str = "") -> Observation:
    """Everything a profile can state, as the node shows it. `network` (role -> observed role
    spec) comes from checks/profiles/network.py, kept apart because it needs the role rules."""
    out: dict[str, Seen | None] = {}
    _gpus(snap, out)
    _nvlink(snap, out)
    _nfs(snap, out)
    _versions(snap, out)
    for role, seen in (network or {}).items():
        out[f"network.roles.{role}"] = seen
    notes = _hca_pcie(snap)
    notes += [f"collector {c}: no fresh data, its values are left out" for c in ("nvml", "nvlink", "infiniband", "nfs", "host")
              if c in snap.collectors and snap.stale(c)]
    return Observation(out, tuple(notes), node)


# ---- closest shipped profile -----------------------------------------------------------------

_FAMILY = re.compile(r"\b([ABH]\d{3})\b")


def closest(obs: Observation) -> tuple[str, str]:
    """(shipped profile, why): the same GPU model, else the same GPU family (H100, B200) in the
    model name, else `generic`."""
    return candidates(obs)[0]


def candidates(obs: Observation) -> list[tuple[str, str]]:
    """The shipped profiles the node's GPUs make equally close, best first, in the one list's
    order (an HGX board reads as its DGX: the adapters tell them apart, `fits_adapters`)."""
    model = str(obs.get("gpu_model") or "")
    count = obs.get("gpu_count")
    best: list[tuple[int, str, str]] = [(0, "generic", "no shipped profile has this GPU")]
    for name in catalog.names():
        if name == "generic":
            continue
        p = catalog.load(name)
        score, why = 0, ""
        if model and model == p.gpu_model:
            score, why = 100, f'GPU model "{model}"'
        else:
            fam = _FAMILY.search(model)
            if fam and fam.group(1) in p.gpu_model:
                score, why = 50, f"{fam.group(1)} GPUs"
        if score and count == p.gpu_count:
            score += 10
            why += f", {count} GPUs"
        if score > best[0][0]:
            best = [(score, name, why)]
        elif score and score == best[0][0]:
            best.append((score, name, why))
    return [(name, why) for _, name, why in best]


def fits_adapters(prof: catalog.Profile, roles: Mapping[str, "Seen | None"]) -> bool:
    """Does the node have the adapters `prof` requires (roles whose shortfall fails)? Unread
    roles do not rule a profile out."""
    for name, role in prof.network.roles.items():
        seen = roles.get(name)
        if role.missing == "fail" and role.count and seen is not None and seen.value.get("count", 0) < role.count:
            return False
    return True


# ---- diff ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    key: str
    expected: Any
    observed: Any
    status: str  # same | differs | unknown | extra
    source: str = ""
    detail: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"key": self.key, "expected": self.expected, "observed": self.observed, "status": self.status,
                "source": self.source, "detail": self.detail}


@dataclass(frozen=True)
class Diff:
    profile: str
    node: str
    rows: tuple[Row, ...] = field(default_factory=tuple)

    @property
    def exit_code(self) -> int:
        """0 same, 1 differs, 2 cannot tell: a stated value could not be read (README's contract),
        even when another differs. 7 of 11 values unreadable is not a reading of the node: a
        difference seen beside them may be the same fault (a stale collector), and the rows say
        what differed either way."""
        if any(r.status == "unknown" for r in self.rows):
            return 2
        return 1 if any(r.status == "differs" for r in self.rows) else 0

    def to_json(self) -> dict[str, Any]:
        verdict = {0: "same", 1: "differs", 2: "unknown"}[self.exit_code]
        return {"profile": self.profile, "node": self.node, "result": verdict, "rows": [r.to_json() for r in self.rows]}


def expected_values(prof: catalog.Profile) -> dict[str, Any]:
    """The profile's stated values under the keys `observe` uses; 0 / "" / empty = not stated."""
    out: dict[str, Any] = {k: getattr(prof, k) for k in
                           ("gpu_count", "gpu_model", "gpu_memory_mib", "nvlink_links", "pcie_gen", "pcie_width",
                            "power_limit_w")}
    out["nfs_mounts"] = sorted(prof.nfs_mounts)
    for f in drift.FIELDS:
        out[f"versions.{f}"] = prof.versions.get(f) or None
    for name, role in prof.network.roles.items():
        out[f"network.roles.{name}"] = {"count": role.count, "rate_gbps": list(role.rate_gbps),
                                        "link_layers": list(role.link_layers)}
    return {k: v for k, v in out.items() if v not in (0, "", None, [], {})}


def _compare(key: str, want: Any, got: Any) -> tuple[str, str]:
    if key == "nfs_mounts":
        missing = sorted(set(want) - set(got))
        extra = sorted(set(got) - set(want))
        if missing:
            return "differs", "missing " + " ".join(missing)
        return ("extra", "also mounted " + " ".join(extra)) if extra else ("same", "")
    if key == "versions.hca_fw":
        shared = sorted(set(want) & set(got))
        if not shared:
            return "unknown", "no HCA board here is listed in the profile"
        bad = [f"{b}: {got[b]}" for b in shared if str(got[b]) != str(want[b])]
        return ("differs", "; ".join(bad)) if bad else ("same", "")
    if key.startswith("network.roles."):
        bad = []
        if got.get("count", 0) < want["count"]:
            bad.append(f"{got.get('count', 0)} of {want['count']} links")
        rates = want.get("rate_gbps") or []
        slow = [r for r in got.get("rate_gbps", []) if rates and r not in rates and r < max(rates)]
        if slow:
            bad.append("rate " + ",".join(map(str, slow)) + " Gb/s")
        layers = want.get("link_layers") or []
        odd = [x for x in got.get("link_layers", []) if layers and x not in layers]
        if odd:
            bad.append("link layer " + ",".join(odd))
        return ("differs", "; ".join(bad)) if bad else ("same", "")
    return ("same", "") if str(want) == str(got) else ("differs", "")


def diff(obs: Observation, prof: catalog.Profile) -> Diff:
    rows = []
    for key, want in expected_values(prof).items():
        seen = obs.values.get(key)
        if seen is None:
            rows.append(Row(key, want, None, "unknown", "", "could not be read"))
            continue
        status, detail = _compare(key, want, seen.value)
        detail = "; ".join(x for x in (detail, seen.detail) if x)
        rows.append(Row(key, want, seen.value, status, seen.source, detail))
    return Diff(prof.name, obs.node, tuple(rows))


def samples_by_collector(samples: Iterable[Sample]) -> dict[str, list[Sample]]:
    """Series from an agent's /metrics, sorted to the collector that exports them."""
    out: dict[str, list[Sample]] = {}
    for s in samples:
        c = _COLLECTOR_OF.get(s.name.split("_", 1)[0])
        if c is not None:
            out.setdefault(c, []).append(s)
    return out


_COLLECTOR_OF = {"gpu": "nvml", "nvlink": "nvlink", "infiniband": "infiniband", "nfs": "nfs", "host": "host",
                 "systemd": "host"}
