"""Credentials: per-node tokens derived from one cluster secret, secrets read from files or the
environment, and files that hold them written private.

A node token is HMAC-SHA256(cluster_secret, "podhealth-node:" + node) in hex. Operators keep one
secret on the aggregator and give each node only its own token (`podhealth token derive`), so a
node's token speaks for that node alone and a stolen one fences nothing else; the aggregator
checks a token by deriving it again, so it needs no list of tokens and learns nothing to store.

The other direction works the same way: the token the aggregator presents to a node's agent
(handover, GPU reset, bundle) is HMAC-SHA256(cluster_secret, "podhealth-agent:" + node), so root
on one node, who can read that node's agent token, cannot reset GPUs on any other. The two
prefixes keep a node's two tokens apart: neither is ever the other.

Light on purpose (config validation imports it): no aiohttp, nothing from podhealth.config.
"""

from __future__ import annotations

import grp
import hashlib
import hmac
import os
from pathlib import Path

NODE_PREFIX = b"podhealth-node:"
AGENT_PREFIX = b"podhealth-agent:"
MIN_SECRET_CHARS = 16  # a short secret can be guessed offline from one node's token
SERVICE_GROUP = "podhealth"  # the systemd units' Group=: it may read files that hold tokens


class CredentialError(Exception):
    """A secret that was asked for cannot be read (the message names where it was looked for)."""


def derive_node_token(secret: str, node: str) -> str:
    """The token `node` presents to the aggregator."""
    return hmac.new(secret.encode(), NODE_PREFIX + node.encode(), hashlib.sha256).hexdigest()


def derive_agent_token(secret: str, node: str) -> str:
    """The token the aggregator presents to `node`'s agent (that agent's auth.token)."""
    return hmac.new(secret.encode(), AGENT_PREFIX + node.encode(), hashlib.sha256).hexdigest()


def node_token_matches(secret: str, node: str, token: str) -> bool:
    """`token` is `node`'s derived token (constant time)."""
    return bool(secret) and hmac.compare_digest(derive_node_token(secret, node).encode(), token.encode())


def read_secret(inline: str, file: str, env: str) -> str:
    """The secret from the inline value, else from `file`, else from the environment variable `env`.

    A file's surrounding whitespace (its trailing newline) is dropped. Empty means "not set".
    """
    if inline:
        return inline
    if file:
        try:
            value = Path(file).read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as e:
            why = e.strerror if isinstance(e, OSError) else "not UTF-8 text"
            raise CredentialError(f"cannot read {file}: {why}") from None
        if not value:
            raise CredentialError(f"{file} is empty")
        return value
    return os.environ.get(env, "").strip() if env else ""


def secret_problem(inline: str, file: str, what: str) -> str | None:
    """Why a (inline, file) pair is not a usable configuration, or None (for config validation)."""
    if inline and file:
        return f"set {what} or {what}_file, not both"
    if file and not file.startswith("/"):
        return f'expected an absolute path, got "{file}"'
    return None


def write_private(path: Path, text: str, group: str = "") -> None:
    """Write `text` to `path` readable by its owner only (0600), or by owner and `group` (0640)
    when that group exists and this process may hand the file to it.

    The file is created with its final mode (never briefly world-readable) and replaced
    atomically, so a reader sees the old content or the new, never a part.
    """
    gid = -1
    if group:
        try:
            gid = grp.getgrnam(group).gr_gid
        except KeyError:
            gid = -1
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            if gid >= 0:
                try:
                    os.fchown(f.fileno(), -1, gid)
                    os.fchmod(f.fileno(), 0o640)
                except PermissionError:
                    pass  # not root: the file stays 0600, its owner's alone
            else:
                os.fchmod(f.fileno(), 0o600)  # O_CREAT's mode is ignored when tmp already existed
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
