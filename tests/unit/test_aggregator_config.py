from __future__ import annotations

from pathlib import Path

import pytest

from podhealth import config
from podhealth.config_aggregator import AggregatorConfig, RuleConfig
from podhealth.config import ConfigError

GOOD = """\
aggregator:
  listen: {address: 127.0.0.1, port: 9420}
  db: /var/lib/podhealth/agg.db
  auth:
    cluster_token: c
    node_tokens: {dgx01: t1, dgx02: t2}
    admin_token: a
  rules:
    - check: "nfs*"
      do: notify
      min_severity: warning
    - check: "*"
      actions: [RESET_GPU, DRAIN]
      do: fence
      min_duration: 30
  caps: {max_fenced: 5, max_percent_per_partition: 20}
  rate_limit: {fences_per_minute: 3}
  breaker: {share_percent: 15, window: 120, min_nodes: 4}
  opt_out: [dgx09]
  manual_release: true
  healthy_for: 300
  nodes:
    - {name: dgx01, agent_url: "http://10.0.0.1:9410", partition: batch, slurm_name: dgx-01}
    - {name: dgx02, partition: batch, k8s_name: node-2}
  fencers:
    slurm: {enabled: true, scontrol: /usr/bin/scontrol, timeout: 5, slurm_conf: /etc/slurm/slurm.conf}
    kubernetes: {enabled: true, in_cluster: true}
"""


def test_a_full_aggregator_section_loads_typed_and_frozen() -> None:
    cfg = config.loads(GOOD, "agg.yaml").aggregator
    assert isinstance(cfg, AggregatorConfig)
    assert cfg.auth.node_tokens["dgx02"] == "t2"
    assert cfg.rules[0] == RuleConfig(check="nfs*", do="notify", min_severity="warning")
    assert cfg.rules[1].actions == ("RESET_GPU", "DRAIN") and cfg.rules[1].min_duration == 30.0
    assert cfg.caps.max_fenced == 5 and cfg.breaker.min_nodes == 4 and cfg.opt_out == ("dgx09",)
    assert cfg.nodes[0].slurm_name == "dgx-01" and cfg.nodes[1].k8s_name == "node-2"
    assert cfg.fencers.slurm.enabled and cfg.fencers.kubernetes.in_cluster and not cfg.fencers.file.enabled
    with pytest.raises(Exception):
        cfg.caps.max_fenced = 1  # type: ignore[misc]


def test_defaults_are_safe() -> None:
    cfg = AggregatorConfig()
    assert not cfg.dry_run and cfg.caps.max_fenced == 10 and cfg.rate_limit.fences_per_minute == 10
    assert not any(f.enabled for f in (cfg.fencers.slurm, cfg.fencers.kubernetes, cfg.fencers.file))
    assert cfg.rules[0].do == "fence" and "RESTART_APP" not in cfg.rules[0].actions


def _err(text: str) -> str:
    with pytest.raises(ConfigError) as ei:
        config.loads(text, "agg.yaml")
    return str(ei.value)


