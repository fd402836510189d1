#!/usr/bin/env python3
"""What a new connection per heartbeat costs a server, with TLS and without (prints figures).

    python bench/tls_reconnect.py [--requests 3000] [--rounds 3] [--key rsa|ec]

bench/capacity.py measures the aggregator at the agents' behaviour on plain HTTP, where a new
connection costs the server an accept and a close. In production the agents push over HTTPS
(`tls:`), and then a new connection is also a TLS handshake, most of whose cost is the server's
(its certificate signature, the key exchange). This bench measures that part alone: the peer
server (bench/aiohttp_floor.py: aiohttp answering a lease, doing nothing else) takes the agents'
lease (~230 bytes) over plain HTTP and over HTTPS (a throw-away certificate from the openssl CLI,
RSA 2048 or EC P-256), each `--rounds` times in turns, over connections the client keeps (as
agents now do, agent/pushsession.py `session`) and over a new one per request (as they did).
Printed: the server's CPU per request (utime+stime from /proc) for each, min/median/max over
the rounds, and what a handshake per heartbeat would cost at 100,000 nodes every 30 s.
"""

from __future__ import annotations

import sys as _sys
from pathlib import Path as _Path

_sys.path.insert(0, str(_Path(__file__).resolve().parent))
import projectenv  # noqa: E402

projectenv.require()

import argparse  # noqa: E402
import asyncio  # noqa: E402
import os  # noqa: E402
import shutil  # noqa: E402
import signal  # noqa: E402
import ssl  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import aiohttp  # noqa: E402

from benchlib import REPO, ProcStats, free_ports, workdir  # noqa: E402

LEASE = (b'{"node":"dgx0001","time":1.0,"digest":"0123456789abcdef","agent_version":"0.1.0","profile":"dgx-h100",'
         b'"status":"OK","action":"NONE","staleness":{"nvml":0.2},"boot_id":"b","seq":1}')
HEARTBEATS_PER_S = 100_000 / 30


def make_cert(wd: Path, key: str) -> tuple[Path, Path]:
    openssl = shutil.which("openssl")
    if openssl is None:
        raise SystemExit("tls_reconnect.py needs the openssl CLI")
    cert, keyf = wd / "server.pem", wd / "server.key"
    kind = ["-newkey", "rsa:2048"] if key == "rsa" else ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256"]
    subprocess.run([openssl, "req", "-x509", *kind, "-nodes", "-keyout", str(keyf), "-out", str(cert), "-days", "1",
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True, timeout=60)
    return cert, keyf


class Server:
    """bench/aiohttp_floor.py in its own process, plain or HTTPS."""

    def __init__(self, tls: tuple[Path, Path] | None) -> None:
        self.port = free_ports(1)[0]
        self.tls = tls
        self.url = f"{'https' if tls else 'http'}://127.0.0.1:{self.port}"
        args = [str(self.port)] + ([str(tls[0]), str(tls[1])] if tls else [])
        self.proc = subprocess.Popen([sys.executable, str(REPO / "bench" / "aiohttp_floor.py"), *args],
                                     stdin=subprocess.DEVNULL, start_new_session=True, cwd=REPO)
        self.stats = ProcStats(self.proc.pid)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(5)


async def ready(session: aiohttp.ClientSession, url: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            async with session.get(f"{url}/healthz") as r:
                if r.status == 200:
                    return
        except aiohttp.ClientError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{url} not ready after {timeout:g}s")
        await asyncio.sleep(0.1)


async def round_us(server: Server, ctx: ssl.SSLContext | None, fresh: bool, requests: int, conns: int) -> float:
    """Server CPU per request for `requests` leases from `conns` clients, each keeping its
    connection (like an agent now) or opening a new one per request (`fresh`)."""
    sessions = [aiohttp.ClientSession(connector=aiohttp.TCPConnector(
        ssl=ctx if ctx is not None else True, force_close=fresh, limit_per_host=1)) for _ in range(conns)]
    try:
        await asyncio.gather(*(ready(s, server.url) for s in sessions))  # kept: every connection open already
        c0 = server.stats.sample().cpu_s

        async def client(s: aiohttp.ClientSession, n: int) -> None:
            for _ in range(n):
                async with s.post(f"{server.url}/v1/reports", data=LEASE) as r:
                    await r.read()
        await asyncio.gather(*(client(s, requests // conns) for s in sessions))
        return (server.stats.sample().cpu_s - c0) / (requests // conns * conns) * 1e6
    finally:
        for s in sessions:
            await s.close()


def mmm(v: list[float]) -> str:
    return "/".join(f"{x:.0f}" for x in (min(v), statistics.median(v), max(v)))


async def main_async(args: argparse.Namespace, wd: Path) -> None:
    cert, key = make_cert(wd, args.key)
    client = ssl.create_default_context(cafile=str(cert))
    plain, tls = Server(None), Server((cert, key))
    try:
        figures: dict[tuple[str, bool], list[float]] = {}
        for _ in range(args.rounds):
            for name, server, ctx in (("http", plain, None), ("https", tls, client)):
                for fresh in (False, True):
                    figures.setdefault((name, fresh), []).append(
                        await round_us(server, ctx, fresh, args.requests, args.connections))
    finally:
        plain.stop()
        tls.stop()
    print(f"server CPU per lease (us; min/median/max of {args.rounds} rounds of {args.requests:,} requests from "
          f"{args.connections} clients; {args.key.upper()} certificate; load average {os.getloadavg()[0]:.1f} on "
          f"{os.cpu_count()} CPUs)")
    print("| | connection kept (agents now) | new connection per request (before) | before / now |")
    print("|---|---|---|---|")
    for name in ("http", "https"):
        kept, new = figures[(name, False)], figures[(name, True)]
        print(f"| {name} | {mmm(kept)} | {mmm(new)} | {statistics.median(new) / statistics.median(kept):.1f}x |")
    extra = statistics.median(figures[("https", True)]) - statistics.median(figures[("https", False)])
    print(f"a handshake per heartbeat: +{extra:.0f} us each, {extra * HEARTBEATS_PER_S / 1e6:.2f} of a core at "
          f"100,000 nodes every 30 s ({HEARTBEATS_PER_S:,.0f}/s)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=3000, help="requests per round and kind")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--connections", type=int, default=32, help="clients at once")
    ap.add_argument("--key", choices=("rsa", "ec"), default="rsa", help="the server certificate's key")
    args = ap.parse_args()
    with workdir("ph-tlsreconnect-") as wd:
        asyncio.run(main_async(args, wd))
    return 0


if __name__ == "__main__":
    sys.exit(main())
