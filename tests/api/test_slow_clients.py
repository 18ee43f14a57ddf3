"""Slow clients against the real API server (`manage.py up`'s command line):
hundreds of connections whose headers never end, or whose body never comes after
a request that is refused anyway (no key), hold connections, not the request
threads, so other tenants' requests are still answered. (Under gunicorn's gthread
workers, each refused request's unsent body was drained by a request thread:
200 of them took every thread.) A tenant's own slow bodies, with its key, hold
at most MAX_REQUESTS_PER_TENANT threads of a process; the rest are refused."""

from __future__ import annotations

import http.client
import json
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.cli.launcher import api_command
from app.platform.database import Database
from app.platform.settings import ROOT, Settings
from tests.conftest import TenantAuth, make_tenant, service_env, stop_process
from tests.support import free_port, wait_until

SLOW_BODIES = 200  # more than the API's 2 x 32 request threads
SLOW_HEADERS = 100


@pytest.fixture
def api(settings: Settings, tmp_path: Path) -> Iterator[int]:
    port = free_port()
    log = (tmp_path / "api.log").open("wb")
    env = service_env(settings, PROMETHEUS_MULTIPROC_DIR=str(tmp_path / "metrics"))
    proc = subprocess.Popen(api_command(f"127.0.0.1:{port}"), cwd=ROOT, env=env,
                            stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
    try:
        wait_until(lambda: _live(port), "the API answers", 60)
        yield port
    finally:
        stop_process(proc)
        log.close()


def _live(port: int) -> bool:
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
        conn.request("GET", "/v2/health/live")
        return conn.getresponse().status == 200
    except OSError:
        return False


_JOB = json.dumps({"model": "digits", "inputs": {"pixels": [[0.0] * 64]}})


def _unfinished_submit(port: int, headers: dict[str, str]) -> socket.socket:
    """A POST /jobs (with these headers) whose body stops halfway, for ever."""
    conn = socket.create_connection(("127.0.0.1", port))
    head = "".join(f"{k}: {v}\r\n" for k, v in headers.items()).encode()
    conn.sendall(b"POST /jobs HTTP/1.1\r\nHost: x\r\n" + head +
                 b"Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n"
                 b'{"model": ')  # fmt: skip
    return conn


def _submit(port: int, tenant: TenantAuth) -> tuple[int, bytes]:
    client = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        client.request(
            "POST", "/jobs", _JOB, {**tenant.headers, "Content-Type": "application/json"}
        )
        answer = client.getresponse()
        return answer.status, answer.read()
    finally:
        client.close()


def test_unfinished_requests_do_not_starve_the_others(api: int, tenant: TenantAuth) -> None:
    stuck: list[socket.socket] = []
    try:
        for _ in range(SLOW_BODIES):  # no key (a 401), then a body that never comes
            stuck.append(_unfinished_submit(api, {}))
        for _ in range(SLOW_HEADERS):  # headers that never end
            conn = socket.create_connection(("127.0.0.1", api))
            conn.sendall(b"GET /v2/health/live HTTP/1.1\r\nHo")
            stuck.append(conn)
        for _ in range(20):
            status, body = _submit(api, tenant)
            assert status == 202, body[:300]
            assert json.loads(body)["status"] == "queued"
    finally:
        for conn in stuck:
            conn.close()


def test_one_tenant_s_slow_bodies_leave_threads_for_the_others(
    api: int, tenant: TenantAuth, database: Database
) -> None:
    """Tenant A, with its key, starts 200 submits whose bodies never finish: each
    process serves MAX_REQUESTS_PER_TENANT (24) of them, holding a thread each, and
    refuses the rest (429). Tenant B's submits are answered. (Without the bound A's
    bodies held all 64 request threads and B's submits waited for ever.)"""
    stuck = [_unfinished_submit(api, tenant.headers) for _ in range(SLOW_BODIES)]
    try:
        other = make_tenant(database)
        for _ in range(20):
            status, body = _submit(api, other)
            assert status == 202, body[:300]
        # A's own next one: over its share on either process, once both processes have
        # taken up their share of A's 200 connections (they do so while B is served:
        # on a loaded machine the first of these may still be admitted).
        last: list[tuple[int, bytes]] = []

        def refused() -> bool:
            last[:] = [_submit(api, tenant)]
            return last[0][0] == 429

        wait_until(refused, lambda: f"A's next submit to be refused: {last}", 30)
        assert json.loads(last[0][1])["type"].endswith("/too-many-requests")
    finally:
        for conn in stuck:
            conn.close()