@pytest.mark.parametrize("text, message", [
    ("aggregator:\n  rules:\n    - check: xid\n      do: explode\n",
     "agg.yaml:4: aggregator.rules[0].do: expected one of 'notify', 'fence', 'fence_and_reboot', got \"explode\""),
    ("aggregator:\n  rules:\n    - actions: [DRAIN, REBOT]\n",
     "agg.yaml:3: aggregator.rules[0].actions[1]: expected one of 'NONE', 'RESTART_APP', 'RESET_GPU', 'DRAIN', "
     "'REBOOT', 'REPLACE', got \"REBOT\""),
    ("aggregator:\n  rules:\n    - min_severity: high\n",
     "agg.yaml:3: aggregator.rules[0].min_severity: expected one of 'info', 'warning', 'critical', got \"high\""),
    ("aggregator:\n  rules:\n    - min_duration: -5\n",
     "agg.yaml:3: aggregator.rules[0].min_duration: expected seconds >= 0, got -5"),
    ("aggregator:\n  caps:\n    max_percent_per_partition: 120\n",
     "agg.yaml:3: aggregator.caps.max_percent_per_partition: expected a percentage <= 100, got 120"),
    ("aggregator:\n  caps:\n    max_fenced: -1\n",
     "agg.yaml:3: aggregator.caps.max_fenced: expected a count >= 0, got -1"),
    ("aggregator:\n  connections:\n    max: -1\n",
     "agg.yaml:3: aggregator.connections.max: expected connections >= 0, got -1"),
    ("aggregator:\n  connections:\n    idle_timeout: -5\n",
     "agg.yaml:3: aggregator.connections.idle_timeout: expected seconds >= 0, got -5"),
    ("aggregator:\n  breaker:\n    window: 0\n",
     "agg.yaml:3: aggregator.breaker.window: expected seconds > 0, got 0"),
    ("aggregator:\n  breaker:\n    share: 10\n",
     "agg.yaml:3: aggregator.breaker.share: unknown key (known: min_nodes, share_percent, window)"),
    ("aggregator:\n  db: relative.db\n",
     'agg.yaml:2: aggregator.db: expected an absolute path, got "relative.db"'),
    ("aggregator:\n  nodes:\n    - name: dgx01\n    - name: 'dgx 02; rm -rf /'\n",
     "agg.yaml:4: aggregator.nodes[1].name: expected a node name (letters, digits, \".\", \"_\", \"-\"; at most 63), "
     "got \"dgx 02; rm -rf /\": not a valid Slurm node name, contains ' /;'"),
    ("aggregator:\n  nodes:\n    - name: dgx01\n      agent_url: dgx01:9410\n",
     'agg.yaml:4: aggregator.nodes[0].agent_url: expected an http(s) URL, got "dgx01:9410"'),
    ("aggregator:\n  nodes:\n    - name: dgx01\n    - name: dgx01\n",
     "agg.yaml:3: aggregator.nodes: duplicate node dgx01"),
    ("aggregator:\n  opt_out: [dgx01, '-x']\n",
     "agg.yaml:2: aggregator.opt_out: expected a node name (letters, digits, \".\", \"_\", \"-\"; at most 63), got \"-x\": "
     "not a valid Slurm node name, must start and end with a letter or digit"),
    ("aggregator:\n  auth:\n    node_tokens: {dgx01: ''}\n",
     "agg.yaml:3: aggregator.auth.node_tokens: empty token for node dgx01"),
    ("aggregator:\n  fencers:\n    file: {enabled: true, path: fence.json}\n",
     'agg.yaml:3: aggregator.fencers.file.path: expected an absolute path, got "fence.json"'),
    ("aggregator:\n  fencers:\n    slurm: {enabled: yes please}\n",
     'agg.yaml:3: aggregator.fencers.slurm.enabled: expected true or false, got "yes please"'),
    ("aggregator:\n  max_body_bytes: 0\n",
     "agg.yaml:2: aggregator.max_body_bytes: expected bytes > 0, got 0"),
    ("aggregator:\n  listen: {port: 99999}\n",
     "agg.yaml:2: aggregator.listen.port: expected a port <= 65535, got 99999"),
])
def test_errors_name_file_line_and_key(text: str, message: str) -> None:
    assert _err(text) == message


def test_file_errors_name_the_file(tmp_path: Path) -> None:
    p = tmp_path / "podhealth.yaml"
    p.write_text("aggregator:\n  rate_limit:\n    fences_per_minute: lots\n")
    with pytest.raises(ConfigError) as ei:
        config.load(p)
    assert str(ei.value) == ('podhealth.yaml:3: aggregator.rate_limit.fences_per_minute: '
                             'expected a count >= 0, got "lots"')


def test_default_yaml_documents_and_round_trips_the_aggregator() -> None:
    text = config.default_yaml()
    assert "# Circuit breaker against fleet-wide failures." in text
    assert config.loads(text, "default.yaml").aggregator == AggregatorConfig()
