"""The web UI in headless Chromium (Playwright, system Chromium) against a real aggregator.

The aggregator runs as `podhealth aggregator --config` on a free loopback port, with SQLite in
tmp_path and its Slurm fencer pointed at a loopback Slurm cluster (tests/harness/slurm.py). The
fleet is fed two ways:

- `test_ui_with_simulated_agents`: real `podhealth agent --simulate dgx-h100` processes, pulled by
  the aggregator; the fault is `podhealth simulate inject dgx02 xid=79 gpu=3`. Skips (saying so)
  while the agent does not serve /health.
- `test_ui_with_pushed_reports`: reports POSTed to /v1/reports as an agent pushes them, so the UI's
  whole path (live tiles, node page, release into Slurm) is checked even without agents.

Screenshots land in test-artifacts/ (ui-*.png). Along the walk: the fleet history chart, the
fenced tile's contrast (WCAG AA, from the computed colours), the node's timeline with its fence and
XID marks, the release dialog's warning for a node that still reports FAIL, and no raw Unix time
anywhere in the visible text.
"""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from podhealth.credentials import derive_agent_token, derive_node_token
from tests.harness.agg import post
from tests.harness.proc import Service, free_port, http_get, need, service, wait_until
from tests.harness.slurm import SlurmCluster, slurm_fixture

pytestmark = pytest.mark.timeout(240)

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic"]
ADMIN = "ui-test-admin-token"
SECRET = "ui-browser-cluster-secret-0123456789"


def tok(node: str) -> str:
    return derive_node_token(SECRET, node)
NODES = ("dgx01", "dgx02", "dgx03", "dgx04")
RED = "rgb(248, 81, 73)"  # --fail in podhealth.css
# A Unix time in seconds, as a raw number would show. Not inside a word: the evidence bundle's
# sha256 in the audit log is hex and holds a run of ten decimal digits now and then.
EPOCH = re.compile(r"(?<![\w.])\d{10}(?![\w])")
# The WCAG 2.x contrast ratio of the element's text colour against each of its background's two
# stripe colours (the CSS variables the gradient is made of), all read from getComputedStyle.
CONTRAST_JS = """([el, vars]) => {
  const probe = document.createElement('span');
  document.body.append(probe);
  const rgb = (css) => { probe.style.color = css; const m = getComputedStyle(probe).color.match(/\\d+(\\.\\d+)?/g);
    return m.slice(0, 3).map(Number); };
  const lum = ([r, g, b]) => [r, g, b].map((v) => { v /= 255; return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4; })
    .reduce((a, v, i) => a + v * [0.2126, 0.7152, 0.0722][i], 0);
  const root = getComputedStyle(document.documentElement);
  const fg = lum(rgb(getComputedStyle(el).color));
  const out = vars.map((v) => { const bg = lum(rgb(root.getPropertyValue(v).trim()));
    return (Math.max(fg, bg) + 0.05) / (Math.min(fg, bg) + 0.05); });
  probe.remove();
  return out;
}"""
MIN_DURATION = 3.0  # seconds a FAIL stays red before the policy fences, so the test can see both

slurm = slurm_fixture(scope="module", nodes=4)


# ---- processes ---------------------------------------------------------------------------------


def podhealth(*args: str) -> list[str]:
    return [sys.executable, "-m", "podhealth", *args]


