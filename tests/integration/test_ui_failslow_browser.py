"""The fail-slow page in headless Chromium (Playwright, system Chromium) against a real
`podhealth aggregator` fed probe rounds and job windows from simulated nodes: the cohort's
distribution with the outlier marked, the link to its history, and the job's straggler."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from podhealth.sim import faults, perfmodel
from podhealth.sim.state import default_state
from tests.harness.agg import post
from tests.harness.proc import free_port, http_get, service, wait_until
from tests.integration.test_ui_versions_browser import browser  # noqa: F401 - the fixture

pytestmark = pytest.mark.timeout(180)
NODES = [f"dgx{i:02d}" for i in range(1, 21)]


def test_failslow_page_marks_the_outlier_and_names_the_straggler(tmp_path: Path, browser: Any) -> None:  # noqa: F811
    port = free_port()
    cfg = {"aggregator": {"listen": {"address": "127.0.0.1", "port": port}, "db": str(tmp_path / "agg.db"),
                          "auth": {"admin_token": "ui-admin"}, "fencers": {"dryrun": {"enabled": True}},
                          "nodes": [{"name": n, "partition": "gpu"} for n in NODES],
                          "failslow": {"interval": 1, "window": 1}}}
    path = tmp_path / "aggregator.yaml"
    path.write_text(json.dumps(cfg))
    url = f"http://127.0.0.1:{port}"
    states = [default_state(n, "dgx-h100", now=0.0) for n in NODES]
    states[6] = states[6].with_fault(faults.parse(["fault=slow-gpu", "gpu=3", "pct=12"], 0.0))
    states[10] = states[10].with_fault(faults.parse(["fault=thermal", "gpu=2"], 0.0))
    with service("aggregator", [sys.executable, "-m", "podhealth", "aggregator", "--config", str(path)],
                 tmp_path / "logs", port, ready=lambda: http_get(url + "/healthz")[0] == 200, ready_timeout=40):
        now = time.time()
        for st in states:
            probes = [{"entity": r.entity, "metric": r.metric, "value": r.value, "firmware": r.firmware}
                      for r in perfmodel.fingerprint(st, 2, now)]
            code, body = post(url + "/v1/perf", {"node": st.name, "profile": "dgx-h100", "driver": st.driver_version,
                                                 "probes": probes})
            assert code == 200, body
        for _ in range(3):  # three 1 s job windows of a 16-node job
            at = time.time()
            for st in states[:16]:
                gpus = [{"gpu": w.gpu, "sm_active": w.sm_active, "power_w": w.power_w, "sm_clock_mhz": w.sm_clock_mhz,
                         "throttle": list(w.throttle), "nvlink_gbs": w.nvlink_gbs, "ib_gbs": w.ib_gbs}
                        for w in perfmodel.job_window(st, 1, at)]
                code, body = post(url + "/v1/perf", {"node": st.name, "profile": "dgx-h100", "driver": "x",
                                                     "job": {"id": "4242", "owner": "alice", "gpus": gpus}})
                assert code == 200, body
            bucket = int(time.time())
            wait_until(lambda: int(time.time()) > bucket, what="the next window")

        def judged() -> bool:
            out = json.loads(http_get(url + "/api/v1/failslow/outliers?metric=gemm")[1])
            st = json.loads(http_get(url + "/api/v1/failslow/stragglers")[1])
            return bool(out["findings"]) and bool(st["stragglers"])
        wait_until(judged, timeout=30, what="a finding and a straggler")

        page = browser.new_context(viewport={"width": 1400, "height": 900}).new_page()
        page.set_default_timeout(20_000)
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.goto(url + "/ui")
        page.click("a[href='/ui/failslow']")
        cohort = page.locator(".fs-cohort").first
        cohort.wait_for()
        assert "160 parts" in cohort.inner_text().lower()
        assert cohort.locator("rect.outlier").count() >= 1  # the slow GPU's bar
        row = cohort.locator("tr[data-node='dgx07'][data-entity='gpu3']")
        assert "below the median of 160 dgx-h100 GPUs" in row.inner_text()
        assert page.locator(".fs-cohort tr[data-node]").count() == 1  # nobody else
        strag = page.locator(".fs-stragglers tr[data-job='4242']")
        assert strag.count() == 1 and "alice" in strag.inner_text() and "dgx11" in strag.inner_text()
        assert "thermal" in strag.inner_text()
        row.locator("a").click()  # the part's history
        hist = page.locator("#history tr[data-entity='gpu3'][data-metric='gemm_tflops']")
        hist.wait_for()
        assert hist.locator("circle.outlier").count() == 1
        assert page.locator("#history tr[data-entity='gpu2'] circle.outlier").count() == 0
        # the node page names the straggler too, with the job and its owner
        page.goto(url + "/ui/node/dgx11")
        named = page.locator("#failslow .straggler[data-job='4242']")
        named.wait_for()
        assert "job 4242 (alice)" in named.inner_text() and "gpu2, thermal" in named.inner_text()
        page.goto(url + "/ui/node/dgx05")
        page.locator("#failslow a").wait_for()  # probes, no straggler
        assert page.locator("#failslow .straggler").count() == 0
        assert not errors, errors
