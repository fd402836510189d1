"""The action wing's rooms (aggregator/actions/): an executor talks to fencers and agents through
its Ctx and returns what happened (outcome.py); it imports no other executor, nor the runner, nor
service.py, nor apply.py (the journal's end, which writes), and writes neither node state nor the
store. The shared rooms import no executor either. An import or a write that breaks this fails here."""

from __future__ import annotations

import ast

import pytest

from tests.conftest import REPO

PKG = "podhealth.aggregator.actions"
ROOM = REPO / "aggregator" / "actions"
EXECUTORS = ("fence", "release", "handover", "ladder", "evacuate", "jobs")
SHARED = ("apply", "ctx", "journal", "outcome", "tasks")  # the runner's and the journal's rooms
MAY = {f"{PKG}.{m}" for m in ("ctx", "journal", "outcome")}  # what an executor may import of its package
FORBIDDEN = {f"{PKG}.{m}" for m in (*EXECUTORS, "runner")} | {"podhealth.aggregator.service"}
# Memory's writers and the store's: the journal's end (apply.py, through lifecycle.settle) calls them
WRITES = {"set_node", "set_evacuated", "ladder_failed", "commit", "commit_journal", "finish", "postpone", "end",
          "write", "write_nowait", "settle"}


def _imports(src: str) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):  # `from pkg import fence`; relative: `from . import fence`
            base = node.module if node.level == 0 else PKG + (f".{node.module}" if node.module else "")
            if base:
                out |= {base} | {f"{base}.{a.name}" for a in node.names}
    return out


def _source(name: str) -> str:
    return (ROOM / f"{name}.py").read_text(encoding="utf-8")


def test_every_file_is_an_executor_or_shared() -> None:
    files = {p.stem for p in ROOM.glob("*.py")} - {"__init__", "runner"}
    assert files == {*EXECUTORS, *SHARED}, "a new file in aggregator/actions/: an executor or shared?"


@pytest.mark.parametrize("name", [*EXECUTORS, *SHARED])
def test_no_room_imports_an_executor_the_runner_or_the_service(name: str) -> None:
    bad = sorted(m for m in _imports(_source(name)) if m in FORBIDDEN and m != f"{PKG}.{name}")
    assert not bad, f"aggregator/actions/{name}.py imports {', '.join(bad)}"


@pytest.mark.parametrize("name", EXECUTORS)
def test_an_executor_imports_of_its_package_only_its_context_the_journal_and_outcomes(name: str) -> None:
    mine = {m for m in _imports(_source(name)) if m.startswith(PKG + ".")}
    bad = sorted(m for m in mine if not any(m == ok or m.startswith(ok + ".") for ok in MAY))
    assert not bad, f"aggregator/actions/{name}.py imports {', '.join(bad)}"


def _writes(src: str) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in WRITES:
            found.append(f"{node.func.attr}() line {node.lineno}")
        elif isinstance(node, (ast.Assign, ast.AugAssign)):  # rec.jobs = ...: a field of a node
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            found += [f"{t.attr} = line {node.lineno}" for t in targets if isinstance(t, ast.Attribute)]
    return found


@pytest.mark.parametrize("name", EXECUTORS)
def test_an_executor_writes_neither_node_state_nor_the_store(name: str) -> None:
    assert _writes(_source(name)) == [], f"aggregator/actions/{name}.py writes; return it in the Outcome"


@pytest.mark.parametrize("src", ["from podhealth.aggregator.actions import fence\n",
                                 "from . import ladder\n", "from .runner import ActionRunner\n",
                                 "import podhealth.aggregator.service\n"])
def test_the_check_sees_such_an_import(src: str) -> None:
    assert _imports(src) & FORBIDDEN, src  # the import tests above can fail: each spelling is caught


@pytest.mark.parametrize("src", ["ctx.mem.set_node(p.node, fence=FenceMode.NONE)\n", "rec.jobs = ()\n",
                                 "await ctx.journal.commit(ops)\n", "ctx.mem.set_evacuated(n, '')\n"])
def test_the_check_sees_such_a_write(src: str) -> None:
    assert _writes(src), src


def test_no_file_in_the_action_wing_is_over_300_lines() -> None:
    long = {p.name: n for p in ROOM.glob("*.py") if (n := len(p.read_text(encoding="utf-8").splitlines())) > 300}
    assert not long, long
