"""The `tls:` sections (core/config_tls.py) and their wiring: bad TLS files are config errors
naming file, line and key; a node's TLS reaches every push; SIGHUP never ends a process."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from podhealth import config
from podhealth.agent.wiring import build_sinks
from podhealth.tls import Watch
from tests.harness.tlsca import CA

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    ca = CA(tmp_path_factory.mktemp("pki"))
    return {"ca": ca, "node": ca.issue("dgx01", client=True), "other": ca.issue("dgx02", client=True)}


def error_of(tmp_path: Path, text: str) -> str:
    p = tmp_path / "podhealth.yaml"
    p.write_text(text)
    with pytest.raises(config.ConfigError) as e:
        config.load(p)
    return str(e.value)


@pytest.mark.parametrize("text,where,why", [
    ("tls:\n  ca: relative.pem\n", "podhealth.yaml:2: tls.ca", "absolute path"),
    ("tls:\n  ca: /nonexistent/ca.pem\n", "podhealth.yaml:2: tls.ca", "no such file"),
    ("tls:\n  cert: {node}\n", "tls.key", "set both or neither"),
    ("tls:\n  cert: {node}\n  key: {other_key}\n", "podhealth.yaml:3: tls.key", "does not go with"),
    ("tls:\n  ca: {node_key}\n", "podhealth.yaml:2: tls.ca", "not a PEM CA bundle"),
    ("aggregator:\n  tls:\n    cert: {node}\n    key: {node_key}\n    client_certs: ingest\n",
     "podhealth.yaml:5: aggregator.tls.client_certs", "needs ca"),
    ("aggregator:\n  tls:\n    client_certs: sometimes\n", "podhealth.yaml:3: aggregator.tls.client_certs", "one of"),
    ("tls:\n  serve: true\n", "podhealth.yaml:2: tls.serve", "needs this node's certificate"),
    ("tls:\n  cert: {node}\n  key: {node_key}\n  client_certs: required\n", "podhealth.yaml:4: tls.client_certs",
     "set serve: true"),
    ("tls:\n  cert: {node}\n  key: {node_key}\n  serve: true\n  client_certs: required\n",
     "podhealth.yaml:5: tls.client_certs", "needs ca"),
    ("tls:\n  client_certs: ingest\n", "podhealth.yaml:2: tls.client_certs", "one of"),
])
def test_bad_tls_files_name_file_line_and_key(tmp_path: Path, pki: dict[str, Any], text: str, where: str,
                                              why: str) -> None:
    text = text.format(node=pki["node"].cert, node_key=pki["node"].key, other_key=pki["other"].key)
    msg = error_of(tmp_path, text)
    assert where in msg and why in msg, msg


def test_the_nodes_tls_reaches_every_push_and_is_re_read(tmp_path: Path, pki: dict[str, Any]) -> None:
    p = tmp_path / "podhealth.yaml"
    p.write_text(f"publish: {{aggregator_url: 'https://agg.example:9420', spool_dir: {tmp_path / 'spool'}}}\n"
                 f"tls: {{ca: {pki['ca'].cert}, cert: {pki['node'].cert}, key: {pki['node'].key}}}\n")
    cfg = config.load(p)
    sinks = {s.name: s for s in build_sinks(cfg, "dgx01", report=lambda: None, specs=dict)}
    ctx = sinks["publisher"].tls  # type: ignore[attr-defined]
    assert ctx is not None and ctx is sinks["heartbeat"].tls  # type: ignore[attr-defined]
    assert ctx.verify_mode.name == "CERT_REQUIRED" and ctx.check_hostname
    assert "tls" in sinks  # the TLS files' watch runs with the agent
    plain = config.loads(f"publish: {{aggregator_url: 'http://127.0.0.1:9420', spool_dir: {tmp_path / 's2'}}}\n")
    assert "tls" not in {s.name for s in build_sinks(plain, "dgx01", report=lambda: None, specs=dict)}


async def test_sighup_never_ends_a_process_without_tls_files() -> None:
    """`systemctl kill -s HUP` on an aggregator without TLS: its default action would end it (and
    this test process with it, were the handler missing)."""
    watch = Watch([])
    got = asyncio.Event()
    reload_now = watch.reload_now

    def seen() -> None:
        reload_now()
        got.set()
    watch.reload_now = seen  # type: ignore[method-assign]  # what start() registers, observed
    watch.start()
    try:
        os.kill(os.getpid(), signal.SIGHUP)
        await asyncio.wait_for(got.wait(), 10)
    finally:
        await watch.stop()
