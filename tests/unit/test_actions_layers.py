"""The action wing's rooms (aggregator/actions/): an executor talks to fencers and agents through
its Ctx and the journal, and imports no other executor, nor the runner, nor service.py; the
journal and the context import no executor either. An import that breaks this fails here."""

from __future__ import annotations

import ast

import pytest

from tests.conftest import REPO

PKG = "podhealth.aggregator.actions"
ROOM = REPO / "aggregator" / "actions"
EXECUTORS = ("fence", "release", "handover", "ladder", "evacuate", "jobs")
SHARED = ("ctx", "journal")  # what every executor may import from its own package
FORBIDDEN = {f"{PKG}.{m}" for m in (*EXECUTORS, "runner")} | {"podhealth.aggregator.service"}


def _imports(src: str) -> set[str]:
    tree = ast.parse(src)
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.add(node.module)
            out |= {f"{node.module}.{a.name}" for a in node.names}  # `from pkg import fence`
        elif isinstance(node, ast.ImportFrom):  # relative: `from . import fence`, `from .runner import x`
            base = PKG + (f".{node.module}" if node.module else "")
            out.add(base)
            out |= {f"{base}.{a.name}" for a in node.names}
    return out


def test_every_executor_file_is_listed() -> None:
    files = {p.stem for p in ROOM.glob("*.py")} - {"__init__", "runner", *SHARED}
    assert files == set(EXECUTORS), "a new file in aggregator/actions/: an executor (EXECUTORS) or shared (SHARED)?"


@pytest.mark.parametrize("name", [*EXECUTORS, *SHARED])
def test_no_executor_imports_another_executor_the_runner_or_the_service(name: str) -> None:
    bad = sorted(m for m in _imports((ROOM / f"{name}.py").read_text(encoding="utf-8")) if m in FORBIDDEN and m != f"{PKG}.{name}")
    assert not bad, f"aggregator/actions/{name}.py imports {', '.join(bad)}"


@pytest.mark.parametrize("src", ["from podhealth.aggregator.actions import fence\n",
                                 "from . import ladder\n", "from .runner import ActionRunner\n",
                                 "import podhealth.aggregator.service\n"])
def test_the_check_sees_such_an_import(src: str) -> None:
    assert _imports(src) & FORBIDDEN, src  # the test above can fail: each spelling is caught


def test_no_file_in_the_action_wing_is_over_300_lines() -> None:
    long = {p.name: n for p in ROOM.glob("*.py") if (n := len(p.read_text(encoding="utf-8").splitlines())) > 300}
    assert not long, long
