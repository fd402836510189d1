"""What `podhealth simulate fleet` writes before it starts anything: pure functions, no I/O.

The fleet is wired only through the ordinary config files, so what it runs is exactly what a
site would run: one agent config per node (push to the aggregator, spool under the fleet
directory), one aggregator config (nodes with their agent URLs and partition, the cluster secret each
agent's own token derives from, SQLite under the fleet directory, the Slurm fencer pointed at the loopback cluster or the dry-run fencer), and a
Prometheus scrape config for every target. Each is rendered from a dict through YAML and then
parsed back with the real config loader (`check_*`), so a schema change fails before a process
is started, with the loader's file:line:key message.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class AgentPlan:
    node: str
    port: int
    config: Path
    spool: Path

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"


@dataclass(frozen=True)
class FleetPlan:
    """Everything the fleet will start, decided before anything runs."""

    root: Path  # the sim root: node directories live here
    home: Path  # <root>/_fleet: configs, logs, pidfiles, the aggregator's database
    profile: str
    cluster: str
    partition: str
    agents: tuple[AgentPlan, ...]
    aggregator_port: int
    aggregator_config: Path
    db: Path
    cluster_secret: str  # node tokens derive from it (podhealth.credentials); only the aggregator holds it
    admin_token: str

    def node_token(self, node: str) -> str:
        from podhealth.credentials import derive_node_token
        return derive_node_token(self.cluster_secret, node)

    def agent_token(self, node: str) -> str:
        """What the aggregator presents to `node`'s agent (/v1/handover, GPU resets, bundles)."""
        from podhealth.credentials import derive_agent_token
        return derive_agent_token(self.cluster_secret, node)

    @property
    def aggregator_url(self) -> str:
        return f"http://{LOOPBACK}:{self.aggregator_port}"

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(a.node for a in self.agents)


@dataclass(frozen=True)
class FencerChoice:
    """The Slurm fencer on a loopback cluster (slurm_conf set), or the dry-run fencer."""

    slurm_conf: Path | None
    note: str


def agent_config(plan: FleetPlan, agent: AgentPlan) -> str:
    doc: dict[str, Any] = {
        "log": {"level": "info", "format": "json"},
        # Each agent holds only its own node's tokens, as a site would deploy them.
        "publish": {"aggregator_url": plan.aggregator_url, "token": plan.node_token(agent.node),
                    "spool_dir": str(agent.spool)},
        "auth": {"token": plan.agent_token(agent.node)},
        # Fail-slow probes of the node's performance model (sim/perfmodel.py), every 5 minutes on
        # an idle node: `fault=slow-gpu gpu=3 pct=7` shows on the UI's fail-slow page after the next round.
        "failslow": {"enabled": True, "interval": 300.0, "idle_for": 30.0, "jitter": 0.25},
    }
    return _header(f"agent {agent.node}") + yaml.safe_dump(doc, sort_keys=False)


def aggregator_config(plan: FleetPlan, fencer: FencerChoice) -> str:
    n = len(plan.agents)
    fencers: dict[str, Any]
    if fencer.slurm_conf is not None:
        fencers = {"slurm": {"enabled": True, "slurm_conf": str(fencer.slurm_conf), "timeout": 5.0}}
    else:
        fencers = {"dryrun": {"enabled": True}}
    doc: dict[str, Any] = {
        "log": {"level": "info", "format": "json"},
        "aggregator": {
            "listen": {"address": LOOPBACK, "port": plan.aggregator_port},
            "db": str(plan.db),
            # No agent_token: each agent's is derived from cluster_secret for its node.
            "auth": {"cluster_secret": plan.cluster_secret, "admin_token": plan.admin_token},
            # A demo wants to see things happen: pull often, return a healed node after 30 s.
            "pull_interval": 2.0,
            "pull_timeout": 2.0,
            "unreachable_after": 30.0,
            "healthy_for": 30.0,
            # A quarter of the pod may be fenced, so a few injected faults all show up as drains;
            # the breaker keeps its defaults, so faults on many nodes at once show it tripping.
            "caps": {"max_fenced": max(1, n // 4), "max_percent_per_partition": 25.0},
            "nodes": [{"name": a.node, "agent_url": a.url, "partition": plan.partition} for a in plan.agents],
            "fencers": fencers,
            # The whole path from fence to fix, quickly: name the jobs a fence hurts, reset a
            # GPU, reboot (the loopback Slurm's RebootProgram reboots the simulated node, see
            # reboot_program), and hand a node to REPAIR after two failed attempts.
            "jobs": {"enabled": True},
            "ladder": {"enabled": True, "verify_within": 120.0},
            # 16 nodes' 128 GPUs are a cohort; judged every 10 s so a probe round shows at once.
            "failslow": {"interval": 10.0, "judge": {"min_cohort": min(16, max(3, 8 * n))}},
        },
    }
    return _header("aggregator") + yaml.safe_dump(doc, sort_keys=False)


def reboot_program(plan: FleetPlan, python: str) -> str:
    """The loopback Slurm's RebootProgram: Slurm passes it no node name and every slurmd of the
    loopback cluster runs on this host, so it reboots (`simulate inject NODE fault=reboot`) each
    simulated node that slurmctld shows with a reboot issued (REBOOT_ISSUED)."""
    return (
        "#!/bin/sh\n"
        "# podhealth simulate fleet: reboot the simulated nodes Slurm has issued a reboot for\n"
        "scontrol show node -o | while read -r line; do\n"
        '  case "$line" in *REBOOT_ISSUED*) ;; *) continue ;; esac\n'
        '  node=${line#NodeName=}; node=${node%% *}\n'
        f'  "{python}" -m podhealth simulate inject "$node" fault=reboot --root "{plan.root}"\n'
        "done\n")


def scrape_config(plan: FleetPlan, scrape_interval: str = "15s") -> str:
    """A complete prometheus.yml: job `podhealth` (every agent, labelled cluster and partition)
    and job `podhealth-aggregator`. The agents' series already carry `node`, so no target label
    of that name is added (it would clash and turn into `exported_node`)."""
    doc: dict[str, Any] = {
        "global": {"scrape_interval": scrape_interval, "evaluation_interval": scrape_interval},
        "scrape_configs": [
            {"job_name": "podhealth",
             "static_configs": [{"targets": [f"{LOOPBACK}:{a.port}" for a in plan.agents],
                                 "labels": {"cluster": plan.cluster, "partition": plan.partition}}]},
            {"job_name": "podhealth-aggregator",
             "static_configs": [{"targets": [f"{LOOPBACK}:{plan.aggregator_port}"],
                                 "labels": {"cluster": plan.cluster}}]},
        ],
    }
    return (f"# Prometheus scrape config for the simulated pod {plan.cluster!r} "
            f"(written by `podhealth simulate fleet`)\n" + yaml.safe_dump(doc, sort_keys=False))


def check_agent_config(text: str, source: str) -> None:
    from podhealth import config
    config.loads(text, source)


def check_aggregator_config(text: str, source: str) -> None:
    from podhealth import config
    config.loads(text, source)


def _header(what: str) -> str:
    return (f"# {what} of a simulated pod, written by `podhealth simulate fleet`; rewritten on every start.\n"
            "# It holds tokens: mode 0600.\n")
