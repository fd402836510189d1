"""The node page in headless Chromium (Playwright, system Chromium): with the admin token it shows
the operator's silence, lists the evidence bundle kept with the fence and downloads it (the same
bytes as stored), and a refused bundle with its reason; without the token the bundles stay hidden; Mark healthy releases the fence."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from podhealth.aggregator import bundles
from podhealth.aggregator.model import FenceMode
from tests.harness.agg import MemFencer, running
from tests.integration.test_ui_browser import CHROMIUM, CHROMIUM_ARGS
from tests.unit.test_aggregator_bundles import ADMIN, BundleAgent, cfg
from tests.unit.test_aggregator_service import until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


async def test_node_page_shows_silences_and_downloads_bundles(tmp_path: Path) -> None:
    if not shutil.which(CHROMIUM):
        pytest.skip(f"{CHROMIUM} is not installed")
    api = pytest.importorskip("playwright.async_api", reason="pip install playwright (no browser download needed)")
    agent = BundleAgent("dgx01")
    runner, agent_url = await agent.serve()
    fencer = MemFencer()
    try:
        async with running(cfg(tmp_path, agent_url), [fencer]) as (agg, url), aiohttp.ClientSession() as s:
            await until(lambda: agg.store.bundles_of("dgx01"))
            [row] = agg.store.bundles_of("dgx01")
            agent.answer = (200, b"not a tarball at all")  # a later bundle the aggregator refuses
            assert await bundles.fetch(agg.evidence, agg.context(), "dgx01", 777) is None
            r = await s.post(f"{url}/api/v1/nodes/dgx02/silence", headers={"Authorization": f"Bearer {ADMIN}"},
                             json={"check": "nfs_mount", "duration": "2h", "reason": "NFS server maintenance",
                                   "who": "ana"})
            assert r.status == 200
            async with api.async_playwright() as pw:
                browser = await pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
                try:
                    await walk(api, browser, url, agg, fencer, row, tmp_path)
                finally:
                    await browser.close()
    finally:
        await runner.cleanup()


async def walk(api: Any, browser: Any, url: str, agg: Any, fencer: MemFencer, row: dict[str, Any],
               tmp_path: Path) -> None:
    expect = api.expect
    ctx = await browser.new_context(viewport={"width": 1400, "height": 900}, accept_downloads=True)
    page = await ctx.new_page()
    page.set_default_timeout(20_000)
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    await page.goto(f"{url}/ui/node/dgx02")
    await expect(page.locator("#facts")).to_contain_text("silenced nfs_mount")
    await expect(page.locator("#facts")).to_contain_text("NFS server maintenance")
    await page.goto(f"{url}/ui/node/dgx01")
    await expect(page.locator("#bundles")).to_contain_text("Enter the admin token")
    assert row["sha256"] not in await page.locator("#bundles").inner_text()
    await page.fill("#token-input", ADMIN)
    await page.click("#token-set")
    await expect(page.locator("#bundles")).to_contain_text(row["sha256"])
    # the refused one is listed with its reason, and nothing to download
    await expect(page.locator("#bundles tr.bundle-refused")).to_contain_text("not stored: refused: not a tar.gz")
    assert await page.locator("#bundles tr.bundle-refused button").count() == 0
    async with page.expect_download() as got:
        await page.click("#bundles button.bundle-get")
    download = await got.value
    saved = tmp_path / "from-browser.tar.gz"
    await download.save_as(saved)
    assert saved.read_bytes() == Path(row["path"]).read_bytes()
    await page.screenshot(path=str(tmp_path / "ui-node-bundles.png"), full_page=True)
    # Mark healthy: the dialog asks for a reason; podhealth's fence is released
    await expect(page.locator("#btn-mark-healthy")).to_be_enabled()
    await page.click("#btn-mark-healthy")
    await page.fill("#dlg-reason", "field diag passed after the GPU swap")
    await page.click("#dlg-ok")
    await expect(page.locator("#message")).to_contain_text("mark-healthy")
    await until(lambda: agg.mem.nodes["dgx01"].fence is FenceMode.NONE)
    assert "dgx01" not in fencer.fenced and agg.mem.nodes["dgx01"].released_at > 0
    assert not errors, errors
