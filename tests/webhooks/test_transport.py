"""https to a pinned address: SNI and the certificate check use the URL's host,
never the address connected to. A real TLS server on loopback, its certificate
made with the `openssl` command."""

from __future__ import annotations

import shutil
import ssl
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from app.webhooks import transport
from app.webhooks.ssrf import Target


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, Path, list[Any]]]:
    if shutil.which("openssl") is None:
        pytest.skip("no openssl command")
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key),
         "-out", str(cert), "-days", "1", "-subj", "/CN=hooks.test",
         "-addext", "subjectAltName=DNS:hooks.test"],
        check=True, capture_output=True,
    )  # fmt: skip
    seen: list[Any] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            seen.append(self.headers["Host"])
            self.send_response(204)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.2", 0), Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)

    def sni(_sock: Any, name: str | None, _context: Any) -> None:
        seen.append(("sni", name))

    context.sni_callback = sni
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1], cert, seen
    server.shutdown()


def test_https_to_the_checked_address_names_the_host(tls_server: Any) -> None:
    port, cert, seen = tls_server
    target = Target("https", "hooks.test", port, "127.0.0.2", "/hook")
    answer = transport.post(target, b"{}", {}, 2.0, ca_certs=str(cert))
    assert answer.status_code == 204
    assert ("sni", "hooks.test") in seen and f"hooks.test:{port}" in seen


@pytest.mark.parametrize("host", ["other.test", "127.0.0.2"])
def test_a_certificate_for_another_name_is_a_tls_error(tls_server: Any, host: str) -> None:
    port, cert, _ = tls_server
    target = Target("https", host, port, "127.0.0.2", "/hook")
    answer = transport.post(target, b"{}", {}, 2.0, ca_certs=str(cert))
    assert (answer.status_code, answer.error) == (None, "TLS error")


def test_an_unknown_certificate_authority_is_a_tls_error(tls_server: Any) -> None:
    port, _, _ = tls_server
    answer = transport.post(Target("https", "hooks.test", port, "127.0.0.2", "/"), b"{}", {}, 2.0)
    assert (answer.status_code, answer.error) == (None, "TLS error")
