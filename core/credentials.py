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
# Where install-units puts this node's agent key (0640 root:podhealth): the agent reads it when
# auth.token/token_file/$PODHEALTH_AGENT_TOKEN name none, and root's tools on the node (the Slurm
# and BCM hooks, `podhealth check`) read it to check that the agent answering is the real one.
DEFAULT_AGENT_KEY_FILE = "/etc/podhealth/agent.key"
# A user's own agent keys, one file per node (`<dir>/<node>.key`): `podhealth agent --simulate`
# makes one for its simulated node there, and `podhealth check` run by the same user finds it.
SIM_DIR_ENV = "PODHEALTH_SIM_DIR"
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


def read_key_file(path: str | Path) -> str:
    """The key in `path`, or "" when there is none this user may read (missing, or another
    user's: a non-root caller simply has no key for the node)."""
    try:
        return Path(path).read_text(encoding="utf-8").strip()
    except (FileNotFoundError, PermissionError, NotADirectoryError, IsADirectoryError):
        return ""
    except (OSError, UnicodeDecodeError) as e:
        why = e.strerror if isinstance(e, OSError) else "not UTF-8 text"
        raise CredentialError(f"cannot read {path}: {why}") from None


def user_key_dir() -> Path:
    """This user's key ring: `_keys` under $PODHEALTH_SIM_DIR, else /tmp/podhealth-sim-<uid>
    (the simulator's per-user directory, where `agent --simulate` runs its node)."""
    root = os.environ.get(SIM_DIR_ENV, "") or f"/tmp/podhealth-sim-{os.getuid()}"
    return Path(root) / "_keys"


def _private_to_me(path: Path, dir_too: bool) -> bool:
    """`path` is ours and nobody else may change it (nor read it, for a key file): a key planted
    in a directory another user made under /tmp must never vouch for an impostor."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    import stat

    if st.st_uid != os.geteuid():
        return False
    if dir_too:
        return stat.S_ISDIR(st.st_mode) and not st.st_mode & 0o022
    return stat.S_ISREG(st.st_mode) and not st.st_mode & 0o077


def user_key(node: str) -> str:
    """The agent key this user holds for `node` in their key ring, or ""."""
    d = user_key_dir()
    f = d / f"{node}.key"
    if not (_private_to_me(d, True) and _private_to_me(d.parent, True) and _private_to_me(f, False)):
        return ""
    return read_key_file(f)


def ensure_user_key(node: str) -> str:
    """This user's key for `node` (the simulated node of `agent --simulate`), made when missing."""
    import secrets

    key = user_key(node)
    if key:
        return key
    d = user_key_dir()
    d.mkdir(mode=0o700, parents=True, exist_ok=True)
    if not (_private_to_me(d, True) and _private_to_me(d.parent, True)):
        raise CredentialError(f"{d} (or its parent) is not this user's own private directory: no key written there")
    # Made beside it, then linked into place only if no one else made it meanwhile (two simulated
    # agents starting at once): every process ends up with the one key the file holds.
    tmp = d / f".{node}.key.{os.getpid()}"
    write_private(tmp, secrets.token_hex(32) + "\n")
    try:
        os.link(tmp, d / f"{node}.key")
    except FileExistsError:
        pass
    finally:
        tmp.unlink(missing_ok=True)
    key = user_key(node)
    if not key:
        raise CredentialError(f"{d / (node + '.key')} is not a private file of this user's")
    return key


def secret_problem(inline: str, file: str, what: str) -> tuple[str, str] | None:
    """(the config key to blame, why) when an (inline, file) pair is not a usable configuration,
    else None: a config section's validate() returns it as it is."""
    if inline and file:
        return (f"{what}_file", f"set {what} or {what}_file, not both")
    if file and not file.startswith("/"):
        return (f"{what}_file", f'expected an absolute path, got "{file}"')
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