def aggregator_yaml(tmp_path: Path, port: int, cluster: SlurmCluster | None, agent_urls: dict[str, str],
                    nodes: dict[str, str] | None = None, ui: dict[str, Any] | None = None) -> Path:
    """Config for the aggregator: `nodes` maps name -> partition (default NODES in "gpu")."""
    nodes = nodes if nodes is not None else dict.fromkeys(NODES, "gpu")
    fencers = ({"slurm": {"enabled": True, "slurm_conf": str(cluster.conf), "timeout": 5.0}} if cluster is not None
               else {"dryrun": {"enabled": True}})
    cfg = {"aggregator": {
        "listen": {"address": "127.0.0.1", "port": port},
        "db": str(tmp_path / "aggregator.db"),
        # agents are pulled, but ingest must be closed before a fencer may run (issue 14)
        # ingest must be closed before a fencer may run: each node posts with its own token (tok())
        "auth": {"admin_token": ADMIN, "cluster_secret": SECRET},
        "pull_interval": 1.0, "pull_timeout": 2.0, "decide_interval": 0.2, "unreachable_after": 120.0,
        "healthy_for": 3600.0,  # no automatic handover during the test: the release is the operator's
        # a fleet sample at every housekeeping pass (5 s), not every 5 min
        "ui": {"history_interval": 1.0, **(ui or {})},
        "rules": [
            {"check": "*", "actions": ["RESET_GPU", "DRAIN", "REBOOT", "REPLACE"], "min_severity": "critical",
             "do": "fence", "min_duration": MIN_DURATION},
            {"check": "*", "min_severity": "warning", "do": "notify"},
        ],
        "nodes": [{"name": n, "partition": part, **({"agent_url": agent_urls[n]} if n in agent_urls else {})}
                  for n, part in nodes.items()],
        "fencers": fencers,
    }}
    path = tmp_path / "aggregator.yaml"
    path.write_text(json.dumps(cfg, indent=1))  # JSON is YAML
    return path


def start_aggregator(tmp_path: Path, cluster: SlurmCluster | None, agent_urls: dict[str, str], port: int = 0,
                     nodes: dict[str, str] | None = None, ui: dict[str, Any] | None = None) -> Any:
    port = port or free_port()
    cfg = aggregator_yaml(tmp_path, port, cluster, agent_urls, nodes, ui)
    url = f"http://127.0.0.1:{port}"
    return service("aggregator", podhealth("aggregator", "--config", str(cfg)), tmp_path / "logs", port=port,
                   ready=answers(url + "/healthz"), ready_timeout=40,
                   env=cluster.env if cluster is not None else None)


def answers(url: str) -> Callable[[], bool]:
    return lambda: http_get(url)[0] == 200


def slurm_state(cluster: SlurmCluster, node: str) -> tuple[str, str]:
    out = cluster.run("scontrol", "show", "node", "-o", node, timeout=10).stdout
    state = re.search(r"\bState=(\S+)", out)
    reason = re.search(r"\bReason=(.*?)(?: \[|$)", out)
    return (state.group(1) if state else "", reason.group(1) if reason else "")


# ---- the browser ----------------------------------------------------------------------------------


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


def new_page(browser: Any) -> Any:
    ctx = browser.new_context(viewport={"width": 1400, "height": 900})
    page = ctx.new_page()
    page.set_default_timeout(20_000)
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.js_errors = errors
    return page


# ---- what an agent's report looks like (for the pushed-report test) --------------------------------


def agent_report(node: str, t: float, xid_gpu: int | None = None) -> dict[str, Any]:
    results: list[dict[str, Any]] = []

    def r(check: str, entity: str, status: str = "OK", action: str = "NONE", summary: str = "",
          **evidence: str) -> None:
        results.append({"check": check, "entity": entity, "status": status, "action": action, "since": t - 2,
                        "summary": summary, "evidence": evidence})

    for g in range(8):
        r("gpu_lost", f"gpu{g}")
        r("gpu_thermal", f"gpu{g}", temperature_c=str(38 + g))
        r("gpu_ecc", f"gpu{g}")
        r("nvlink", f"gpu{g}", links_up="18")
        if g == xid_gpu:
            r("xid", f"gpu{g}", "FAIL", "RESET_GPU", "XID 79: GPU has fallen off the bus", xid="79",
              pci_bus_id=f"0000:{0x18 + g:02x}:00.0", count="1")
        else:
            r("xid", f"gpu{g}")
    for n in range(4):
        r("sxid", f"nvswitch{n}")
    for h in range(8):
        r("ib_port", f"mlx5_{h}/1", state="ACTIVE", rate="400 Gb/sec (4X NDR)")
    for m in ("/home", "/datasets"):
        r("nfs_mount", m)
    r("gpu_count", "node", expected="8", found="8")
    return {"node": node, "agent_version": "0.1.0", "profile": "dgx-h100", "time": t, "results": results}


