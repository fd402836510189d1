"""Is an address this machine only? (Light: config validation imports it.)"""

from __future__ import annotations

import ipaddress

_LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost"})


def is_loopback_address(address: str) -> bool:
    """`address` (an IP or a host name) is this machine only: 127.0.0.0/8, ::1, localhost.
    0.0.0.0 and :: (every interface) are not."""
    host = address.strip("[]").lower()
    if host in _LOOPBACK_NAMES:
        return True
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False
    mapped = getattr(ip, "ipv4_mapped", None)  # ::ffff:127.0.0.1 from a dual-stack socket
    return bool(ip.is_loopback or (mapped is not None and mapped.is_loopback))


def parse_listen(text: str, any_host: str | None = None) -> tuple[str, int]:
    """(address, port) of a `--listen ADDR:PORT` value ([::1]:9410 for IPv6). Without an address
    ("9420", ":9420") the address is `any_host`, or an error where there is none. ValueError with
    the flag's name, for the CLI to print."""
    host, sep, port = text.rpartition(":")
    if not sep:
        host, port = "", text
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f'--listen: expected ADDR:PORT, got "{text}"')
    host = host.strip("[]")
    if not host:
        if any_host is None:
            raise ValueError(f'--listen: missing address in "{text}"')
        host = any_host
    return host, int(port)
