"""The passive-check engine: every check over the latest snapshot, with staleness and damping.

Checks are pure functions of a Context (checks/passive/context.py). The engine adds what they must not
know about: which collectors each check needs (a stale source makes the check UNKNOWN, never OK
and never FAIL), counter history for rates, and flap damping. How long each check's verdict
must hold, and which ones are immediate (a critical XID, a DBE, a lost GPU: they cannot flap, and
waiting would only delay the fence), is data: checks/data/rules.yaml. A grace period after boot or
a driver change (checks/passive/grace.py) holds the other FAILs as WARN.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable, Iterator, Mapping, Sequence

from podhealth.checks.passive import aer, drift, gpu, host, ib, imex, memory_ecc, nfs, nvlink, nvme, site
from podhealth.checks.passive.context import Context, SampleIndex, observe_counters
from podhealth.checks.passive.damping import Damper
from podhealth.checks.passive.grace import GraceClock
from podhealth.checks.passive.ib_links import LinkTracker
from podhealth.checks import policy as site_policy
from podhealth.checks.profiles import Profile
from podhealth.checks.passive.rates import RateTracker
from podhealth.checks.passive.rules import DampRule, Rules, RulesError
from podhealth.checks.passive.rules import load as load_rules
from podhealth.checks.passive.result import unknown
from podhealth.config import ChecksConfig
from podhealth.config_policy import SITE_PREFIX
from podhealth.snapshot import Snapshot
from podhealth.vocab import MAX_EVIDENCE_ITEMS, CheckResult, Event, Status

CheckFn = Callable[[Context], list[CheckResult]]


@dataclass(frozen=True)
class CheckDef:
    fn: CheckFn
    sources: tuple[str, ...]
    # Whether this kind of node has what the check judges at all (the IMEX service only on a
    # multi-node NVLink domain): where it has not, no verdict, rather than UNKNOWN from a source
    # that is rightly absent (the imex collector is disabled where nvidia-imex-ctl is not installed).
    applies: Callable[[Profile], bool] | None = None


def _xid(ctx: Context) -> list[CheckResult]:
    from podhealth.checks.passive import xid

    gpus = {s.label("pci_bus_id"): (int(s.label("gpu")), s.label("uuid")) for s in ctx.samples("gpu_up")}
    return xid.evaluate_xids(ctx.events, xid.load_catalog(), ctx.now, ctx.window, gpus, policy=ctx.policy)


# name -> definition; the order is the order of the report.
CHECKS: dict[str, CheckDef] = {
    "gpu_count": CheckDef(gpu.gpu_count, ("nvml",)),
    "gpu_lost": CheckDef(gpu.gpu_lost, ("nvml",)),
    "xid": CheckDef(_xid, ("kmsg",)),
    "ecc": CheckDef(gpu.ecc, ("nvml",)),
    "row_remap": CheckDef(gpu.row_remap, ("nvml",)),
    "retired_pages": CheckDef(gpu.retired_pages, ("nvml",)),
    "pcie": CheckDef(gpu.pcie, ("nvml",)),
    "clocks": CheckDef(gpu.clocks, ("nvml",)),
    "temperature": CheckDef(gpu.temperature, ("nvml",)),
    "fabric": CheckDef(gpu.fabric, ("nvml",)),
    "persistence": CheckDef(gpu.persistence, ("nvml",)),
    "driver": CheckDef(gpu.driver, ("nvml",)),
    # nvml: every GPU node has it; the HCA and host fields are UNKNOWN inside when their source is stale
    "drift": CheckDef(drift.drift, ("nvml",)),
    "nvlink": CheckDef(nvlink.nvlink, ("nvlink",)),
    "ib_port": CheckDef(ib.ib_port, ("infiniband",)),
    "ib_errors": CheckDef(ib.ib_errors, ("infiniband",)),
    "ib_flap": CheckDef(ib.ib_flap, ("infiniband",)),
    "nfs_mount": CheckDef(nfs.nfs_mount, ("nfs",)),
    "nfs_latency": CheckDef(nfs.nfs_latency, ("nfs",)),
    "systemd_unit": CheckDef(host.systemd_units, ("host",)),
    "pcie_aer_fatal": CheckDef(aer.pcie_aer_fatal, ("pcie_aer",)),
    "pcie_aer": CheckDef(aer.pcie_aer, ("pcie_aer",)),
    "kernel_aer": CheckDef(aer.kernel_aer, ("kmsg",)),
    "edac_ue": CheckDef(memory_ecc.edac_ue, ("edac",)),
    "edac_ce": CheckDef(memory_ecc.edac_ce, ("edac",)),
    "kernel_ras": CheckDef(memory_ecc.kernel_ras, ("kmsg",)),
    "nvme": CheckDef(nvme.nvme, ("nvme",)),
    "imex": CheckDef(imex.imex, ("imex",), applies=lambda p: p.nvlink_domain.imex),
}

_COUNTERS = frozenset({
    "gpu_ecc_errors", "gpu_pcie_replay", "nvlink_errors", "infiniband_port_stat", "infiniband_port_hw_stat",
    "nfs_operation_rtt_seconds", "nfs_operation_requests", "nfs_operation_transmissions",
    "pcie_aer_errors", "edac_mc_errors", "edac_dimm_errors", "nvme_media_errors",
})


def check_rules(rules: Rules) -> None:
    """Rules must name checks that exist: a typo would silently leave a fatal fact damped."""
    unknown_checks = sorted(set(rules.damping) - set(CHECKS))
    if unknown_checks:
        raise RulesError(f"checks/data/rules.yaml: damping names unknown checks {', '.join(unknown_checks)} "
                         f"(known: {', '.join(CHECKS)})")


def site_checks(cfg: ChecksConfig) -> dict[str, CheckDef]:
    """One check per enabled site check (`checks.site`), named and fed by `site_<name>`."""
    return {SITE_PREFIX + name: CheckDef(functools.partial(site.judge, name, sc), (SITE_PREFIX + name,))
            for name, sc in cfg.site.items() if sc.enabled}


def with_site_rules(rules: Rules, cfg: ChecksConfig) -> Rules:
    """rules.yaml's damping plus each site check's own (`consecutive`, `immediate`)."""
    extra = {SITE_PREFIX + n: DampRule(sc.immediate, sc.consecutive) for n, sc in cfg.site.items()}
    return dataclasses.replace(rules, damping={**rules.damping, **extra})


class _Reads(Mapping[str, float]):
    """A profile's thresholds that note which keys a rule read (which site thresholds it used)."""

    def __init__(self, values: Mapping[str, float]) -> None:
        self._of = values
        self.read: set[str] = set()

    def __getitem__(self, key: str) -> float:
        self.read.add(key)
        return self._of[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._of)

    def __len__(self) -> int:
        return len(self._of)