def xid_event(t: float, gpu: int) -> dict[str, Any]:
    bus = f"0000:{0x18 + gpu:02x}:00.0"
    text = f"NVRM: Xid (PCI:{bus}): 79, pid=2211, name=python3, GPU has fallen off the bus."
    eid = f"dgx02-xid-{t:.6f}"
    return {"id": eid, "type": "event", "time": t, "event": {
        "kind": "xid", "code": 79, "time": t, "text": text, "pci_bus_id": bus, "gpu": gpu, "pid": 2211,
        "process": "python3", "device": "", "subcode": None, "source": "kmsg", "id": eid}}


# ---- the shared walk through the UI ------------------------------------------------------------------


def walk(browser: Any, agg: Service, cluster: SlurmCluster, artifacts: Path, prefix: str,
         inject: Callable[[], None]) -> None:
    from playwright.sync_api import expect

    page = new_page(browser)
    page.goto(agg.url + "/")  # the root redirects to the fleet page
    assert page.url.endswith("/ui")
    tiles = page.locator("a.tile")
    expect(tiles).to_have_count(len(NODES))
    for n in NODES:
        expect(page.locator(f'a.tile[data-node="{n}"]')).not_to_have_attribute("data-state", "UNKNOWN")
    expect(page.locator("#conn")).to_have_class(re.compile(r"\blive\b"))
    expect(page.locator("#budget-used")).to_have_text("0 of 10")
    chart = page.locator("#fleet-history svg.fleetchart")
    expect(chart).to_be_visible()
    expect(chart.locator('path.area[data-state="OK"]')).to_have_count(1)
    no_raw_epoch(page)
    page.screenshot(path=str(artifacts / f"{prefix}fleet.png"), full_page=True)
    page.evaluate("window.__sameDocument = 1")  # gone if the page reloads

    inject()
    tile = page.locator('a.tile[data-node="dgx02"]')
    expect(tile).to_have_attribute("data-state", "FAIL", timeout=20_000)
    assert tile.evaluate("a => getComputedStyle(a).backgroundColor") == RED
    assert re.search(r"xid gpu3", tile.get_attribute("title") or "")
    assert page.evaluate("window.__sameDocument") == 1, "the page reloaded"
    page.select_option("#f-state", "FAIL")  # the state filter leaves only the failing node
    expect(page.locator("a.tile:visible")).to_have_count(1)
    page.select_option("#f-state", "")
    page.fill("#f-check", "xid gpu3")
    expect(page.locator("a.tile:visible")).to_have_count(1)
    page.screenshot(path=str(artifacts / f"{prefix}fleet-fail.png"), full_page=True)
    page.fill("#f-check", "")

    # After MIN_DURATION the policy fences it: hatched tile, budget 1 of 10, drained in Slurm.
    expect(tile).to_have_attribute("data-state", "fenced", timeout=30_000)
    expect(page.locator("#budget-used")).to_have_text("1 of 10")
    wait_until(lambda: "DRAIN" in slurm_state(cluster, "dgx02")[0], timeout=20, what="dgx02 drained in Slurm")
    reason = slurm_state(cluster, "dgx02")[1]
    assert reason.startswith("podhealth: xid gpu3"), reason
    assert page.evaluate("window.__sameDocument") == 1, "the page reloaded"
    ratios = page.evaluate(CONTRAST_JS, [tile.element_handle(), ["--fenced-stripe", "--fenced-bg"]])
    assert min(ratios) >= 4.5, f"fenced tile name contrast {ratios} (WCAG AA needs 4.5:1 on both stripes)"
    expect(chart.locator('path.area[data-state="fenced"]')).to_have_count(1)  # the chart follows the fence
    no_raw_epoch(page)
    page.screenshot(path=str(artifacts / f"{prefix}fleet-fenced.png"), full_page=True)
    tile.screenshot(path=str(artifacts / f"{prefix}tile-fenced.png"))

    tile.click()
    page.wait_for_url(re.compile(r"/ui/node/dgx02$"))
    finding = page.locator('tr.finding[data-check="xid"][data-entity="gpu3"]')
    expect(finding).to_contain_text("FAIL")
    expect(page.locator('section.results[data-group="GPUs"]')).to_be_visible()
    expect(page.locator("#state")).to_have_text("fenced")
    expect(page.locator("#btn-release")).to_be_hidden()  # read-only without the token
    expect(page.locator("#audit")).to_contain_text("fence")
    expect(page.locator("#events")).to_contain_text("79")  # the XID itself, from the event feed
    expect(page.locator("#events")).to_contain_text("gpu3")
    timeline = page.locator("#timeline svg.timeline")
    expect(timeline.locator('[data-kind="fence"]')).not_to_have_count(0)  # the fence mark
    expect(timeline.locator('[data-kind="xid"]')).not_to_have_count(0)  # the XID 79 diamond
    expect(timeline.locator('[data-kind="xid"] text')).to_contain_text(["79"])
    assert "gpu3" in (timeline.locator('[data-kind="xid"] title').first.text_content() or "")
    no_raw_epoch(page)
    when = page.locator("#audit time.ts").first  # relative on the page, ISO UTC on hover
    assert re.fullmatch(r"just now|\d+ s ago|\d+ min ago", when.inner_text()), when.inner_text()
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ \(UTC\)", when.get_attribute("title") or "")
    page.screenshot(path=str(artifacts / f"{prefix}node.png"), full_page=True)
    timeline.screenshot(path=str(artifacts / f"{prefix}timeline.png"))

    page.fill("#token-input", ADMIN)
    page.click("#token-set")
    release = page.locator("#btn-release")
    expect(release).to_be_enabled()
    expect(page.locator("#btn-fence")).to_be_disabled()  # already fenced
    release.click()
    expect(page.locator("#dlg")).to_be_visible()
    warn = page.locator("#dlg-warn")  # the agent still says FAIL: the dialog says so, naming the check
    expect(warn).to_be_visible()
    expect(warn).to_contain_text("dgx02 still reports FAIL")
    expect(warn).to_contain_text("xid gpu3")
    page.screenshot(path=str(artifacts / f"{prefix}release-dialog.png"))
    page.click("#dlg-ok")  # the reason is required: the browser refuses the empty form
    expect(page.locator("#dlg")).to_be_visible()
    page.fill("#dlg-reason", "GPU3 reseated, field diag passed")
    page.fill("#dlg-who", "ui-test")
    page.click("#dlg-ok")
    expect(page.locator("#message")).to_contain_text("release: done", timeout=30_000)
    wait_until(lambda: "DRAIN" not in slurm_state(cluster, "dgx02")[0], timeout=20, what="dgx02 resumed in Slurm")
    assert slurm_state(cluster, "dgx02")[0].startswith("IDLE")
    expect(page.locator("#audit")).to_contain_text("GPU3 reseated, field diag passed")
    expect(page.locator("#audit")).to_contain_text("operator:ui-test")
    page.screenshot(path=str(artifacts / f"{prefix}node-released.png"), full_page=True)
    assert page.js_errors == [], page.js_errors


