"""Job stragglers end to end, passively: simulated agents (`podhealth agent --simulate`), a job on
every GPU of four nodes (`podhealth simulate job start`), one GPU held hot (`fault=thermal`). Each
agent sends the job's GPUs as its collectors read them (the simulated NVML: a GPU with a job
computes at its node's clock; a hot one is held at half) to a real aggregator, which names that
GPU as the job's likely straggler (on the API and /metrics) and nobody else, without a condition
of its own."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.harness import stack
from tests.harness.proc import wait_until
from tests.harness.stack import get_json

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]
NODES = ("dgx01", "dgx02", "dgx03", "dgx04")
WINDOW = 5.0


def test_a_hot_gpu_is_named_as_the_jobs_straggler_and_no_one_else(tmp_path: Path) -> None:
    sim_root = tmp_path / "sim"
    with stack.aggregator(tmp_path / "aggregator", {
        "nodes": [{"name": n, "partition": "gpu"} for n in NODES],
        "fencers": {"dryrun": {"enabled": True}},
        "failslow": {"interval": 1.0, "window": WINDOW, "stragglers": {"min_peers": 4}},
    }) as agg:
        configs = {n: stack.agent_config(interval=1.0, publish_url=agg.url, token=agg.node_token(n),
                                         spool_dir=tmp_path / "spool" / n, job_window=WINDOW) for n in NODES}
        with stack.agents(tmp_path / "agents", sim_root, configs):
            stack.simulate_all(sim_root, [("job", "start", n, "--gpus", "0,1,2,3,4,5,6,7", "--id", "77",
                                           "--user", "alice") for n in NODES]
                               + [("inject", "dgx03", "fault=thermal", "gpu=2")])

            def named() -> list[dict[str, object]]:
                return list(get_json(f"{agg.url}/api/v1/failslow/stragglers")["stragglers"])

            found = wait_until(named, timeout=120, what="a straggler named")
            assert [(s["job"], s["owner"], s["node"], s["gpu"], s["reason"]) for s in found] == \
                [("77", "alice", "dgx03", 2, "thermal")], json.dumps(found)
            assert 'podhealth_job_straggler{gpu="2",job="77",job_id="77",node="dgx03",owner="alice",reason="thermal"} 1.0' \
                in agg.metrics()
            # WARN only: a straggler is never a condition (the hot GPU's own thermal verdict, from
            # the agent's checks, is another matter and fences as it always did)
            for n in NODES:
                assert not [c for c in agg.node(n)["conditions"] if c["check"].startswith("failslow")], n
