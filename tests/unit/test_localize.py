"""The bad-node localiser on simulated pair outcomes: it must name the bad nodes and nothing else."""

from __future__ import annotations

from typing import Callable

import pytest

from podhealth.checks.active.localize import NodeState, PairResult, plan


def simulate(nodes: list[str], bad: set[str], bad_links: set[frozenset[str]] = frozenset(),  # type: ignore[assignment]
             known_good: tuple[str, ...] = (), max_rounds: int = 20,
             outcome: Callable[[str, str], str] | None = None) -> tuple[object, list[PairResult], int]:
    """Drive plan() the way nccl_slurm does, with a fabric where `bad` nodes fail every pair."""
    def judge(a: str, b: str) -> str:
        if outcome:
            return outcome(a, b)
        return "fail" if a in bad or b in bad or frozenset((a, b)) in bad_links else "pass"
    results: list[PairResult] = []
    rounds = 0
    p = plan(nodes, results, known_good)
    while p.next_pairs:
        rounds += 1
        assert rounds <= max_rounds, "localiser did not terminate"
        busy = [n for pair in p.next_pairs for n in pair]
        assert len(busy) == len(set(busy)), f"pairs in one round overlap: {p.next_pairs}"
        tried = {r.key for r in results}
        assert all(frozenset(pair) not in tried for pair in p.next_pairs), "a pair was proposed twice"
        results += [PairResult(a, b, judge(a, b)) for a, b in p.next_pairs]  # type: ignore[arg-type]
        p = plan(nodes, results, known_good)
    return p, results, rounds


def states(p: object) -> dict[str, NodeState]:
    return {v.node: v.state for v in p.verdicts}  # type: ignore[attr-defined]


NODES16 = [f"dgx{i:02d}" for i in range(1, 17)]


def test_one_bad_node_in_16() -> None:
    p, results, rounds = simulate(NODES16, {"dgx07"})
    st = states(p)
    assert st["dgx07"] is NodeState.BAD
    assert all(s is NodeState.GOOD for n, s in st.items() if n != "dgx07")
    assert rounds == 2 and len(results) == 8 + 2     # one round of 8 pairs, then 2 re-tests
    assert p.bad_links == ()  # type: ignore[attr-defined]
    assert "known-good" in p.verdict("dgx07").reason  # type: ignore[attr-defined]


@pytest.mark.parametrize("bad", [{"dgx03", "dgx11"}, {"dgx03", "dgx04"}])   # different pairs / same pair
def test_two_bad_nodes(bad: set[str]) -> None:
    p, _, _ = simulate(NODES16, bad)
    st = states(p)
    assert {n for n, s in st.items() if s is NodeState.BAD} == bad
    assert all(s is NodeState.GOOD for n, s in st.items() if n not in bad)


def test_bad_link_between_two_good_nodes() -> None:
    p, _, _ = simulate(NODES16, set(), {frozenset(("dgx05", "dgx06"))})
    st = states(p)
    assert all(s is NodeState.GOOD for s in st.values())
    assert p.bad_links == (("dgx05", "dgx06"),)  # type: ignore[attr-defined]


@pytest.mark.parametrize("n", [3, 5, 7, 15])
def test_odd_node_counts(n: int) -> None:
    nodes = NODES16[:n]
    last = nodes[-1]                       # the odd one out of round one
    p, _, _ = simulate(nodes, {last})
    st = states(p)
    assert st[last] is NodeState.BAD
    assert all(s is NodeState.GOOD for m, s in st.items() if m != last)
    p, _, _ = simulate(nodes, set())
    assert all(s is NodeState.GOOD for s in states(p).values())


def test_all_bad_is_unknown_not_bad() -> None:
    """Every pair failing is a fabric-wide problem: no node is blamed, every node is UNKNOWN."""
    p, results, rounds = simulate(NODES16, set(NODES16))
    st = states(p)
    assert all(s is NodeState.UNKNOWN for s in st.values())
    assert rounds == 2                      # first round, one re-pairing, then it stops
    assert "no pair passed" in p.verdict("dgx01").reason  # type: ignore[attr-defined]


def test_two_nodes_one_bad_needs_a_reference() -> None:
    p, _, _ = simulate(["a1", "a2"], {"a2"})
    assert set(states(p).values()) == {NodeState.UNKNOWN}
    p, _, _ = simulate(["a1", "a2"], {"a2"}, known_good=("ref1",))
    st = states(p)
    assert st == {"a1": NodeState.GOOD, "a2": NodeState.BAD}


def test_unknown_outcome_is_not_blamed() -> None:
    """A pair whose job never ran (srun refused) says nothing about the nodes."""
    def outcome(a: str, b: str) -> str:
        return "unknown" if "dgx02" in (a, b) else "pass"
    p, _, _ = simulate(NODES16[:4], set(), outcome=outcome)
    st = states(p)
    assert st["dgx02"] is NodeState.UNKNOWN
    assert st["dgx01"] is NodeState.GOOD    # re-tested against a good node and passed
    assert NodeState.BAD not in st.values()


def test_first_round_is_disjoint_pairs_in_order() -> None:
    p = plan(NODES16[:5], [])
    assert p.next_pairs == (("dgx01", "dgx02"), ("dgx03", "dgx04"))
    assert states(p)["dgx05"] is NodeState.UNTESTED


def test_hcas_and_slowness_are_carried_to_the_verdict() -> None:
    res = [PairResult("n1", "n2", "pass"), PairResult("n3", "n4", "fail", 10.0, "slow", ("mlx5_3",), slow_only=True),
           PairResult("n3", "n1", "fail", 9.0, "slow", ("mlx5_3",), slow_only=True), PairResult("n4", "n2", "pass")]
    p = plan(["n1", "n2", "n3", "n4"], res)
    v = p.verdict("n3")
    assert v.state is NodeState.BAD and v.hcas == ("mlx5_3",) and v.slow_only and p.done


def test_duplicate_nodes_rejected() -> None:
    with pytest.raises(ValueError, match="duplicate"):
        plan(["a", "a"], [])
