"""The fail-slow sections of the config: per-metric rules, errors naming file, line and key."""

from __future__ import annotations

import pytest

from podhealth.config import Config
from podhealth.configload import ConfigError, load_text

GOOD = """
aggregator:
  failslow:
    judge:
      min_cohort: 32
      metrics:
        gemm_tflops: {action: drain, act_z: -8, act_consecutive: 2}
    stragglers: {windows: 2, of: 3}
"""


def test_per_metric_rule_and_defaults() -> None:
    cfg = load_text(Config, GOOD, "podhealth.yaml")
    judge = cfg.aggregator.failslow.judge
    assert judge.min_cohort == 32
    assert judge.rule("gemm_tflops").action == "drain"
    assert judge.rule("hbm_gbs").action == "warn"  # left out: the defaults


@pytest.mark.parametrize("text,key,line", [
    ("aggregator:\n  failslow:\n    judge:\n      metrics:\n        gemm: {action: drain}\n", "gemm", 5),
    ("aggregator:\n  failslow:\n    judge:\n      metrics:\n        gemm_tflops: {action: fence}\n", "action", 5),
    ("aggregator:\n  failslow:\n    judge:\n      min_cohort: 2\n", "min_cohort", 4),
    ("aggregator:\n  failslow:\n    stragglers: {windows: 4, of: 3}\n", "windows", 3),
    ("aggregator:\n  failslow:\n    judge:\n      metrics:\n        hbm_gbs: {warn_z: 3}\n", "warn_z", 5),
])
def test_bad_values_name_file_line_and_key(text: str, key: str, line: int) -> None:
    with pytest.raises(ConfigError) as e:
        load_text(Config, text, "podhealth.yaml")
    msg = str(e.value)
    assert "podhealth.yaml" in msg and key in msg and f":{line}" in msg, msg
