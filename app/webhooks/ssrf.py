"""Which webhook URLs may be called: http(s) to public addresses only.

Every address the host resolves to is checked, at submit time and again at
each delivery (DNS can change in between). The resolver is the system's
(`getaddrinfo`), which also turns obfuscated forms such as `127.1`,
`2130706433` or `0x7f000001` into the address they mean, so they are caught
as what they are; IPv4-mapped IPv6 addresses are checked as IPv4.
"""

from __future__ import annotations

import ipaddress
import socket
from urllib.parse import urlsplit

EVENTS = (
    "job.queued", "job.running", "job.succeeded", "job.failed",
    "job.cancelled", "job.expired", "job.dead_lettered",
)  # fmt: skip
DEFAULT_EVENTS = ("job.succeeded", "job.failed", "job.cancelled", "job.expired")

# Beyond what `is_global` already excludes (private, loopback, link-local, CGNAT,
# reserved, unspecified): multicast, and well-known metadata addresses.
_BLOCKED = [ipaddress.ip_network(n) for n in ("224.0.0.0/4", "ff00::/8", "fd00:ec2::254/128")]


class UnsafeUrl(ValueError):
    pass


def check_url(url: str, *, allow_private: bool = False) -> None:
    """Raise UnsafeUrl unless `url` is http(s) and every address of its host is public."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise UnsafeUrl(f"webhook URL must be http or https, not {parts.scheme or 'none'!r}")
    if not parts.hostname:
        raise UnsafeUrl("webhook URL has no host")
    if parts.username or parts.password:
        raise UnsafeUrl("webhook URL must not carry credentials")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
        infos = socket.getaddrinfo(parts.hostname, port, proto=socket.IPPROTO_TCP)
    except (OSError, ValueError) as exc:
        raise UnsafeUrl(f"webhook host {parts.hostname!r} does not resolve: {exc}") from None
    if allow_private:
        return
    for info in infos:
        address = ipaddress.ip_address(str(info[4][0]).split("%")[0])
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
            address = address.ipv4_mapped
        if not address.is_global or any(address in net for net in _BLOCKED):
            raise UnsafeUrl(
                f"webhook host {parts.hostname!r} resolves to {address}, which is not a "
                "public address (loopback, private, link-local, CGNAT, multicast, "
                "unspecified and metadata ranges are refused)"
            )
