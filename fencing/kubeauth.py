"""The pod's service account as Kubernetes client credentials (in-cluster mode).

A pod finds the API server in $KUBERNETES_SERVICE_HOST / $KUBERNETES_SERVICE_PORT and its
credentials in /var/run/secrets/kubernetes.io/serviceaccount (`token`, `ca.crt`, `namespace`).
The directory is a setting so tests (and unusual mounts) can point elsewhere.

The token is a bound service account token: the kubelet replaces it about hourly (at 80% of
its life) and the API server stops accepting the old one an hour or so later. The client's own
loader re-reads it only once a minute; here it is read before each request (a file of about a
kilobyte, beside an HTTPS round trip), so a new token is used as soon as it is there. A stat()
gate was tried and dropped: file timestamps are jiffy-coarse, so a same-size rewrite can keep
its mtime. A read that fails or finds the file empty mid-swap keeps the token already held.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kubernetes.client import Configuration

DEFAULT_SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
HOST_ENV, PORT_ENV = "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"


class InClusterError(ValueError):
    """In-cluster credentials are missing or unusable (the message says which and where)."""


class TokenFile:
    """A bearer token read from a file, read again for every request (see the module doc)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self.token = ""
        self.refresh()
        if not self.token:
            raise InClusterError(f"service account token {path} is empty")

    def refresh(self) -> str:
        """The file's token now, or the one held when the file cannot be read or is empty."""
        with self._lock:
            try:
                text = self.path.read_text(encoding="utf-8").strip()  # follows the kubelet's ..data symlink
            except (OSError, UnicodeDecodeError):
                if not self.token:
                    raise
                return self.token
            if text:
                self.token = text
            return self.token


def in_cluster_configuration(sa_dir: str | Path = DEFAULT_SA_DIR,
                             environ: Mapping[str, str] | None = None) -> "Configuration":
    """A client Configuration for the pod's service account; raises InClusterError naming what is missing."""
    from kubernetes import client as k8s
    from kubernetes.config.config_exception import ConfigException
    from kubernetes.config.incluster_config import InClusterConfigLoader

    env = os.environ if environ is None else environ
    missing = [k for k in (HOST_ENV, PORT_ENV) if not env.get(k)]
    if missing:
        raise InClusterError(f"{' and '.join(missing)} not set: not running in a Kubernetes pod? (outside a cluster "
                             "set fencers.kubernetes.kubeconfig instead of in_cluster)")
    sa = Path(sa_dir)
    token_path, ca_path = sa / "token", sa / "ca.crt"
    for p, what in ((token_path, "token"), (ca_path, "CA certificate")):
        if not p.is_file():
            raise InClusterError(f"service account {what} {p} does not exist: not running in a pod, or the pod has "
                                 "automountServiceAccountToken: false")
    try:
        tokens = TokenFile(token_path)
    except (OSError, UnicodeDecodeError) as e:
        raise InClusterError(f"cannot read the service account token {token_path}: {e}") from None
    cfg = k8s.Configuration()
    try:
        # The client's loader builds the https URL (IPv6 hosts bracketed) and checks the CA file;
        # its own minute-based token refresh is off, ours below replaces it.
        InClusterConfigLoader(token_filename=str(token_path), cert_filename=str(ca_path), try_refresh_token=False,
                              environ=dict(env)).load_and_set(cfg)
    except (ConfigException, OSError) as e:
        raise InClusterError(f"service account in {sa}: {e}") from None

    def refresh(c: "Configuration") -> None:
        c.api_key["BearerToken"] = tokens.refresh()

    cfg.api_key_prefix["BearerToken"] = "Bearer"
    cfg.api_key["BearerToken"] = tokens.token
    cfg.refresh_api_key_hook = refresh  # type: ignore[assignment]  # the client declares it as None
    return cfg
