"""Links from a node to podhealth's Grafana dashboards (aggregator.ui.grafana_url).

The dashboards ship with podhealth (found by podhealth.assets, in a wheel or a checkout); each one whose
templating has a `node` variable gets a link `<base>/d/<uid>?var-node=<name>`, the URL form
Grafana keeps stable across dashboard renames (the slug after the uid is optional). Read once at
start: the list cannot change while the aggregator runs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable
from urllib.parse import quote

from podhealth import assets

FIRST = "podhealth-node"  # the per-node detail dashboard leads the list: it is where an operator starts


@dataclass(frozen=True, slots=True)
class Dashboard:
    uid: str
    title: str


def shipped_dashboards() -> list[Path]:
    """The dashboard files of this install; none (no links, the UI still works) in a broken wheel."""
    try:
        return [a.source for a in assets.files() if a.group == "dashboards"]
    except assets.AssetsMissing:
        return []


def node_dashboards(files: Iterable[Path] | None = None) -> tuple[Dashboard, ...]:
    """The dashboards that take a `node` variable, the node detail first, then by title."""
    out: list[Dashboard] = []
    for path in shipped_dashboards() if files is None else files:
        try:
            d = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue  # one unreadable file costs its link, not the UI
        if not isinstance(d, dict):
            continue
        variables = {v.get("name") for v in d.get("templating", {}).get("list", []) if isinstance(v, dict)}
        if isinstance(d.get("uid"), str) and "node" in variables:
            out.append(Dashboard(d["uid"], str(d.get("title") or d["uid"])))
    return tuple(sorted(out, key=lambda b: (b.uid != FIRST, b.title)))


def node_links(base_url: str, node: str, dashboards: tuple[Dashboard, ...]) -> list[dict[str, str]]:
    """[{uid, title, url}] for `node`; [] when no Grafana is configured."""
    if not base_url:
        return []
    base = base_url.rstrip("/")
    return [{"uid": b.uid, "title": b.title, "url": f"{base}/d/{quote(b.uid, safe='')}?var-node={quote(node, safe='')}"}
            for b in dashboards]
