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
