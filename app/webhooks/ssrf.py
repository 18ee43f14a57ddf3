"""Which webhook URLs may be called: http(s) to public addresses only.

The host is resolved once per attempt and every address it has is checked; the
caller then connects to the address returned here, never resolving again, so a
name that answers a public address to the check and a private one to the HTTP
client (DNS rebinding) cannot reach inside. The resolver is the system's
(`getaddrinfo`, which also turns `127.1`, `2130706433` or `0x7f000001` into the
address they mean) unless a caller passes another. IPv4 embedded in IPv6
(mapped, NAT64 `64:ff9b::/96`, 6to4 `2002::/16`) is checked as that IPv4.
Messages name no address: a tenant learns nothing of what a name resolves to.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from app.errors import InvalidRequest

EVENTS = (
    "job.queued", "job.running", "job.succeeded", "job.failed",
    "job.cancelled", "job.expired", "job.dead_lettered", "job.output",
)  # fmt: skip
DEFAULT_EVENTS = ("job.succeeded", "job.failed", "job.cancelled", "job.expired")

# Beyond what `is_global` already excludes (private, loopback, link-local, CGNAT,
# reserved, unspecified): multicast, and well-known metadata addresses.
_BLOCKED = [ipaddress.ip_network(n) for n in ("224.0.0.0/4", "ff00::/8", "fd00:ec2::254/128")]
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_6TO4 = ipaddress.ip_network("2002::/16")

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network
# (host, port) -> the addresses to connect to, as text.
Resolver = Callable[[str, int], Sequence[str]]


class UnsafeUrl(ValueError):
    pass


@dataclass(frozen=True)
class Target:
    """Where one attempt connects: `address` was checked; `host` goes in Host and SNI."""

    scheme: str
    host: str
    port: int
    address: str
    path: str  # path and query, as sent in the request line


def system_resolver(host: str, port: int) -> list[str]:
    infos = socket.getaddrinfo(host, port, proto=socket.IPPROTO_TCP)
    return [str(info[4][0]).split("%")[0] for info in infos]


def networks(cidrs: Iterable[str]) -> tuple[Network, ...]:
    return tuple(ipaddress.ip_network(c, strict=False) for c in cidrs)


def is_public(address: Address, allowed: Sequence[Network] = ()) -> bool:
    """Public, or in an allowed network; IPv4 inside IPv6 is judged as that IPv4."""
    if any(address.version == n.version and address in n for n in allowed):
        return True
    if isinstance(address, ipaddress.IPv6Address):
        embedded = address.ipv4_mapped
        if embedded is None and address in _NAT64:
            embedded = ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
        if embedded is None and address in _6TO4:
            embedded = ipaddress.IPv4Address((int(address) >> 80) & 0xFFFFFFFF)
        if embedded is not None:
            return is_public(embedded, allowed)
    return address.is_global and not any(address in net for net in _BLOCKED)


def check_url(
    url: str,
    *,
    allow_private: bool = False,
    allowed: Sequence[Network] = (),
    resolver: Resolver | None = None,
    resolve: bool = True,
) -> Target:
    """The checked target of `url`; raises UnsafeUrl unless it is http(s) and every
    address of its host is public. `resolve=False` (a proxy resolves) checks
    only a host that is a literal address."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise UnsafeUrl(f"webhook URL must be http or https, not {parts.scheme or 'none'!r}")
    if not parts.hostname:
        raise UnsafeUrl("webhook URL has no host")
    if parts.username or parts.password:
        raise UnsafeUrl("webhook URL must not carry credentials")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise UnsafeUrl("webhook URL has an invalid port") from None
    host = parts.hostname
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    if not resolve:
        try:
            literal: Address | None = ipaddress.ip_address(host)
        except ValueError:
            literal = None
        if literal is not None and not allow_private and not is_public(literal, allowed):
            raise UnsafeUrl(_not_public(host))
        return Target(parts.scheme, host, port, host, path)
    try:
        addresses = list((resolver or system_resolver)(host, port))
    except (OSError, ValueError, UnicodeError):
        addresses = []
    if not addresses:
        raise UnsafeUrl(f"webhook host {host!r} does not resolve")
    if not allow_private:
        for text in addresses:
            try:
                public = is_public(ipaddress.ip_address(text), allowed)
            except ValueError:
                public = False
            if not public:
                raise UnsafeUrl(_not_public(host))
    return Target(parts.scheme, host, port, addresses[0], path)


@dataclass(frozen=True)
class UrlPolicy:
    """Which webhook URLs a job or batch may name (WEBHOOK_ALLOW_PRIVATE_NETWORKS,
    WEBHOOK_ALLOWED_NETWORKS), checked when it is submitted and again at each attempt."""

    allow_private: bool = False
    allowed: tuple[Network, ...] = ()

    def check(self, url: str) -> None:
        """InvalidRequest naming why the service must not call `url`."""
        try:
            check_url(url, allow_private=self.allow_private, allowed=self.allowed)
        except UnsafeUrl as exc:
            raise InvalidRequest(str(exc), errors={"webhook": {"url": [str(exc)]}}) from None


def _not_public(host: str) -> str:
    return (
        f"webhook host {host!r} is not a public address (loopback, private, link-local, "
        "CGNAT, multicast, unspecified and metadata ranges are refused)"
    )