def no_raw_epoch(page: Any) -> None:
    text = page.locator("body").inner_text()
    m = EPOCH.search(text)
    assert not m, f"a raw Unix time on the page: ...{text[max(0, m.start() - 300):m.end() + 80]!r}"


# ---- the tests -------------------------------------------------------------------------------------


def test_ui_with_pushed_reports(tmp_path: Path, slurm: SlurmCluster, browser: Any, artifacts: Path) -> None:
    with start_aggregator(tmp_path, slurm, {}) as agg:
        t0 = time.time()
        for n in NODES:
            assert post(agg.url + "/v1/reports", agent_report(n, t0), tok(n))[0] == 200

        def inject() -> None:
            # What the agent sends when the kernel logs XID 79: the event, then its new verdicts.
            t = time.time()
            status, body = post(agg.url + "/v1/events", {"node": "dgx02", "events": [xid_event(t, gpu=3)]}, tok("dgx02"))
            assert status == 200 and body["applied"] == 1, body
            status, body = post(agg.url + "/v1/reports", agent_report("dgx02", t, xid_gpu=3), tok("dgx02"))
            assert status == 200 and body["applied"] == 1, body

        walk(browser, agg, slurm, artifacts, "ui-", inject)


def test_ui_with_simulated_agents(tmp_path: Path, slurm: SlurmCluster, browser: Any, artifacts: Path) -> None:
    sim = tmp_path / "sim"
    agg_port = free_port()
    urls: dict[str, str] = {}
    with contextlib.ExitStack() as stack:
        for n in NODES:
            port = free_port()
            url = f"http://127.0.0.1:{port}"
            agent_cfg = tmp_path / f"agent-{n}.yaml"  # the agent pushes its XID events to the aggregator
            agent_cfg.write_text(json.dumps({"publish": {"aggregator_url": f"http://127.0.0.1:{agg_port}",
                                                         "token": tok(n), "spool_dir": str(tmp_path / f"spool-{n}")},
                                             # its agent key, derived as the aggregator derives it: it proves its answers
                                             "auth": {"token": derive_agent_token(SECRET, n)}}))
            stack.enter_context(service(
                f"agent-{n}", podhealth("agent", "--config", str(agent_cfg), "--simulate", "dgx-h100", "--node", n,
                                        "--sim-root", str(sim), "--listen", f"127.0.0.1:{port}"),
                tmp_path / "logs", port=port, ready=answers(url + "/healthz"), ready_timeout=90))
            urls[n] = url
        if http_get(urls["dgx01"] + "/health")[0] == 404:
            pytest.skip("the agent does not serve /health yet (agent.health.install is not wired into the agent)")
        agg = stack.enter_context(start_aggregator(tmp_path, slurm, urls, port=agg_port))

        def inject() -> None:
            subprocess.run(podhealth("simulate", "inject", "dgx02", "xid=79", "gpu=3", "--root", str(sim)),
                           check=True, timeout=30, capture_output=True)

        walk(browser, agg, slurm, artifacts, "ui-agents-", inject)