class Evaluator:
    """Stateful wrapper: keeps counter history, recent events and damping between evaluations."""

    def __init__(self, profile: Profile, cfg: ChecksConfig, mounts: Sequence[str] = (),
                 enabled: Sequence[str] | None = None, keep_events: int = 1024) -> None:
        # The site's thresholds (checks.policy.thresholds) over the profile's; the profile without
        # them is kept to tell which verdicts they changed (_judge says so in the evidence).
        self.profile = site_policy.apply(profile, cfg.policy)  # as profiles.of_config gives it (idempotent)
        self.base_profile = site_policy.base(self.profile)
        self.site_thresholds = dict(site_policy.site_values(self.profile))
        self.cfg = cfg
        self.checks: dict[str, CheckDef] = {**CHECKS, **site_checks(cfg)}
        self.rates = RateTracker(cfg.rate_window, max_series=cfg.max_series)
        # IB port downs and recoveries across evaluations (ib_flap)
        self.links = LinkTracker(max_ports=cfg.max_series)
        rules = load_rules()
        check_rules(rules)
        rules = with_site_rules(rules, cfg)
        self.rules = rules
        self.damper = Damper(cfg.damping.fail_after, cfg.damping.recover_after, rules.damping)
        self.grace = GraceClock(cfg.grace)
        self.required_mounts = tuple(dict.fromkeys([*profile.nfs_mounts, *mounts]))
        self.enabled = tuple(enabled) if enabled is not None else None
        self._events: OrderedDict[str, Event] = OrderedDict()
        self._added = 0  # events remembered so far (an evaluation sees those judge_immediate adds meanwhile)
        self._keep = keep_events
        self._versions: dict[str, tuple[object, ...]] = {}
        self._index = SampleIndex()  # the snapshot by metric name, re-indexed only where it changed
        self._last: dict[str, tuple[CheckResult, ...]] = {}

    @staticmethod
    def _source_version(snap: Snapshot, source: str) -> tuple[object, ...]:
        st = snap.collectors.get(source)
        return (None,) if st is None else (st.last_success, st.stale, st.enabled)

    def _remember(self, snap: Snapshot) -> None:
        for e in snap.events:
            if e.id not in self._events:
                self._events[e.id] = e
                self._added += 1
        while len(self._events) > self._keep:
            self._events.popitem(last=False)
        # A kernel record from before the node's current boot is about state that boot reset: a
        # fresh /dev/kmsg never shows it again. An agent that outlives the boot (the simulator's
        # fault=reboot; a followed log file) must forget it too, or an XID 79 the reboot cured
        # keeps the node failing its verification until checks.rate_window runs out.
        boot = self.grace.boot_time(snap)
        if boot is not None:
            for key in [k for k, e in self._events.items() if e.time < boot]:
                del self._events[key]

    def evaluate(self, snap: Snapshot, now: float, damped: bool = True, only: Sequence[str] | None = None,
                 between: Callable[[], None] | None = None) -> tuple[CheckResult, ...]:
        """Every check over `snap`. `between`, called before each check, may run judge_immediate
        (on this thread: agent/health.py's fast path, core/worker.py's submit_first); the immediate
        checks still to come then judge the events it remembered, so they agree with it."""
        observe_counters(self.rates, snap.samples(), now, _COUNTERS)
        self._remember(snap)
        ctx = Context(snapshot=snap, profile=self.profile, now=now, rates=self.rates,
                      events=tuple(self._events.values()), required_units=self.cfg.required_units,
                      required_mounts=self.required_mounts, window=self.cfg.rate_window,
                      ib_links=self.links if damped else None, policy=self.cfg.policy,
                      index=self._index.of(snap))
        if not ctx.stale("infiniband"):
            ib.observe_links(self.links, ctx)
        grace = self.grace.observe(snap, now) if damped and only is None else None
        results: list[CheckResult] = []
        added, ictx = self._added, ctx  # ictx: the immediate checks' context
        for name, d in self.checks.items():
            if between is not None:
                between()
                if self._added != added:
                    added, ictx = self._added, dataclasses.replace(ctx, events=tuple(self._events.values()))
            if only is not None and name not in only:
                continue
            if self.enabled is not None and not set(d.sources) <= set(self.enabled):
                continue  # the site turned the source off: no verdict rather than UNKNOWN forever
            if d.applies is not None and not d.applies(self.profile):
                continue
            # Damping counts observations, not wake-ups: a check whose sources brought nothing new
            # since its last judgement keeps that judgement (the kmsg collector ticking every
            # second must not make `fail_after: 2` mean "two seconds of GPU data").
            version = tuple((s, *self._source_version(snap, s)) for s in d.sources)
            if damped and only is None and not self.rules.damp(name).immediate and self._versions.get(name) == version:
                # ...but a held FAIL must show once the grace ends, without waiting for new data.
                if not any(dict(r.evidence).get("grace") for r in self._last.get(name, ())) or grace is not None:
                    results.extend(self._last.get(name, ()))
                    continue
            stale = ctx.stale(*d.sources)
            if stale:
                raw = [unknown(name, "node", _why_stale(snap, stale), stale=",".join(stale))]
            else:
                try:
                    raw = self._judge(d, ictx if self.rules.damp(name).immediate else ctx)
                except Exception as e:  # noqa: BLE001 - one broken rule must not hide the others
                    raw = [unknown(name, "node", f"check failed: {type(e).__name__}: {e}")]
            judged = [self.damper.apply(r, now, grace=grace) if damped else _stamp(r, now) for r in raw]
            if damped and only is None:
                self._versions[name] = version
                self._last[name] = tuple(judged)
            results.extend(judged)
        if damped and only is None:
            self.damper.prune({(r.check, r.entity) for r in results})
        return tuple(results)


    def judge_immediate(self, snap: Snapshot, now: float, sources: Sequence[str]) -> tuple[CheckResult, ...]:
        """The fast path for a one-off fatal record (an XID 79 line): only the `immediate` checks
        (rules.yaml) fed by `sources` (the collectors that just brought events), judged at once.

        It shares the damper with evaluate() (immediate checks pass straight through it, so the
        next full evaluation shows the same verdict with the same `since`), but leaves counter
        history, grace and pruning alone: those belong to the full evaluation of each snapshot.
        """
        self._remember(snap)
        ctx = Context(snapshot=snap, profile=self.profile, now=now, rates=self.rates,
                      events=tuple(self._events.values()), required_units=self.cfg.required_units,
                      required_mounts=self.required_mounts, window=self.cfg.rate_window, ib_links=None,
                      policy=self.cfg.policy)
        results: list[CheckResult] = []
        for name, d in self.checks.items():
            if not self.rules.damp(name).immediate or not set(d.sources) <= set(sources):
                continue
            if self.enabled is not None and not set(d.sources) <= set(self.enabled):
                continue
            if ctx.stale(*d.sources):
                continue  # the full evaluation says UNKNOWN, with the reason
            try:
                raw = self._judge(d, ctx)
            except Exception:  # noqa: BLE001 - the full evaluation reports it as UNKNOWN
                continue
            results.extend(self.damper.apply(r, now) for r in raw)
        return tuple(results)


    def _judge(self, d: CheckDef, ctx: Context) -> list[CheckResult]:
        """The rule's results; where a site threshold it read changed a verdict (status or action)
        from what the profile alone gives, the evidence says which threshold and what it would be."""
        if not self.site_thresholds:
            return d.fn(ctx)
        reads = _Reads(self.profile.thresholds)
        ctx.profile = dataclasses.replace(self.profile, thresholds=reads)
        try:
            raw = d.fn(ctx)
        finally:
            ctx.profile = self.profile
        used = sorted(k for k in reads.read if k in self.site_thresholds)
        if not used:
            return raw
        base = copy.copy(ctx)
        base.profile = self.base_profile
        before = {(r.check, r.entity): r for r in d.fn(base)}
        out = []
        for r in raw:
            b = before.get((r.check, r.entity))
            b_status, b_action = (b.status, b.action) if b is not None else (Status.OK, r.action.NONE)
            if (b_status, b_action) != (r.status, r.action):
                why = ", ".join(f"{k}={self.site_thresholds[k]:g} (profile {_shipped(self.base_profile, k)})"
                                for k in used)
                extra = (("policy", f"checks.policy.thresholds: {why}"[:256]),
                         ("without_policy", f"{b_status.value} {b_action.value}"))
                r = dataclasses.replace(r, evidence=r.evidence[:MAX_EVIDENCE_ITEMS - len(extra)] + extra)
            out.append(r)
        return out


def _shipped(profile: Profile, key: str) -> str:
    v = profile.thresholds.get(key)
    return "unset" if v is None else f"{float(v):g}"


def _why_stale(snap: Snapshot, stale: list[str]) -> str:
    """The UNKNOWN's summary: which source has no fresh data, and the error of one that failed."""
    why = f"collector {', '.join(stale)} has no fresh data"
    for name in stale:
        st = snap.collectors.get(name)
        if st is not None and st.errors and st.last_attempt is not None and st.last_success != st.last_attempt:
            return f"{why}: {st.errors[0]}"[:512]
    return why


def _stamp(r: CheckResult, now: float) -> CheckResult:
    import dataclasses

    return r if r.since else dataclasses.replace(r, since=now)
