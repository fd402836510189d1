"""The layers, checked by import-linter as well as by the ast walk of test_layers.py: the contracts
in pyproject.toml ([tool.importlinter]) are kept, a back-edge breaks them, and the `core` contract
names every module of core/ (the root package cannot be named as one layer)."""

from __future__ import annotations

import importlib.util
import tomllib
from pathlib import Path
from types import ModuleType

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.timeout(600)


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("lint_imports", REPO / "scripts" / "lint_imports.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _lint_imports() -> str:
    venv = REPO / ".venv" / "bin" / "lint-imports"
    prog = str(venv) if venv.exists() else _script().find_lint_imports()
    if not prog:
        pytest.skip("lint-imports is not installed (import-linter; scripts/setup.sh --test installs it); "
                    "tests/unit/test_layers.py still checks the layers")
    return str(prog)


def _contracts() -> dict[str, dict[str, object]]:
    doc = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    return {c["id"]: c for c in doc["tool"]["importlinter"]["contracts"]}


def test_the_contracts_are_kept(tmp_path: Path) -> None:
    lint = _script()
    lint.lay_out(tmp_path)
    r = lint.run(tmp_path, _lint_imports())
    assert r.returncode == 0 and "0 broken" in r.stdout, r.stdout
    assert f"{len(_contracts())} kept" in r.stdout, r.stdout


@pytest.mark.parametrize(("module", "line", "contract"), [
    ("collectors/backedge.py", "from podhealth.checks import profiles\n", "layers"),
    ("fencing/backedge.py", "import podhealth.aggregator.policy\n", "layers"),
    ("agent/backedge.py", "from podhealth.fencing import slurm\n", "the agent fences nothing"),
    ("aggregator/backedge.py", "from podhealth.checks import profiles\n", "the aggregator reads no collector"),
    ("hostnames.py", "from podhealth.aggregator import policy\n", "core imports no other layer"),
])
def test_a_back_edge_breaks_a_contract(tmp_path: Path, module: str, line: str, contract: str) -> None:
    lint = _script()
    lint.lay_out(tmp_path)
    target = tmp_path / "podhealth" / module
    target.write_text((target.read_text(encoding="utf-8") if target.exists() else "") + line, encoding="utf-8")
    r = lint.run(tmp_path, _lint_imports())
    assert r.returncode != 0, r.stdout
    # (an edge out of core breaks the layers contract too: every layer then reaches up through core)
    broken = [ln for ln in r.stdout.splitlines() if " BROKEN" in ln and not ln.startswith("Contracts")]
    assert any(ln.startswith(contract) for ln in broken), r.stdout
    assert "backedge" in r.stdout or "hostnames -> podhealth.aggregator" in r.stdout, r.stdout


def test_the_profiles_room_has_no_circle(tmp_path: Path) -> None:
    """The shipped catalog never reaches up to the site profile that extends it (issue 30)."""
    lint = _script()
    lint.lay_out(tmp_path)
    target = tmp_path / "podhealth" / "checks" / "profiles" / "catalog.py"
    target.write_text(target.read_text(encoding="utf-8") + "from podhealth.checks.profiles import site\n",
                      encoding="utf-8")
    r = lint.run(tmp_path, _lint_imports())
    broken = [ln for ln in r.stdout.splitlines() if " BROKEN" in ln and not ln.startswith("Contracts")]
    assert r.returncode != 0 and [ln for ln in broken if ln.startswith("profiles:")], r.stdout
    assert "podhealth.checks.profiles.catalog -> podhealth.checks.profiles.site" in r.stdout, r.stdout


def test_the_core_contract_names_every_core_module() -> None:
    """A core module missing from the list would be free to import upwards unseen."""
    sources = _contracts()["core"]["source_modules"]
    assert isinstance(sources, list)
    listed = set(sources)
    modules = {f"podhealth.{p.stem}" for p in (REPO / "core").glob("*.py") if p.stem != "__init__"}
    assert listed == modules, (f"add to the `core` contract in pyproject.toml: {sorted(modules - listed)}; "
                               f"remove: {sorted(listed - modules)}")
