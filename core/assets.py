"""The operations files podhealth ships: Grafana dashboards, Prometheus rules, the Alertmanager
example, runbooks and systemd units.

In the wheel they are package data under podhealth/ (pyproject.toml maps dashboards/ and
alerts/ to podhealth.dashboards and podhealth.alerts, systemd/ to podhealth.units); in a source
checkout (an editable install) they are the repository's own folders beside core/. `files()`
finds them in either layout, so `podhealth assets export` works from both.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import podhealth
from podhealth import alertrules

# export folder -> (folder in the wheel under podhealth/, folder in a checkout, file patterns)
GROUPS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "dashboards": ("dashboards", "dashboards", ("*.json",)),
    "alerts": ("alerts", "alerts", ("podhealth-rules.yml", "alertmanager.yml")),
    "alerts/runbooks": ("alerts/runbooks", "alerts/runbooks", ("*.md",)),
    "systemd": ("units", "systemd", ("*.service",)),
}


class AssetsMissing(Exception):
    """This install carries no operations files (a broken wheel): says which folder was looked for."""


@dataclass(frozen=True)
class Asset:
    group: str   # export folder, e.g. "alerts/runbooks"
    source: Path

    @property
    def relpath(self) -> str:
        return f"{self.group}/{self.source.name}"


def _folder(wheel_dir: str, checkout_dir: str) -> Path:
    pkg = Path(podhealth.__file__).resolve().parent
    for candidate in (pkg / wheel_dir, pkg.parent / checkout_dir):
        if candidate.is_dir():
            return candidate
    raise AssetsMissing(f"no {wheel_dir}/ in {pkg} (nor {checkout_dir}/ beside it): reinstall podhealth")


def files() -> list[Asset]:
    out: list[Asset] = []
    for group, (wheel_dir, checkout_dir, patterns) in GROUPS.items():
        folder = _folder(wheel_dir, checkout_dir)
        found = sorted({p for pat in patterns for p in folder.glob(pat) if p.is_file()})
        if not found:
            raise AssetsMissing(f"{folder} holds none of {', '.join(patterns)}")
        out.extend(Asset(group, p) for p in found)
    return out


RULES = "alerts/podhealth-rules.yml"


def export(dest: Path, overwrite: bool = False, job_selector: str = alertrules.DEFAULT_JOB_SELECTOR,
           runbook_base: str = alertrules.DEFAULT_RUNBOOK_BASE) -> list[Path]:
    """Copy every asset under `dest` (dashboards/, alerts/, alerts/runbooks/, systemd/), the alert
    rules written for the site's scrape job and runbook URL (core/alertrules.py).

    Refuses (FileExistsError, nothing written) when a file is already there and `overwrite` is off,
    so a site's edited copy is never replaced by accident; a bad selector or URL (RulesError)
    also writes nothing."""
    todo: list[tuple[bytes, Path]] = []
    for a in files():
        data = a.source.read_bytes()
        if a.relpath == RULES:
            data = alertrules.render(data.decode(), job_selector, runbook_base).encode()
        elif a.relpath.startswith("dashboards/") and a.relpath.endswith(".json"):
            data = alertrules.render_dashboard(data.decode(), job_selector).encode()
        todo.append((data, dest / a.relpath))
    clash = [str(t) for _, t in todo if t.exists()]
    if clash and not overwrite:
        raise FileExistsError(f"{len(clash)} file(s) exist, e.g. {clash[0]} (pass --force to overwrite)")
    written: list[Path] = []
    for data, target in todo:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        written.append(target)
    return written