def test_fleet_page_with_hundreds_of_nodes(tmp_path: Path, browser: Any, artifacts: Path) -> None:
    """512 nodes in 4 partitions: compact tiles, names on hover, filters still find the few bad ones."""
    from playwright.sync_api import expect

    names = {f"gb{i:03d}": f"pool-{'abcd'[i % 4]}" for i in range(1, 513)}
    failing = {f"gb{i:03d}" for i in range(7, 513, 50)}
    with start_aggregator(tmp_path, None, {}, nodes=names) as agg:
        t = time.time()
        for n in names:
            assert post(agg.url + "/v1/reports", agent_report(n, t, xid_gpu=5 if n in failing else None), tok(n))[0] == 200
        page = new_page(browser)
        page.goto(agg.url + "/ui")
        expect(page.locator("a.tile")).to_have_count(len(names))
        expect(page.locator("section.group")).to_have_count(4)
        expect(page.locator(".grid.compact").first).to_be_visible()
        tile = page.locator('a.tile[data-node="gb007"]')
        assert tile.evaluate("a => getComputedStyle(a).fontSize") == "0px"  # names only on hover
        assert "gb007" in (tile.get_attribute("title") or "")
        page.fill("#f-check", "xid gpu5")
        expect(page.locator("a.tile:visible")).to_have_count(len(failing))
        page.fill("#f-check", "")
        page.screenshot(path=str(artifacts / "ui-fleet-512.png"), full_page=True)

        # A fleet-wide failure trips the breaker: the banner says so; an operator resets it from the page.
        expect(page.locator("#breaker")).to_be_hidden()
        storm = [n for n in names if n not in failing][:80]
        t = time.time()
        for n in storm:
            assert post(agg.url + "/v1/reports", agent_report(n, t, xid_gpu=1), tok(n))[0] == 200
        expect(page.locator("#breaker")).to_be_visible()
        expect(page.locator("#breaker-text")).to_contain_text("TRIPPED")
        expect(page.locator("#breaker-reset")).to_be_hidden()  # read-only without the token
        page.fill("#token-input", ADMIN)
        page.click("#token-set")
        page.screenshot(path=str(artifacts / "ui-fleet-512-breaker.png"), full_page=True)
        page.click("#breaker-reset")
        page.fill("#dlg-reason", "storage outage over, verified by on-call")
        page.click("#dlg-ok")
        expect(page.locator("#message")).to_contain_text("Breaker reset")
        expect(page.locator("#breaker")).to_be_hidden()
        assert page.js_errors == [], page.js_errors

        # Without the event stream (a proxy that buffers it) the page falls back to polling.
        polled = new_page(browser)
        polled.route("**/ui/events*", lambda route: route.abort())
        polled.goto(agg.url + "/ui?state=FAIL")
        expect(polled.locator("#conn")).to_have_class(re.compile(r"\bpolling\b"))
        expect(polled.locator("a.tile")).to_have_count(len(names))
        expect(polled.locator("#f-state")).to_have_value("FAIL")  # filters come from the URL
        assert polled.locator("a.tile:visible").count() == sum(
            1 for x in json.loads(http_get(agg.url + "/ui/api/fleet")[1])["nodes"] if x["state"] == "FAIL")


