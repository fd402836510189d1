"""The fleet page's Versions section in headless Chromium (Playwright, system Chromium) against a
real `podhealth aggregator` fed agent reports that carry drift results."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.harness.agg import post
from tests.harness.proc import free_port, http_get, need, service

pytestmark = pytest.mark.timeout(180)

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic"]
FW = {"dgx01": "28.37.1014", "dgx02": "28.39.1002", "dgx03": "28.39.1002", "dgx04": "28.39.1002"}


def report(node: str, t: float) -> dict[str, Any]:
    def drift(field: str, observed: str) -> dict[str, Any]:
        return {"check": "drift", "entity": field, "status": "OK", "action": "NONE",
                "evidence": {"observed": observed}, "summary": observed}
    return {"node": node, "agent_version": "0.1.0", "profile": "dgx-h100", "time": t,
            "boot_id": "boot-1", "seq": int(t * 1000),
            "results": [drift("driver", "550.54.15"), drift("hca_fw", FW[node]), drift("vbios", "96.00.89.00.01"),
                        drift("ofed", ""), drift("kernel", "5.15.0-1042-nvidia")]}


@pytest.fixture
def browser() -> Iterator[Any]:
    need(CHROMIUM)
    sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright (no browser download needed)")
    with sync_api.sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            yield b
        finally:
            b.close()


def test_versions_section_names_the_odd_ones_out(tmp_path: Path, browser: Any) -> None:
    port = free_port()
    cfg = {"aggregator": {"listen": {"address": "127.0.0.1", "port": port}, "db": str(tmp_path / "agg.db"),
                          "auth": {"admin_token": "ui-admin"}, "fencers": {"dryrun": {"enabled": True}},
                          "nodes": [{"name": n, "partition": "gpu"} for n in FW]}}
    path = tmp_path / "aggregator.yaml"
    path.write_text(json.dumps(cfg))  # JSON is YAML
    url = f"http://127.0.0.1:{port}"
    with service("aggregator", [sys.executable, "-m", "podhealth", "aggregator", "--config", str(path)],
                 tmp_path / "logs", port, ready=lambda: http_get(url + "/healthz")[0] == 200, ready_timeout=40):
        now = time.time()
        for node in FW:
            status, body = post(url + "/v1/reports", report(node, now))
            assert status == 200, body
        ctx = browser.new_context(viewport={"width": 1400, "height": 900})
        page = ctx.new_page()
        page.set_default_timeout(20_000)
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.goto(url + "/ui")
        page.click("#versions > summary")  # closed by default: the tiles come first
        row = page.locator('#versions tr[data-field="hca_fw"]')
        row.wait_for()
        text = row.inner_text()
        assert "3 nodes run 28.39.1002" in text and "1 node runs 28.37.1014" in text
        # the odd one out links to its node page; the majority is not listed node by node
        link = row.locator("a", has_text="dgx01")
        assert link.get_attribute("href") == "/ui/node/dgx01"
        assert row.locator("a", has_text="dgx02").count() == 0
        assert "2 versions" in text
        assert "more than one version of: HCA firmware" in page.locator("#versions .versions-status").inner_text()
        assert "1 node runs" not in page.locator('#versions tr[data-field="driver"]').inner_text()
        assert "4 nodes run 550.54.15" in page.locator('#versions tr[data-field="driver"]').inner_text()
        assert "not reported" in page.locator('#versions tr[data-field="ofed"]').inner_text()
        page.screenshot(path=str(Path("test-artifacts") / "ui-versions.png") if Path("test-artifacts").is_dir() else str(tmp_path / "ui-versions.png"))
        assert not errors, errors
        ctx.close()
