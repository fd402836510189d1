"""TLS for podhealth, with the standard library's `ssl`: the aggregator's server context, the
clients' contexts (agents, CLI), and re-reading certificates on SIGHUP or when their files change.

Clients always verify the server (the chain against `ca`, or the system's trust store, and the
host name): there is no switch to turn verification off, because a node token or an admin token
sent to an endpoint that has not proven itself is a token given away.

Rotation without a restart (docs/security.md, "TLS"): the server hands each new handshake the
context built from the files as they are now (an SNI callback, which OpenSSL calls with or without
SNI), so a new certificate, key or CA bundle is served from the next connection on; a client
context is reloaded in place (its certificate and key are replaced; a new CA is added beside the
old one, which stays trusted until the process restarts). Files that do not load (a key that does
not match, a half-copied PEM) are refused with an error in the log, and the old ones go on.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import ssl
from typing import Any, Callable, Iterable, Mapping

from podhealth import log as plog
from podhealth.config_tls import AgentTlsConfig, ServerTlsConfig

log = plog.get("podhealth.tls")
WATCH_INTERVAL = 30.0  # seconds between looks at the files' change times
CA_ENV, CERT_ENV, KEY_ENV = "PODHEALTH_TLS_CA", "PODHEALTH_TLS_CERT", "PODHEALTH_TLS_KEY"
Stamp = tuple[tuple[str, int, int, int], ...]


def server_context(cfg: ServerTlsConfig) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(cfg.cert, cfg.key)
    if cfg.client_certs != "off":
        ctx.load_verify_locations(cafile=cfg.ca)
        # ingest: asked for, not demanded, so the UI and /metrics work without one; the ingest
        # routes refuse a connection that did not present a verified one (client_names()).
        ctx.verify_mode = ssl.CERT_REQUIRED if cfg.client_certs == "required" else ssl.CERT_OPTIONAL
    return ctx


def client_context(ca: str = "", cert: str = "", key: str = "") -> ssl.SSLContext:
    """Verifies the server's chain (against `ca`, else the system's store) and its host name;
    presents `cert` when given (a node's client certificate)."""
    ctx = ssl.create_default_context(cafile=ca or None)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if cert:
        ctx.load_cert_chain(cert, key)
    return ctx


def cli_context(ca: str = "", cert: str = "", key: str = "") -> ssl.SSLContext:
    """A CLI's context for https:// URLs: $PODHEALTH_TLS_CA / _CERT / _KEY win over what the
    config gave (`ca`, `cert`, `key`)."""
    env = os.environ
    cert, key = (env[CERT_ENV], env.get(KEY_ENV, "")) if env.get(CERT_ENV) else (cert, key)
    return client_context(env.get(CA_ENV) or ca, cert, key)


def node_caller_context(cfg: AgentTlsConfig) -> ssl.SSLContext:
    """How a tool on the node (Slurm hooks, BCM check, `check`) verifies its own agent's HTTPS:
    the site CA ($PODHEALTH_TLS_CA, else tls.ca), presenting the node's certificate where this
    user can read its key (an agent with client_certs: required asks for one; root can)."""
    mine = bool(cfg.cert) and os.access(cfg.key, os.R_OK)
    return cli_context(cfg.ca, cfg.cert if mine else "", cfg.key if mine else "")


def peer_names(peercert: Mapping[str, Any] | None) -> set[str]:
    """The names a verified peer certificate carries: DNS subjectAltNames, and the CN."""
    if not peercert:
        return set()
    names = {str(v) for k, v in peercert.get("subjectAltName", ()) if k == "DNS"}
    for rdn in peercert.get("subject", ()):
        names.update(str(v) for k, v in rdn if k == "commonName")
    return names


def _stamp(paths: Iterable[str]) -> Stamp:
    out = []
    for p in paths:
        if p:
            try:
                st = os.stat(p)
                # The inode too: a file renamed over the old one (the rotation docs/security.md asks
                # for) may keep its size and, within the clock's coarse tick, its change time.
                out.append((p, st.st_ino, st.st_mtime_ns, st.st_size))
            except OSError:
                out.append((p, -1, -1, -1))
    return tuple(out)


class Reloadable:
    """A context and the files it was built from; `check()` rebuilds it when they changed."""

    def __init__(self, what: str, files: tuple[str, ...], build: Callable[[], ssl.SSLContext]) -> None:
        self.what = what
        self.files = files
        self._build = build
        self.stamp = _stamp(files)
        self.current = build()
        self.reloads = 0  # new files that took
        self.refused = 0  # new files that did not load (the old ones went on)

    def check(self, force: bool = False) -> bool:
        """Rebuild when the files changed (or `force`: SIGHUP). True when the new files took."""
        stamp = _stamp(self.files)
        if stamp == self.stamp and not force:
            return False
        try:
            new = self._build()
        except (OSError, ssl.SSLError, ValueError) as e:
            log.error("TLS files not reloaded: keeping the ones in use", what=self.what,
                      error=getattr(e, "reason", None) or str(e), files=list(self.files))
            self.stamp = stamp  # said once per change, not every look
            self.refused += 1
            return False
        self.stamp = stamp
        self._install(new)
        self.reloads += 1
        log.info("TLS files reloaded", what=self.what, files=list(self.files))
        return True

    def _install(self, new: ssl.SSLContext) -> None:
        self.current = new


class ServerTls(Reloadable):
    """What the listener holds (`context`): each handshake switches to the newest context."""

    def __init__(self, cfg: ServerTlsConfig) -> None:
        super().__init__("server", (cfg.cert, cfg.key, cfg.ca), lambda: server_context(cfg))
        self.context = server_context(cfg)
        self.context.sni_callback = self._pick

    def _pick(self, sslobj: ssl.SSLObject, name: str | None, ctx: ssl.SSLContext) -> None:
        sslobj.context = self.current


class ClientTls(Reloadable):
    """A client context that stays the same object (aiohttp's connector holds it): reloaded in place."""

    def __init__(self, cfg: AgentTlsConfig) -> None:
        self.cfg = cfg
        super().__init__("client", (cfg.ca, cfg.cert, cfg.key), lambda: client_context(cfg.ca, cfg.cert, cfg.key))
        self.context = self.current

    def _install(self, new: ssl.SSLContext) -> None:
        # Load into the object the sessions hold; `new` proved the files load.
        if self.cfg.cert:
            self.context.load_cert_chain(self.cfg.cert, self.cfg.key)
        if self.cfg.ca:
            self.context.load_verify_locations(cafile=self.cfg.ca)
        self.current = self.context


class Watch:
    """Re-reads the TLS files on SIGHUP, and when they change (looked at every `interval` s)."""

    def __init__(self, items: Iterable[Reloadable], interval: float = WATCH_INTERVAL) -> None:
        self.items = list(items)
        self.interval = interval
        self._task: asyncio.Task[None] | None = None
        self._hup = False

    def start(self) -> None:
        """SIGHUP is taken even with nothing to re-read: its default action would end the process
        (an operator's `systemctl kill -s HUP` on a server without TLS)."""
        loop = asyncio.get_running_loop()
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):  # not the main thread
            loop.add_signal_handler(signal.SIGHUP, self.reload_now)
            self._hup = True
        if self.items:
            self._task = loop.create_task(self._loop(), name="tls-watch")

    def reload_now(self) -> None:
        if not self.items:
            log.info("SIGHUP: no TLS files to re-read")
        for it in self.items:
            it.check(force=True)

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            for it in self.items:
                it.check()

    async def stop(self) -> None:
        if self._hup:
            with contextlib.suppress(Exception):
                asyncio.get_running_loop().remove_signal_handler(signal.SIGHUP)
            self._hup = False
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
