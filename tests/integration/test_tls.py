"""TLS between agents, the CLI and the aggregator (issue 27 §3), with a CA made at run time.

The real aggregator (Aggregator.open + serve.start_http, as `podhealth aggregator` runs it) serves
HTTPS; the real Publisher pushes to it; the real `podhealth fleet` asks it. Each side proves
itself: a client that cannot verify the server sends nothing (its token included), and with
`client_certs` the aggregator takes a node's push only over a connection whose verified client
certificate names that node. Certificates rotate without a restart (file change, SIGHUP)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import signal
import socket
import sqlite3
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, AsyncIterator

import pytest

from podhealth.agent.publisher import Publisher
from podhealth.aggregator.serve import http_limits, start_http
from podhealth.aggregator.service import Aggregator
from podhealth.config import PublishConfig
from podhealth.config_aggregator import AggAuthConfig, AggregatorConfig
from podhealth.config_tls import AgentTlsConfig, ServerTlsConfig
from podhealth.tls import ClientTls, client_context
from tests.harness.agg import MemFencer, config
from tests.harness.proc import free_port
from tests.harness.tlsca import CA, Issued
from tests.unit.test_publisher import until, xid

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]
AUTH = AggAuthConfig(node_tokens={"dgx01": "tok-dgx01-0123456789", "dgx02": "tok-dgx02-0123456789"},
                     admin_token="admin-token-0123456789")


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("pki")
    ca, rogue = CA(root / "site"), CA(root / "rogue", "someone else's CA")
    return {"ca": ca, "server": ca.issue("aggregator", server=True), "dgx01": ca.issue("dgx01", client=True),
            "dgx02": ca.issue("dgx02", client=True), "rogue": rogue,
            "rogue_server": rogue.issue("aggregator", server=True)}


def agg_config(tmp_path: Path, server: Issued, ca: CA, client_certs: str = "ingest") -> AggregatorConfig:
    tls = ServerTlsConfig(cert=str(server.cert), key=str(server.key), ca=str(ca.cert),
                          client_certs=client_certs)  # type: ignore[arg-type]
    assert tls.validate() is None
    return config(tmp_path, auth=AUTH, tls=tls)


@contextlib.asynccontextmanager
async def serving(cfg: AggregatorConfig, watch_interval: float = 30.0) -> AsyncIterator[tuple[Aggregator, str]]:
    port = free_port()
    cfg = dataclasses.replace(cfg, listen=dataclasses.replace(cfg.listen, address="127.0.0.1", port=port))
    agg = await Aggregator.open(cfg, fencers=[MemFencer()])
    agg.tls_watch.interval = watch_interval
    try:
        runner = await start_http(agg, http_limits(cfg))
        try:
            yield agg, f"https://127.0.0.1:{port}"
        finally:
            await runner.cleanup()
    finally:
        await agg.stop()


def pcfg(tmp_path: Path, url: str, node: str, stem: str) -> PublishConfig:
    return PublishConfig(aggregator_url=url, token=AUTH.node_tokens[node], spool_dir=tmp_path / stem, timeout=2.0)


def event_ids(db: Path) -> set[str]:
    with sqlite3.connect(db) as c:
        return {r[0] for r in c.execute("SELECT id FROM events")}


def post(url: str, body: Any, token: str, ctx: ssl.SSLContext) -> tuple[int, str]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json", "Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(req, timeout=10, context=ctx) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def batch(node: str, eid: str) -> dict[str, Any]:
    return {"node": node, "events": [{"id": eid, "type": "event", "time": 1.0, "event": {"kind": "xid", "code": 13}}]}


def fleet(url: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "podhealth", "fleet", "--url", url, "status"],
                          capture_output=True, text=True, timeout=60,
                          env={**{k: v for k, v in os.environ.items() if not k.startswith("PODHEALTH_")}, **env})


async def test_agent_and_cli_verify_the_aggregator_and_it_verifies_the_agent(tmp_path: Path, pki: dict[str, Any]) -> None:
    ca: CA = pki["ca"]
    async with serving(agg_config(tmp_path, pki["server"], ca)) as (agg, url):
        db = tmp_path / "agg.db"
        # A node with the site CA and its own client certificate: delivered over TLS.
        good = ClientTls(AgentTlsConfig(ca=str(ca.cert), cert=str(pki["dgx01"].cert), key=str(pki["dgx01"].key)))
        pub = Publisher(pcfg(tmp_path, url, "dgx01", "good"), "dgx01", max_backoff=0.2, tls=good.context)
        await pub.start()
        try:
            pub.publish_event(xid(1, code=13))
            await until(lambda: "ev00001" in event_ids(db))
        finally:
            await pub.stop(drain=0)

        # A node that trusts another CA refuses this aggregator: the handshake fails, nothing is sent.
        rogue = ClientTls(AgentTlsConfig(ca=str(pki["rogue"].cert), cert=str(pki["dgx01"].cert),
                                         key=str(pki["dgx01"].key)))
        pub = Publisher(pcfg(tmp_path, url, "dgx01", "rogue"), "dgx01", max_backoff=0.2, tls=rogue.context)
        await pub.start()
        try:
            pub.publish_event(xid(2, code=13))
            await until(lambda: pub.stats.send_failures >= 2)
            assert "ev00002" not in event_ids(db) and not pub.connected
        finally:
            await pub.stop(drain=0)

        # The aggregator refuses a push without a client certificate, and one whose certificate
        # names another node (its token is dgx01's: the certificate must agree).
        plain = client_context(str(ca.cert))
        st, text = await asyncio.to_thread(post, f"{url}/v1/events", batch("dgx01", "nocert"),
                                           AUTH.node_tokens["dgx01"], plain)
        assert st == 401 and "client certificate" in text
        other = client_context(str(ca.cert), str(pki["dgx02"].cert), str(pki["dgx02"].key))
        st, text = await asyncio.to_thread(post, f"{url}/v1/events", batch("dgx01", "wrongcert"),
                                           AUTH.node_tokens["dgx01"], other)
        assert st == 403 and "dgx02" in text
        assert not {"nocert", "wrongcert"} & event_ids(db)

        # The CLI: verified against the site CA it answers; against another CA it refuses (exit 2).
        ok = await asyncio.to_thread(fleet, url, {"PODHEALTH_TLS_CA": str(ca.cert)})
        assert ok.returncode == 0, ok.stderr
        bad = await asyncio.to_thread(fleet, url, {"PODHEALTH_TLS_CA": str(pki["rogue"].cert)})
        assert bad.returncode == 2 and "certificate verify failed" in bad.stderr, bad.stderr
        system = await asyncio.to_thread(fleet, url, {})  # the system's trust store does not know the site CA
        assert system.returncode == 2 and "certificate verify failed" in system.stderr, system.stderr


async def test_required_client_certificates_fail_the_handshake_without_one(tmp_path: Path,
                                                                           pki: dict[str, Any]) -> None:
    ca: CA = pki["ca"]
    async with serving(agg_config(tmp_path, pki["server"], ca, client_certs="required")) as (_, url):
        with_cert = client_context(str(ca.cert), str(pki["dgx01"].cert), str(pki["dgx01"].key))
        st, _ = await asyncio.to_thread(post, f"{url}/v1/events", batch("dgx01", "withcert"),
                                        AUTH.node_tokens["dgx01"], with_cert)
        assert st == 200
        with pytest.raises((urllib.error.URLError, ssl.SSLError, ConnectionError)):
            await asyncio.to_thread(post, f"{url}/v1/events", batch("dgx01", "nocert"), AUTH.node_tokens["dgx01"],
                                    client_context(str(ca.cert)))


def served_serial(port: int, ca: Path) -> int:
    ctx = client_context(str(ca))
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, \
            ctx.wrap_socket(raw, server_hostname="127.0.0.1") as s:
        return int(s.getpeercert()["serialNumber"], 16)


async def test_the_server_certificate_rotates_on_file_change_and_on_sighup(tmp_path: Path,
                                                                          pki: dict[str, Any]) -> None:
    ca: CA = pki["ca"]
    live = tmp_path / "live"
    live.mkdir()
    first = ca.issue("aggregator", server=True, stem="first")
    second = ca.issue("aggregator", server=True, stem="second")
    crt, key = live / "server.crt", live / "server.key"

    def install(it: Issued) -> None:
        # As a rotation tool does: each file replaced whole (rename), key first.
        for src, dst in ((it.key, key), (it.cert, crt)):
            tmp = dst.with_suffix(".new")
            tmp.write_bytes(src.read_bytes())
            os.replace(tmp, dst)
    install(first)
    cfg = agg_config(tmp_path, Issued(crt, key), ca, client_certs="off")
    async with serving(cfg, watch_interval=0.05) as (agg, url):
        port = int(url.rsplit(":", 1)[1])
        serial = lambda: served_serial(port, ca.cert)  # noqa: E731
        one = await asyncio.to_thread(serial)
        install(second)
        assert agg.tls is not None
        await until(lambda: agg.tls.reloads >= 1, timeout=60)  # type: ignore[union-attr]
        two = await asyncio.to_thread(serial)
        assert two != one  # the next connection gets the new certificate, no restart

        # A half-copied certificate is refused: the old one goes on being served.
        crt.write_text("-----BEGIN CERTIFICATE-----\nnot base64\n")
        os.kill(os.getpid(), signal.SIGHUP)  # an operator's `systemctl reload`
        await until(lambda: agg.tls.refused >= 1, timeout=60)  # type: ignore[union-attr]
        assert await asyncio.to_thread(serial) == two

        install(first)
        before = agg.tls.reloads  # type: ignore[union-attr]
        os.kill(os.getpid(), signal.SIGHUP)
        await until(lambda: agg.tls.reloads > before, timeout=60)  # type: ignore[union-attr]
        assert await asyncio.to_thread(serial) == one


async def test_a_nodes_client_certificate_rotates_in_the_context_its_pushes_use(tmp_path: Path,
                                                                               pki: dict[str, Any]) -> None:
    ca: CA = pki["ca"]
    live = tmp_path / "node"
    live.mkdir()
    crt, key = live / "node.crt", live / "node.key"
    crt.write_bytes(pki["dgx01"].cert.read_bytes())
    key.write_bytes(pki["dgx01"].key.read_bytes())
    node_tls = ClientTls(AgentTlsConfig(ca=str(ca.cert), cert=str(crt), key=str(key)))
    ctx = node_tls.context  # what the publisher's session holds: the same object throughout
    async with serving(agg_config(tmp_path, pki["server"], ca)) as (_, url):
        token = AUTH.node_tokens["dgx01"]
        assert (await asyncio.to_thread(post, f"{url}/v1/events", batch("dgx01", "a"), token, ctx))[0] == 200
        # The node's files now hold dgx02's certificate (a mix-up a rotation could make): once
        # re-read, the same context presents it, and the aggregator refuses it for dgx01.
        for src, dst in ((pki["dgx02"].key, key), (pki["dgx02"].cert, crt)):
            new = dst.with_suffix(".new")
            new.write_bytes(src.read_bytes())
            os.replace(new, dst)
        assert node_tls.check() and node_tls.context is ctx
        st, text = await asyncio.to_thread(post, f"{url}/v1/events", batch("dgx01", "b"), token, ctx)
        assert st == 403 and "dgx02" in text