# An audit line as long as real ones: the scontrol command with podhealth's whole reason, and an
# output holding sha256 digests (bundles); the node page wraps them in a 1,400 px window.
LONG_COMMAND = ("scontrol", "update", "NodeName=dgx03", "State=DRAIN",
                "Reason=podhealth:xid/gpu5:RESET_GPU:XID_79_GPU_has_fallen_off_the_bus_" + "x" * 120 + "[2026-12-07T10:00:00Z]")
LONG_OUTPUT = "bundle sha256 " + "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08" * 3


def seed_a_day(db: Path, now: float) -> int:
    """A day of history in the store before the aggregator starts: fleet samples every 5 min (dgx03
    FAIL, then fenced from -9 h to -6 h; dgx02 WARN from -3 h to -2 h), and dgx03's verdicts, XID
    event and fence / release in the audit log. Returns the number of samples in the last 24 h."""
    from podhealth.aggregator.store import NodeRow, Store

    store = Store(db)
    ops = [Store.op_node_insert(NodeRow(name=n, partition="gpu", first_seen=now - 2 * 86400)) for n in NODES]
    n = 0
    for i in range(287, 0, -1):  # the last 24 h (a sample at exactly -24 h would fall out as the test runs)
        t = now - i * 300
        counts = {"OK": 4}
        if now - 9 * 3600 <= t < now - 8.9 * 3600:
            counts = {"OK": 3, "FAIL": 1}
        elif now - 8.9 * 3600 <= t < now - 6 * 3600:
            counts = {"OK": 3, "fenced": 1}
        elif now - 3 * 3600 <= t < now - 2 * 3600:
            counts = {"OK": 3, "WARN": 1}
        ops.append(Store.op_fleet_sample(t, counts))
        n += 1
    fail, fenced, released = now - 9 * 3600, now - 8.9 * 3600, now - 6 * 3600
    ops += [
        Store.op_verdict("dgx03", fail, "xid", "gpu5", "FAIL", "RESET_GPU", "agent", "XID 79: GPU has fallen off the bus"),
        Store.op_event("dgx03-xid-seeded", "dgx03", "event", fail - 1, fail - 1, json.dumps(xid_event(fail - 1, gpu=5))),
        Store.op_audit(fenced - 1, "dgx03", "policy", "fence requested", "xid gpu5 FAIL RESET_GPU"),
        Store.op_audit(fenced, "dgx03", "policy", "fence done", "xid gpu5 FAIL RESET_GPU", LONG_COMMAND, LONG_OUTPUT),
        Store.op_audit(fenced + 600, "dgx03", "ladder", "reset_gpu done", "xid gpu5 FAIL RESET_GPU"),
        Store.op_verdict("dgx03", released - 600, "xid", "gpu5", "OK", "NONE", "agent"),
        Store.op_audit(released, "dgx03", "operator:alice", "release done", "GPU5 reseated, diag passed"),
        Store.op_verdict("dgx03", now - 3 * 3600, "gpu_thermal", "gpu1", "WARN", "NONE", "agent", "91 C"),
        Store.op_verdict("dgx03", now - 2 * 3600, "gpu_thermal", "gpu1", "OK", "NONE", "agent"),
    ]
    store.apply(ops)
    store.close()
    return n


