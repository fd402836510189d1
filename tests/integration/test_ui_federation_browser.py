"""The federated view (/ui/federation) in headless Chromium: three real `podhealth aggregator`
processes, two sets (each its own SQLite database and admin token) and the one serving the view,
which lists both and a set that is down."""

from __future__ import annotations

import json
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from tests.harness.agg import post
from tests.harness.proc import free_port, http_get, service
from tests.integration.test_ui_versions_browser import browser  # noqa: F401 - the Chromium fixture

pytestmark = pytest.mark.timeout(180)


def report(node: str, t: float, status: str) -> dict[str, Any]:
    return {"node": node, "time": t, "boot_id": "boot-1", "seq": int(t * 1000), "results": [
        {"check": "xid", "entity": "gpu3", "status": status, "action": "REBOOT" if status == "FAIL" else "NONE",
         "since": t - 5, "summary": "XID 79" if status == "FAIL" else ""}]}


def start(stack: ExitStack, tmp: Path, name: str, extra: dict[str, Any]) -> str:
    port = free_port()
    cfg = {"aggregator": {"listen": {"address": "127.0.0.1", "port": port}, "db": str(tmp / name / "agg.db"),
                          "fencers": {"dryrun": {"enabled": True}}, "rules": [{"check": "*", "do": "notify"}],
                          **extra}}
    (tmp / name).mkdir()
    path = tmp / name / "aggregator.yaml"
    path.write_text(json.dumps(cfg))  # JSON is YAML
    url = f"http://127.0.0.1:{port}"
    stack.enter_context(service(name, [sys.executable, "-m", "podhealth", "aggregator", "--config", str(path)],
                                tmp / name / "logs", port, ready=lambda: http_get(url + "/healthz")[0] == 200,
                                ready_timeout=40))
    return url


def test_the_federation_page_tiles_each_set_and_shows_the_one_that_is_down(tmp_path: Path, browser: Any) -> None:  # noqa: F811
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    with ExitStack() as stack:
        a = start(stack, tmp_path, "pod-a", {"auth": {"admin_token": "admin-a"},
                                             "nodes": [{"name": n} for n in ("dgx01", "dgx02")]})
        b = start(stack, tmp_path, "pod-b", {"auth": {"admin_token": "admin-b"}, "nodes": [{"name": "dgx01"}]})
        now = time.time()
        for url, node, status in ((a, "dgx01", "OK"), (a, "dgx02", "FAIL"), (b, "dgx01", "OK")):
            code, body = post(url + "/v1/reports", report(node, now, status))
            assert code == 200, body
        view = start(stack, tmp_path, "view", {"federation": {"timeout": 2, "sets": [
            {"name": "pod-a", "url": a, "token": "admin-a"}, {"name": "pod-b", "url": b, "token": "admin-b"},
            {"name": "pod-down", "url": dead}]}})
        page = browser.new_context(viewport={"width": 1400, "height": 900}).new_page()
        page.set_default_timeout(20_000)
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.goto(view + "/ui/federation")
        tile_a = page.locator('section.set[data-set="pod-a"]')
        tile_a.wait_for()
        link = tile_a.locator("ul.problems a", has_text="dgx02")
        assert link.get_attribute("href") == a + "/ui/node/dgx02"
        assert "FAIL" in tile_a.inner_text()
        assert "every node OK" in page.locator('section.set[data-set="pod-b"]').inner_text()
        down = page.locator('section.set[data-set="pod-down"]')
        assert "unreachable" in down.inner_text() and "set-down" in (down.get_attribute("class") or "")
        assert "admin-a" not in page.content() and "admin-b" not in page.content()
        assert errors == []
