"""Bad-node localisation from pairwise NCCL tests: a pure function from pair results to verdicts.

A two-node all-reduce that fails or runs slow says "one of these two, or the link between them".
The strategy: a first round of disjoint pairs; every node of a failing pair is then re-tested
against a node already known to be good. A node that fails against a good partner and never
passes is bad; two good nodes that fail together share a bad link (a rail, a cable, a switch port).
When no pair passes at all there is no reference: one more round re-pairs the suspects among
themselves, and if still nothing passes the answer is "cannot tell" — a fabric-wide failure is an
outage to page about, not a reason to blame every node (DESIGN principle 6).

`plan()` is stateless: it recomputes everything from the full list of results, so the caller's
loop is `while (p := plan(nodes, results)).next_pairs: results += run(p.next_pairs)`. It always
terminates: every pair it proposes is one that has not been tried, and it proposes a pair only
for a node that is still undecided.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Iterable, Literal, Sequence

Outcome = Literal["pass", "fail", "unknown"]


class NodeState(enum.Enum):
    GOOD = "good"            # passed at least one pair test
    BAD = "bad"              # failed against a known-good partner and never passed
    SUSPECT = "suspect"      # failed, not yet re-tested against a good node
    UNTESTED = "untested"    # in no pair yet (odd node out, or waiting for a reference)
    UNKNOWN = "unknown"      # could not be decided (no reference, or its tests did not run)


@dataclass(frozen=True)
class PairResult:
    a: str
    b: str
    outcome: Outcome
    busbw_gbps: float | None = None
    reason: str = ""                 # why it failed: "below gate", "slow vs median", an error line
    hcas: tuple[str, ...] = ()       # HCAs/rails named in the output (mlx5_3, ...)
    slow_only: bool = False          # failed only by being slow (no error, no wrong results)

    @property
    def key(self) -> frozenset[str]:
        return frozenset((self.a, self.b))


@dataclass(frozen=True)
class NodeVerdict:
    node: str
    state: NodeState
    reason: str = ""
    failed_with: tuple[str, ...] = ()    # partners of its failing pairs
    hcas: tuple[str, ...] = ()           # HCAs named in its failing pairs' output
    slow_only: bool = False              # all its failures were slowness, not errors


@dataclass(frozen=True)
class Plan:
    verdicts: tuple[NodeVerdict, ...]
    next_pairs: tuple[tuple[str, str], ...]
    bad_links: tuple[tuple[str, str], ...]   # pairs of good nodes that fail together

    @property
    def done(self) -> bool:
        return not self.next_pairs

    def verdict(self, node: str) -> NodeVerdict:
        for v in self.verdicts:
            if v.node == node:
                return v
        raise KeyError(node)


def plan(nodes: Sequence[str], results: Iterable[PairResult], known_good: Iterable[str] = ()) -> Plan:
    """Verdict per node and the next disjoint pairs to test, from every pair result so far.

    `known_good` are reference nodes outside the test set (or vouched for) that may be paired with
    suspects; they get no verdict of their own.
    """
    order = list(dict.fromkeys(nodes))
    if len(order) != len(list(nodes)):
        raise ValueError("duplicate node names")
    refs = [n for n in dict.fromkeys(known_good) if n not in order]
    res = list(results)
    tried = {r.key for r in res}
    passed = {n for r in res if r.outcome == "pass" for n in (r.a, r.b)}
    good = [n for n in order if n in passed] + refs
    good_set = set(good)

    verdicts: list[NodeVerdict] = []
    undecided: list[str] = []          # may still be paired
    for n in order:
        mine = [r for r in res if n in (r.a, r.b)]
        fails = [r for r in mine if r.outcome == "fail"]
        partners = tuple(_other(r, n) for r in fails)
        hcas = tuple(dict.fromkeys(h for r in fails for h in r.hcas))
        slow_only = bool(fails) and all(r.slow_only for r in fails)
        if n in good_set:
            verdicts.append(NodeVerdict(n, NodeState.GOOD, "passed a pair test", partners, hcas))
            continue
        vs_good = [r for r in mine if _other(r, n) in good_set]
        if any(r.outcome == "fail" for r in vs_good):
            ref = next(_other(r, n) for r in vs_good if r.outcome == "fail")
            verdicts.append(NodeVerdict(n, NodeState.BAD, f"failed against known-good {ref}",
                                        partners, hcas, slow_only))
        elif vs_good:   # only "unknown" outcomes against a good node: the test itself did not run
            verdicts.append(NodeVerdict(n, NodeState.UNKNOWN, "its test against a known-good node did not run",
                                        partners, hcas, slow_only))
        elif fails:
            verdicts.append(NodeVerdict(n, NodeState.SUSPECT, "failed; not yet tested against a good node",
                                        partners, hcas, slow_only))
            undecided.append(n)
        elif mine:      # only unknown outcomes with other undecided nodes
            verdicts.append(NodeVerdict(n, NodeState.UNTESTED, "its pair test did not run", (), ()))
            undecided.append(n)
        else:
            verdicts.append(NodeVerdict(n, NodeState.UNTESTED, "not tested yet", (), ()))
            undecided.append(n)

    next_pairs = _next_pairs(undecided, good, tried, res)
    if not next_pairs:
        verdicts = [_finalise(v) for v in verdicts]
    bad_links = tuple(sorted({tuple(sorted((r.a, r.b))) for r in res  # type: ignore[misc]
                              if r.outcome == "fail" and r.a in good_set and r.b in good_set}))
    return Plan(tuple(verdicts), next_pairs, bad_links)  # type: ignore[arg-type]


def _other(r: PairResult, n: str) -> str:
    return r.b if r.a == n else r.a


def _next_pairs(undecided: list[str], good: list[str], tried: set[frozenset[str]],
                res: list[PairResult]) -> tuple[tuple[str, str], ...]:
    busy: set[str] = set()
    out: list[tuple[str, str]] = []
    if good:
        # Each undecided node against a distinct good node this round; extra suspects wait a round.
        for n in undecided:
            partner = next((g for g in good if g not in busy and frozenset((n, g)) not in tried), None)
            if partner is None:
                continue
            out.append((n, partner))
            busy.update((n, partner))
        return tuple(out)
    # No reference yet. First round: disjoint pairs of never-tested nodes; afterwards one re-pairing
    # of suspects among themselves, each node taking part in at most two pair tests, so a
    # fabric-wide failure ends in UNKNOWN instead of an endless search.
    tests = {n: sum(1 for r in res if n in (r.a, r.b)) for n in undecided}
    pool = [n for n in undecided if tests[n] < 2]
    for i, n in enumerate(pool):
        if n in busy:
            continue
        partner = next((m for m in pool[i + 1:] if m not in busy and frozenset((n, m)) not in tried), None)
        if partner is None:
            continue
        out.append((n, partner))
        busy.update((n, partner))
    return tuple(out)


def _finalise(v: NodeVerdict) -> NodeVerdict:
    """Nothing more can be tried: whatever is still undecided is UNKNOWN, with the reason."""
    if v.state is NodeState.SUSPECT:
        return NodeVerdict(v.node, NodeState.UNKNOWN,
                           "failed, but no pair passed to give a known-good reference "
                           "(fabric-wide problem, or every node bad)", v.failed_with, v.hcas, v.slow_only)
    if v.state is NodeState.UNTESTED:
        return NodeVerdict(v.node, NodeState.UNKNOWN, v.reason if v.reason != "not tested yet"
                           else "no partner to test against", v.failed_with, v.hcas, v.slow_only)
    return v