def test_history_charts_over_a_day(tmp_path: Path, browser: Any, artifacts: Path) -> None:
    """The fleet chart over a whole day and a node's timeline over hours, from a seeded store; the
    node's Grafana links (aggregator.ui.grafana_url)."""
    from playwright.sync_api import expect

    now = time.time()
    seeded = seed_a_day(tmp_path / "aggregator.db", now)
    grafana = "https://grafana.example.com/g"
    with start_aggregator(tmp_path, None, {}, ui={"grafana_url": grafana, "history_interval": 300.0}) as agg:
        for n in NODES:
            assert post(agg.url + "/v1/reports", agent_report(n, time.time()), tok(n))[0] == 200
        page = new_page(browser)
        page.goto(agg.url + "/ui")
        chart = page.locator("#fleet-history svg.fleetchart")
        expect(chart).to_be_visible()
        expect(page.locator("#history-span")).to_have_text("nodes by state, last 24 h")
        for state in ("OK", "FAIL", "fenced", "WARN"):
            expect(chart.locator(f'path.area[data-state="{state}"]')).to_have_count(1)
        expect(chart.locator('path.area[data-state="returning"]')).to_have_count(0)  # never in the day
        # one hover strip per sample: the seeded day, the one taken at start, and now
        expect(chart.locator("rect.hover-strip")).to_have_count(seeded + 2)
        no_raw_epoch(page)
        page.screenshot(path=str(artifacts / "ui-history-fleet.png"), full_page=True)
        chart.screenshot(path=str(artifacts / "ui-history-fleet-chart.png"))

        page.goto(agg.url + "/ui/node/dgx03")
        timeline = page.locator("#timeline svg.timeline")
        expect(timeline.locator('[data-kind="fence"]')).to_have_count(1)
        expect(timeline.locator('[data-kind="release"]')).to_have_count(1)
        expect(timeline.locator('[data-kind="reset_gpu"]')).to_have_count(1)  # the ladder's step
        expect(timeline.locator('[data-kind="xid"]')).to_have_count(1)
        expect(timeline.locator(".tl-label")).to_have_text(["verdict", "xid gpu5", "gpu_thermal gpu1", "fenced",
                                                            "XID / SXid"])
        link = page.locator('#links a[data-uid="podhealth-node"]')
        expect(link).to_have_attribute("href", f"{grafana}/d/podhealth-node?var-node=dgx03")
        expect(page.locator("#links a")).to_have_count(7)  # every board with a node variable
        no_raw_epoch(page)
        page.screenshot(path=str(artifacts / "ui-history-node.png"), full_page=True)
        expect(page.locator("#audit")).to_contain_text("NodeName=dgx03")
        # the long scontrol line and the digests wrap: nothing makes the page wider than the window
        assert page.evaluate("document.documentElement.scrollWidth") <= 1400
        timeline.screenshot(path=str(artifacts / "ui-history-timeline.png"))
        page.select_option("#timeline-span", "3600")  # the last hour: nothing happened, no marks
        expect(timeline.locator('[data-kind="fence"]')).to_have_count(0)
        expect(timeline.locator(".tl-label")).to_have_text(["verdict", "fenced", "XID / SXid"])
        assert page.js_errors == [], page.js_errors
