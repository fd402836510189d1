"""The layers point one way (docs/architecture.md): core <- collectors <- checks <- agent, and the
aggregator on top; the simulator is a top layer too (it builds whole nodes and pods). An import
that points up fails here. KNOWN_BACK_EDGES (debts with a plan) is empty since issue 15 and may
only shrink. tests/unit/test_import_contracts.py checks the same layers with import-linter."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

from tests.conftest import REPO

# folder -> layer name; order of LAYERS = who may import whom (a layer imports only earlier ones)
FOLDERS = {"core": "core", "collectors": "collectors", "checks": "checks", "agent": "agent",
           "fencing": "fencing", "aggregator": "aggregator", "sim": "sim"}
LAYERS = ("core", "collectors", "checks", "agent", "fencing", "aggregator", "sim")
MAY_IMPORT = {
    "core": set(),
    "collectors": {"core"},
    "checks": {"core", "collectors", "fencing"},  # `--drain-self` drains through the Slurm fencer
    "agent": {"core", "collectors", "checks"},  # `--simulate` reaches the agent through agent/simmode.py
    "fencing": {"core"},
    "aggregator": {"core", "fencing"},
    "sim": {"core", "collectors", "checks", "agent", "fencing", "aggregator"},
}
# (importing module, imported layer): why it is still there. Issue 15 cut the last ones; never add one.
KNOWN_BACK_EDGES: dict[tuple[str, str], str] = {}


def _layer_of_module(mod: str) -> str | None:
    if not mod.startswith("podhealth"):
        return None
    parts = mod.split(".")
    if len(parts) > 1 and parts[1] in ("sim", "agent", "collectors", "checks", "fencing", "aggregator"):
        return parts[1]
    return "core"


def _edges() -> dict[tuple[str, str], set[str]]:
    out: dict[tuple[str, str], set[str]] = defaultdict(set)
    for folder, layer in FOLDERS.items():
        for path in sorted((REPO / folder).rglob("*.py")):
            rel = str(path.relative_to(REPO))
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                mods = [node.module] if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 \
                    else [a.name for a in node.names] if isinstance(node, ast.Import) else []
                for m in mods:
                    to = _layer_of_module(m)
                    if to and to != layer and to not in MAY_IMPORT[layer]:
                        out[(rel, to)].add(m)
    return out


def test_no_import_points_up() -> None:
    new = {k: sorted(v) for k, v in _edges().items() if k not in KNOWN_BACK_EDGES}
    assert not new, "imports that point up a layer (see docs/architecture.md):\n" + "\n".join(
        f"  {mod} imports {', '.join(v)}" for (mod, _), v in sorted(new.items()))


def test_known_back_edges_only_shrink() -> None:
    gone = sorted(k for k in KNOWN_BACK_EDGES if k not in _edges())
    assert not gone, f"these back-edges are cut: remove them from KNOWN_BACK_EDGES: {gone}"


def test_the_architecture_document_names_every_layer() -> None:
    text = (REPO / "docs" / "architecture.md").read_text()
    for layer in LAYERS:
        assert f"`{layer}`" in text, layer
