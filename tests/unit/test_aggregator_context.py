"""The leader's side work takes a Context (aggregator/context.py), not the Aggregator: operator
overrides and evidence bundles never reach into the host, and a takeover builds a new Context
instead of writing its mirror into the parts (issue 30)."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any, Mapping, Sequence

import pytest

from podhealth.aggregator import overrides
from podhealth.aggregator.actions import OperatorError
from podhealth.aggregator.context import Context
from podhealth.aggregator.state import Memory
from podhealth.aggregator.store import Op
from tests.harness.agg import MemFencer, config, running

pytestmark = pytest.mark.timeout(60)
ROOT = Path(__file__).resolve().parents[2] / "aggregator"


@pytest.mark.parametrize("name", ["overrides.py", "bundles.py", "context.py"])
def test_overrides_and_bundles_never_reach_into_the_aggregator(name: str) -> None:
    text = (ROOT / name).read_text()
    tree = ast.parse(text, name)
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert "podhealth.aggregator.service" not in imported, name
    assert "_require_leader" not in text and "Aggregator\"" not in text, name


def _ctx(mem: Memory, *, leading: bool, commits: list[Sequence[Op]], released: list[str]) -> Context:
    def require_leader() -> None:
        if not leading:
            raise OperatorError(503, "this aggregator is a follower")

    async def commit(ops: Sequence[Op]) -> None:
        commits.append(ops)

    async def release(node: str, reason: str, who: str) -> Mapping[str, Any]:
        released.append(node)
        return {"state": "done"}

    return Context(mem=mem, commit=commit, require_leader=require_leader, clock=lambda: 1000.0,
                   poke=lambda: None, silences={}, release=release)


async def test_a_follower_context_changes_nothing() -> None:
    mem, commits, released = Memory(), [], []  # type: ignore[var-annotated]
    mem.ensure_node("dgx01", 1.0)
    ctx = _ctx(mem, leading=False, commits=commits, released=released)
    for call in (overrides.silence(ctx, "dgx01", "xid", "1h", "r", "ana"),
                 overrides.unsilence(ctx, "dgx01", "xid", "r", "ana"),
                 overrides.mark_healthy(ctx, "dgx01", "r", "ana")):
        with pytest.raises(OperatorError) as e:
            await call
        assert e.value.status == 503
    assert commits == [] and released == [] and ctx.silences == {}


async def test_a_leader_context_silences_by_its_clock_and_commits_first() -> None:
    mem, commits, released = Memory(), [], []  # type: ignore[var-annotated]
    mem.ensure_node("dgx01", 1.0)
    ctx = _ctx(mem, leading=True, commits=commits, released=released)
    body = await overrides.silence(ctx, "dgx01", "xid", "1h", "RMA open", "ana")
    assert body["until"] == 1000.0 + 3600 and len(commits) == 1 and ("dgx01", "xid") in ctx.silences
    assert overrides.expire_ops(ctx.silences, 1000.0 + 3600) and ctx.silences == {}


async def test_a_takeover_builds_a_new_context_the_parts_read(tmp_path: Path) -> None:
    async with running(config(tmp_path), [MemFencer()]) as (agg, _):
        before = agg.context()
        assert before.mem is agg.mem and agg.actions.mem is agg.mem and agg.liveness.mem is agg.mem
        fresh = Memory()
        agg.mem = fresh  # what a takeover does (service.py `_elected`)
        after = agg.context()
        assert after is not before and before.mem is not fresh  # the old one is left as it was
        assert after.mem is fresh and agg.actions.mem is fresh and agg.liveness.mem is fresh
        assert after.silences is agg.silences
