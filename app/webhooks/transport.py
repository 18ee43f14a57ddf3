"""One webhook POST: to the address that was checked, within one wall-clock budget.

The connection goes to `Target.address` (no second DNS lookup, so no rebinding)
with the URL's host in `Host` and, for https, in SNI and the certificate check;
or, with a proxy configured, through that proxy. A watchdog shuts the socket
when the budget is spent, so a receiver that trickles its status line, headers
or body one byte at a time cannot hold the thread (a socket timeout is per
read). At most RESPONSE_CAP bytes of the body are read, then the connection is
closed: a receiver that answers gigabytes costs nothing. Nothing here reads the
environment (HTTP_PROXY, .netrc). Errors come back as a few public messages that
name no address.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

import certifi
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.util.ssl_match_hostname import CertificateError as HostnameMismatch

from app.webhooks.ssrf import Target

RESPONSE_CAP = 4096


@dataclass(frozen=True)
class Answer:
    status_code: int | None
    error: str | None  # one of the public messages below, or None
    retry_after: str | None  # the Retry-After header as sent
    latency_ms: float


def post(
    target: Target,
    body: bytes,
    headers: dict[str, str],
    timeout: float,
    proxy_url: str = "",
    ca_certs: str | None = None,
) -> Answer:
    """POST `body` to `target`, all of it within `timeout` seconds. https trusts
    `ca_certs` (a PEM bundle; default: certifi's)."""
    started = time.monotonic()
    cut = threading.Event()
    sockets: list[socket.socket] = []
    conn = _connection(target, timeout, proxy_url, ca_certs or certifi.where())
    watchdog = threading.Timer(timeout, _shut, args=(sockets, cut))
    watchdog.daemon = True
    watchdog.start()
    try:
        conn.connect()  # bounded by `timeout` itself
        sockets.append(conn.sock)  # the connection drops it once a response says close
        if cut.is_set():
            raise TimeoutError
        conn.request("POST", _request_target(target, proxy_url), body=body,
                     headers={**headers, "Host": _host_header(target)},
                     preload_content=False)  # fmt: skip
        response = conn.getresponse()
        if cut.is_set():  # the headers were cut short: no answer
            raise TimeoutError
        status, retry_after = response.status, response.headers.get("Retry-After")
        with contextlib.suppress(Exception):  # the status is in; the body is not ours
            response.read(RESPONSE_CAP, decode_content=False)
        return Answer(status, None, retry_after, _ms(started))
    except Exception as exc:  # every failure is one recorded attempt
        timed_out = cut.is_set() or time.monotonic() - started >= timeout
        return Answer(None, "timed out" if timed_out else public_error(exc), None, _ms(started))
    finally:
        watchdog.cancel()
        conn.close()
        for sock in sockets:
            sock.close()


def public_error(exc: BaseException) -> str:
    """What the delivery log says about a failure: no addresses, no library text."""
    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None:
            break
        if isinstance(seen, ConnectionRefusedError):
            return "connection refused"
        if isinstance(seen, ssl.SSLError | ssl.CertificateError | HostnameMismatch):
            return "TLS error"
        if isinstance(seen, TimeoutError | socket.timeout):
            return "timed out"
        seen = seen.__cause__ or seen.__context__
    return "connection failed"


def _connection(target: Target, timeout: float, proxy_url: str, ca_certs: str) -> HTTPConnection:
    host, port = target.address, target.port
    if proxy_url:
        proxy = urlsplit(proxy_url)
        host, port = proxy.hostname or "", proxy.port or 80
    if target.scheme == "http":
        return HTTPConnection(host, port, timeout=timeout)
    conn = HTTPSConnection(
        host, port, timeout=timeout, server_hostname=target.host,
        assert_hostname=target.host, cert_reqs="CERT_REQUIRED", ca_certs=ca_certs,
    )  # fmt: skip
    if proxy_url:
        conn.set_tunnel(target.host, target.port)
    return conn


def _request_target(target: Target, proxy_url: str) -> str:
    """The path, or for plain http through a proxy the absolute URL."""
    if proxy_url and target.scheme == "http":
        return f"http://{_host_header(target)}{target.path}"
    return target.path


def _host_header(target: Target) -> str:
    host = f"[{target.host}]" if ":" in target.host else target.host
    default = 443 if target.scheme == "https" else 80
    return host if target.port == default else f"{host}:{target.port}"


def _shut(sockets: list[socket.socket], cut: threading.Event) -> None:
    """The budget is spent: end whatever read or write the sender is blocked in."""
    cut.set()
    for sock in sockets:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


def _ms(started: float) -> float:
    return round((time.monotonic() - started) * 1000, 1)
