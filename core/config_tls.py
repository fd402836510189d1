"""The `tls:` section of the agent's and of the aggregator's config (certificates, not code).

One site CA (or several, in one PEM bundle) signs the aggregator's server certificate and, where
the aggregator asks for them, each node's client certificate (its name, the node name, in a DNS
subjectAltName or the CN). Its own module because core/config.py embeds core/config_aggregator.py,
which must not import it back; the contexts themselves are built in core/tls.py.
"""

from __future__ import annotations

import os
import ssl
from dataclasses import dataclass
from typing import Literal

from podhealth.configload import doc

ClientCerts = Literal["off", "ingest", "required"]
AgentClientCerts = Literal["off", "required"]


def _file_problem(path: str) -> str | None:
    if not path.startswith("/"):
        return f'expected an absolute path, got "{path}"'
    if not os.path.isfile(path):
        return f"{path}: no such file"
    if not os.access(path, os.R_OK):
        return f"{path}: not readable by this user"
    return None


def _pem_problem(cert: str, key: str, ca: str) -> tuple[str, str] | None:
    """Load what is named into a throwaway context: a key that does not match its certificate,
    or a file that is not PEM, is a config error now, not a failed handshake later."""
    for name, path in (("cert", cert), ("key", key), ("ca", ca)):
        if path:
            problem = _file_problem(path)
            if problem:
                return (name, problem)
    if bool(cert) != bool(key):
        return ("key" if cert else "cert", "cert and key go together: set both or neither")
    try:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        if cert:
            try:
                ctx.load_cert_chain(cert, key)
            except ssl.SSLError as e:
                return ("key", f"{key} does not go with {cert}, or one is not PEM ({e.reason or e})")
        if ca:
            try:
                ctx.load_verify_locations(cafile=ca)
            except ssl.SSLError as e:
                return ("ca", f"{ca}: not a PEM CA bundle ({e.reason or e})")
    except OSError as e:
        return ("cert", f"cannot read the TLS files: {e.strerror or e}")
    return None


@dataclass(frozen=True)
class AgentTlsConfig:
    ca: str = doc(
        "PEM CA bundle that signed the aggregator's certificate: the agent's pushes to https://\n"
        "aggregator URLs verify the aggregator with it (empty: the system's trust store). Never\n"
        "turned off: an aggregator that cannot prove itself gets nothing, the node token included.", "")
    cert: str = doc(
        "PEM certificate (chain) of this node, presented to the aggregator as a client certificate\n"
        "(its name, the node name, as a DNS subjectAltName or CN). Re-read on SIGHUP or when it changes.", "")
    key: str = doc("PEM private key of `cert` (keep it 0600 root).", "")
    serve: bool = doc(
        "true: the agent's own listener (/metrics, /health, handover, gpu-reset, bundles) serves HTTPS\n"
        "with `cert` and `key` (a certificate for serverAuth and clientAuth naming the node). Callers\n"
        "verify it by the node name, the local hooks on 127.0.0.1 too. false: plain HTTP.", False)
    client_certs: AgentClientCerts = doc(
        "With serve: off, or required (every connection to the agent presents a certificate signed by\n"
        "`ca`: the aggregator's, or this node's own for the local hooks; Prometheus needs one too).", "off")

    def validate(self) -> tuple[str, str] | None:
        problem = _pem_problem(self.cert, self.key, self.ca)
        if problem:
            return problem
        if self.serve and not self.cert:
            return ("serve", "serving HTTPS needs this node's certificate: set cert and key")
        if self.client_certs != "off" and not self.serve:
            return ("client_certs", f"{self.client_certs} is for the agent's HTTPS listener: set serve: true")
        if self.client_certs != "off" and not self.ca:
            return ("client_certs", f"{self.client_certs} needs ca, the site CA that signs the callers' certificates")
        return None

    def server(self) -> "ServerTlsConfig":
        """The listener's side, as the aggregator's is built (core/tls.py ServerTls)."""
        return ServerTlsConfig(cert=self.cert, key=self.key, ca=self.ca, client_certs=self.client_certs)

    @property
    def scheme(self) -> str:
        return "https" if self.serve else "http"


@dataclass(frozen=True)
class ServerTlsConfig:
    cert: str = doc(
        "PEM certificate (chain) the aggregator serves HTTPS with (empty: plain HTTP). Its names must\n"
        "match the host part of the URLs agents and the CLI use. Re-read on SIGHUP or when it changes.", "")
    key: str = doc("PEM private key of `cert` (keep it 0600, owned by the aggregator's user).", "")
    ca: str = doc(
        "PEM CA bundle that verifies agents' client certificates (client_certs) and the agents the\n"
        "aggregator asks over https:// (agent_url).", "")
    client_certs: ClientCerts = doc(
        "off: no client certificates. ingest: /v1/* (pushes from agents) needs a client certificate\n"
        "signed by `ca` whose name is the node it pushes for; the UI, API and /metrics do not ask.\n"
        "required: every connection needs one (the handshake fails without), and ingest as above.", "off")

    def validate(self) -> tuple[str, str] | None:
        problem = _pem_problem(self.cert, self.key, self.ca)
        if problem:
            return problem
        if self.client_certs != "off" and not self.cert:
            return ("client_certs", f"{self.client_certs} needs TLS: set cert and key")
        if self.client_certs != "off" and not self.ca:
            return ("client_certs", f"{self.client_certs} needs ca, the CA that signs the agents' certificates")
        return None

    @property
    def enabled(self) -> bool:
        return bool(self.cert)
