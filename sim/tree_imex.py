"""The IMEX service's answers on a simulated GB200 tray: what `nvidia-imex-ctl -q` and
`nvidia-imex-ctl -N -j` print (collectors/imex_parse.py reads both), written as <node>/imex/q.txt
and <node>/imex/N.json (the imex collector's `status_source`).

A healthy rack: this tray's daemon READY, the domain UP with the rack's 18 trays READY and
connected (GB200 NVL72: 72 GPUs, 4 per tray). `fault=imex-down` stops this tray's daemon: it
answers UNAVAILABLE, and the domain it sees is DOWN.
"""

from __future__ import annotations

import json
from pathlib import Path

from podhealth.checks import profiles
from podhealth.sim.state import NodeState
from podhealth.sim.tree_write import TreeWriter

IMEX_DIR = "imex"


def write(state: NodeState, node_dir: Path) -> None:
    prof = profiles.load(state.profile)
    if not prof.nvlink_domain.imex:
        return
    trays = max(1, prof.nvlink_domain.gpus // max(1, len(state.gpus) or 1))
    down = bool(state.faults_of("imex-down"))
    nodes = {}
    for i in range(trays):
        ready = not (down and i == 0)
        nodes[str(i)] = {
            "status": "READY" if ready else "UNAVAILABLE",
            "host": f"10.0.0.{i + 1}",
            "hostName": state.name if i == 0 else f"{state.name}-peer{i}",
            "connections": {str(j): {"host": f"10.0.0.{j + 1}",
                                     "status": "CONNECTED" if ready and not (down and j == 0) else "DISCONNECTED",
                                     "changed": False} for j in range(trays)},
            "changed": False,
            "version": state.driver_version,
        }
    out = node_dir / IMEX_DIR
    w = TreeWriter(out)
    w.put(out / "q.txt", ("UNAVAILABLE" if down else "READY") + "\n")
    # no timestamp in it: a file that changes every refresh would be rewritten every second
    w.put(out / "N.json", json.dumps({"nodes": nodes, "status": "DOWN" if down else "UP"}, indent=1))
