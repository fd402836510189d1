#!/usr/bin/env python3
"""Check podhealth's layers with import-linter (the contracts are in pyproject.toml).

The top-level folders install under other names (core/ is `podhealth`, sim/ is `podhealth.sim`:
pyproject's package-dir), and import-linter finds a package's modules by walking the one directory
the package imports from, which for `podhealth` is core/ alone. So this lays the .py files out as
they are installed, in a temporary tree, and runs `lint-imports` there. Its exit status is
lint-imports': 0 when every contract is kept.

    python3 scripts/lint_imports.py [--lint-imports PATH]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
TIMEOUT_S = 300.0


def package_folders(pyproject: dict[str, Any]) -> dict[str, Path]:
    """Each package of pyproject's `packages` -> the folder its modules are in."""
    tool = pyproject["tool"]["setuptools"]
    mapping: dict[str, str] = tool["package-dir"]
    out: dict[str, Path] = {}
    for pkg in tool["packages"]:
        # the longest package-dir entry that is the package or one of its parents
        base = max((p for p in mapping if pkg == p or pkg.startswith(p + ".")), key=len)
        rest = pkg[len(base):].lstrip(".")
        out[pkg] = REPO / mapping[base] / Path(*rest.split(".")) if rest else REPO / mapping[base]
    return out


def lay_out(dest: Path) -> None:
    """Copy every package's .py files to dest/<package path>/, as installed."""
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    for pkg, folder in package_folders(pyproject).items():
        sources = sorted(folder.glob("*.py"))  # (data-only packages have none and are left out)
        target = dest.joinpath(*pkg.split("."))
        for src in sources:
            target.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, target / src.name)
    shutil.copyfile(REPO / "pyproject.toml", dest / "pyproject.toml")


def find_lint_imports(given: str = "") -> str | None:
    """The lint-imports program: `given`, else the one beside this python (its venv), else PATH's."""
    prog = given or str(Path(sys.executable).parent / "lint-imports")
    return prog if os.access(prog, os.X_OK) else shutil.which("lint-imports")


def run(tree: Path, prog: str) -> subprocess.CompletedProcess[str]:
    """lint-imports on a tree made by lay_out (its output in stdout, stderr folded in)."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    return subprocess.run([prog, "--no-cache", "--no-logo", "pyproject.toml"], cwd=tree, env=env,
                          timeout=TIMEOUT_S, check=False, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--lint-imports", default="", help="the lint-imports program (default: beside this python)")
    args = p.parse_args(argv)
    prog = find_lint_imports(args.lint_imports)
    if prog is None:
        print("lint-imports not found: pip install import-linter (scripts/setup.sh --test does)", file=sys.stderr)
        return 127
    with tempfile.TemporaryDirectory(prefix="podhealth-lint-") as tmp:
        lay_out(Path(tmp))
        try:
            r = run(Path(tmp), prog)
        except subprocess.TimeoutExpired:
            print(f"lint-imports did not finish within {TIMEOUT_S:g}s", file=sys.stderr)
            return 124
    print(r.stdout, end="")
    return r.returncode


if __name__ == "__main__":
    sys.exit(main())
