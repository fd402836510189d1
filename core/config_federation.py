"""The aggregator sets a read-only fleet view federates (`aggregator.federation:`), as frozen models.

One aggregator set per SuperPOD or cluster, each with its own leader and database; the federated
view (`podhealth fleet --federate`, the UI's /ui/federation) reads each set's JSON API and never
shares a database across them. Each set is reached with its own credential, which goes to that
set's URL only: over https (its certificate verified), or over http to this host's loopback, where
no one between can read it. Its own module beside config_aggregator.py, which embeds it.
"""

from __future__ import annotations

import dataclasses
import re
import urllib.parse
from dataclasses import dataclass
from typing import Annotated

from podhealth import credentials
from podhealth.configload import NonEmpty, Seconds, doc
from podhealth.netaddr import is_loopback_address

_SET_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def set_name_problem(name: str) -> str | None:
    if _SET_NAME.fullmatch(name) is None:
        return f'expected 1 to 64 letters, digits, ".", "_" or "-" (not first), got "{name}"'
    return None


def set_url_problem(url: str) -> str | None:
    """Why `url` cannot be a set's base URL, or None: http(s), a host, nothing a credential or a
    path trick could hide in (user info, query, fragment)."""
    try:
        u = urllib.parse.urlsplit(url)
        u.port  # noqa: B018 - raises on a port that is not a number
    except ValueError as e:
        return f'not a URL: "{url}" ({e})'
    if u.scheme not in ("http", "https") or not u.hostname:
        return f'expected an http(s)://host[:port] base URL, got "{url}"'
    if u.username is not None or u.password is not None:
        return "no user or password in the URL: give the set's token as token or token_file"
    if u.query or u.fragment:
        return f'no query or fragment in a base URL, got "{url}"'
    return None


def sends_safely(url: str) -> bool:
    """A credential may go to `url`: https, or http to this host's loopback."""
    u = urllib.parse.urlsplit(url)
    return u.scheme == "https" or (u.scheme == "http" and is_loopback_address(u.hostname or ""))


@dataclass(frozen=True)
class FederatedSet:
    name: Annotated[str, NonEmpty()] = doc("The set's name in the view (a SuperPOD, a cluster).", "pod1")
    url: Annotated[str, NonEmpty()] = doc(
        "The set's base URL (its replicas behind one name, or one of them): http(s)://host[:port].",
        "http://127.0.0.1:9420")
    token: str = doc(
        "A token of that set (its admin token, or what a proxy in front of it asks), sent as a bearer\n"
        "token to this URL only, never to another set; only over https or to loopback http.", "")
    token_file: str = doc("File holding token.", "")
    ca_file: str = doc("PEM file of the CAs to verify that set's https certificate (empty: the system's).", "")

    def validate(self) -> tuple[str, str] | None:
        problem = set_name_problem(self.name)
        if problem:
            return ("name", problem)
        problem = set_url_problem(self.url)
        if problem:
            return ("url", problem)
        secret = credentials.secret_problem(self.token, self.token_file, "token")
        if secret:
            return secret
        if (self.token or self.token_file) and not sends_safely(self.url):
            return ("url", f"{self.url} is plain http to another host: its token would cross the network "
                           "readable by anyone on the way; use https")
        if self.ca_file and not self.ca_file.startswith("/"):
            return ("ca_file", f'expected an absolute path, got "{self.ca_file}"')
        if self.ca_file and not self.url.startswith("https://"):
            return ("ca_file", "only an https URL has a certificate to verify")
        return None

    def read_token(self) -> str:
        """The token (inline or from token_file; never from the environment, which would be one
        token for every set). Raises credentials.CredentialError."""
        return credentials.read_secret(self.token, self.token_file, "")


@dataclass(frozen=True)
class FederationConfig:
    sets: tuple[FederatedSet, ...] = doc("The aggregator sets the view tiles, read-only.", ())
    timeout: Seconds = doc(
        "Seconds each set may take to answer; one that does not is shown as unreachable, and the\n"
        "others are never held up by it.", 5.0)

    def validate(self) -> tuple[str, str] | None:
        names: set[str] = set()
        urls: set[str] = set()
        for s in self.sets:
            if s.name in names:
                return ("sets", f"duplicate set name {s.name}")
            if s.url.rstrip("/") in urls:
                return ("sets", f"duplicate set URL {s.url}")
            names.add(s.name)
            urls.add(s.url.rstrip("/"))
        return None

    def resolved(self) -> "FederationConfig":
        """A copy with every set's token read from its file (at start, once). Raises
        credentials.CredentialError naming the file."""
        return dataclasses.replace(self, sets=tuple(dataclasses.replace(s, token=s.read_token(), token_file="")
                                                    for s in self.sets))
