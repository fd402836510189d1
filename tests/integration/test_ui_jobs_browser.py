"""The node page names the job on each GPU (headless Chromium against a real aggregator).

An agent's report carries the job in a GPU's evidence (agent/jobmap.py) and its XID events carry
`job`; the page shows the job under the GPU's name in the GPUs matrix and beside the event, and
nothing for a GPU without a job.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from tests.harness.agg import post
from tests.integration.test_ui_browser import (  # noqa: F401 - browser is a fixture
    agent_report, browser, new_page, start_aggregator, tok, xid_event,
)

pytestmark = pytest.mark.timeout(120)


def test_node_page_shows_the_job_per_gpu(tmp_path: Path, browser: Any) -> None:  # noqa: F811
    from playwright.sync_api import expect

    job = "slurm job 42 (alice)"
    with start_aggregator(tmp_path, None, {}) as agg:
        t = time.time()
        rep = agent_report("dgx02", t, xid_gpu=3)
        for r in rep["results"]:
            if r["entity"] in ("gpu2", "gpu3"):
                r["evidence"]["job"] = job
        ev = xid_event(t, gpu=3)
        ev["event"]["job"] = job
        assert post(agg.url + "/v1/events", {"node": "dgx02", "events": [ev]}, tok("dgx02"))[0] == 200
        assert post(agg.url + "/v1/reports", rep, tok("dgx02"))[0] == 200

        page = new_page(browser)
        page.goto(agg.url + "/ui/node/dgx02")
        gpus = page.locator('section.results[data-group="GPUs"]')
        expect(gpus.locator('.gpujob[data-entity="gpu3"]')).to_have_text(job)
        expect(gpus.locator('.gpujob[data-entity="gpu2"]')).to_have_text(job)
        expect(gpus.locator(".gpujob")).to_have_count(2)  # GPUs without a job show none
        expect(page.locator("#events .gpujob")).to_have_text(job)
        assert page.js_errors == [], page.js_errors
