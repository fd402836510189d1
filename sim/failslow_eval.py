"""Fail-slow on a simulated fleet: does the judge find what was injected, and only that?

`evaluate(nodes, seed)` builds `nodes` simulated nodes (sim/state.py) with the natural spread of
sim/perfmodel.py, probes them every `interval` for `baseline_rounds` rounds, moves half the
fleet to a newer driver that is `upgrade_pct` slower at everything halfway through (a fleet-wide
shift: it must flag nobody), injects one slowdown of `min_pct`..`max_pct` percent into a share of
the nodes (slow-gpu, slow-hbm, slow-nvlink, slow-hca), and probes `after_rounds` more times, each
round judged by aggregator/failslow.py exactly as the aggregator does. bench/failslow.py prints
its figures across seeds; tests/unit/test_failslow_eval.py asserts them on a smaller fleet.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Mapping

from podhealth.aggregator import failslow
from podhealth.config_failslow import METRICS, FailslowJudgeConfig, MetricRule
from podhealth.sim import faults, perfmodel
from podhealth.sim.state import NodeState, default_state

STEADY_KINDS = ("slow-gpu", "slow-hbm", "slow-nvlink", "slow-hca")
HOUR = 3600.0


@dataclass
class EvalResult:
    nodes: int
    gpus: int
    injected: int = 0
    found: int = 0
    healthy_node_probes: int = 0
    false_warn: int = 0  # findings on a part no fault touched
    false_drain: int = 0
    missed: list[str] = field(default_factory=list)
    false: list[str] = field(default_factory=list)

    @property
    def recall(self) -> float:
        return self.found / self.injected if self.injected else 1.0

    def per_1000(self, n: int) -> float:
        return 1000.0 * n / self.healthy_node_probes if self.healthy_node_probes else 0.0


def drain_config(base: FailslowJudgeConfig | None = None) -> FailslowJudgeConfig:
    """The judge with `action: drain` on every metric (the defaults otherwise): what a site that
    lets fail-slow fence would run."""
    base = base or FailslowJudgeConfig()
    return replace(base, metrics=MappingProxyType({m: replace(base.rule(m), action="drain") for m in METRICS}))


def evaluate(nodes: int, seed: int, *, cfg: FailslowJudgeConfig | None = None, profile: str = "dgx-h100",
             baseline_rounds: int = 8, after_rounds: int = 2, fault_share: float = 0.25, min_pct: float = 5.0,
             max_pct: float = 15.0, upgrade_pct: float = 3.0, interval: float = 6 * HOUR) -> EvalResult:
    cfg = cfg or drain_config()
    rng = random.Random(seed)
    t0 = 1_700_000_000.0
    states = {f"n{seed}-{i:04d}": default_state(f"n{seed}-{i:04d}", profile, now=t0) for i in range(nodes)}
    upgraded = set(rng.sample(sorted(states), nodes // 2))
    old_driver = next(iter(states.values())).driver_version
    res = EvalResult(nodes=nodes, gpus=sum(len(s.gpus) for s in states.values()))
    faulty = set(rng.sample(sorted(states), max(1, round(nodes * fault_share))))
    inject_round = baseline_rounds
    touched: dict[str, set[tuple[str, str]]] = {}  # node -> (entity, metric) a fault slows
    found: dict[tuple[str, str, str], bool] = {}
    histories: dict[failslow.Key, tuple[failslow.Point, ...]] = {}
    for rnd in range(baseline_rounds + after_rounds):
        at = t0 + rnd * interval
        if rnd == inject_round:
            for name in sorted(faulty):
                states[name], hit = _inject(states[name], rng, at, min_pct, max_pct)
                touched[name] = set(hit)
                res.injected += 1
                found[(name, *hit[0])] = False
        samples = []
        for name, st in states.items():
            new = rnd >= baseline_rounds // 2 and name in upgraded
            driver = "570.124.06" if new else old_driver
            scale = 1.0 - upgrade_pct / 100.0 if new else 1.0
            for r in perfmodel.fingerprint(st, seed, at):
                samples.append(failslow.Sample(name, r.entity, r.metric, r.value * scale, at, profile, driver,
                                               r.firmware, st.gpus[0].name))
        scored = failslow.score(samples, histories, cfg, at)
        histories = dict(scored.histories)
        for f in scored.findings:
            which = _which(touched.get(f.node, set()), f.entity, f.metric)
            if which is not None:
                key = (f.node, *which)
                if key in found and not found[key]:
                    found[key] = True
                continue
            if f.node in touched and rnd >= inject_round:
                continue  # a part on a faulty node the fault did not name: not counted either way
            res.false_warn += 1
            res.false_drain += f.status.value == "FAIL"
            res.false.append(f"round {rnd}: {f.node} {f.text(at)} [{f.by}]")
        res.healthy_node_probes += sum(1 for n in states if n not in touched)
    res.found = sum(found.values())
    res.missed = [" ".join(k) for k, v in found.items() if not v]
    return res


def _inject(st: NodeState, rng: random.Random, at: float, lo: float, hi: float
            ) -> tuple[NodeState, list[tuple[str, str]]]:
    kind = rng.choice(STEADY_KINDS)
    pct = round(rng.uniform(lo, hi), 1)
    tokens = [f"fault={kind}", f"pct={pct}"]
    if kind == "slow-hca":
        devs = sorted({h.device for h in st.hcas if h.role == "compute"})
        tokens.append(f"device={rng.choice(devs)}")
    else:
        tokens.append(f"gpu={rng.randrange(len(st.gpus))}")
    fault = faults.parse(tokens, at)
    faults.validate(fault, st)
    st = st.with_fault(fault)
    return st, list(perfmodel.describe_fault(st.faults[-1]))


def _which(touched: set[tuple[str, str]], entity: str, metric: str) -> tuple[str, str] | None:
    """The (entity, metric) of a fault this finding is about: an NVLink pair counts for both its GPUs."""
    for ent, met in touched:
        if met != metric:
            continue
        if ent == entity or (metric == "nvlink_gbs" and ent in entity.split("-")):
            return (ent, met)
    return None


def summary(results: list[EvalResult]) -> Mapping[str, float]:
    inj = sum(r.injected for r in results)
    probes = sum(r.healthy_node_probes for r in results)
    return {"recall": sum(r.found for r in results) / inj if inj else 1.0,
            "false_warn_per_1000": 1000.0 * sum(r.false_warn for r in results) / probes if probes else 0.0,
            "false_drain_per_1000": 1000.0 * sum(r.false_drain for r in results) / probes if probes else 0.0}
