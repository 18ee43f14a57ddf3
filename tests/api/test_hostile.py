"""Hostile input and noisy tenants: no body or header of any shape gets a 5xx,
authentication comes before any body is read, event streams end when there is
nothing left to send, and waiting requests are bounded per tenant and in total."""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx
import pytest
from flask import Flask
from flask.testing import FlaskClient
from onnx import TensorProto as T
from onnx import helper as h

from app import create_app
from app.platform.database import Database
from app.platform.settings import Settings
from app.web.context import IN_PROGRESS, container_of
from tests.conftest import TenantAuth, make_tenant, wait_for_job
from tests.support import LiveServer, wait_until

ROW = [[1.0] * 64]


def build_int8(root: Path) -> None:
    """A model with an INT8 input, to try values outside its range."""
    graph = h.make_graph(
        [h.make_node("Cast", ["x"], ["y"], to=T.FLOAT)], "int8",
        [h.make_tensor_value_info("x", T.INT8, [None, 2])],
        [h.make_tensor_value_info("y", T.FLOAT, [None, 2])],
    )  # fmt: skip
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    model.ir_version = 9
    folder = root / "int8" / "1"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.onnx").write_bytes(model.SerializeToString())
    card = {"inputs": [{"name": "x", "datatype": "INT8", "shape": [-1, 2]}],
            "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1, 2]}],
            "batching": {"max_batch_size": 8}}  # fmt: skip
    (folder / "card.json").write_text(json.dumps(card))
    onnx.checker.check_model(model)


@pytest.fixture(scope="module")
def hostile_app(settings: Settings, model_repository: Path) -> Flask:
    build_int8(model_repository)
    # Its own queue, which no worker reads: what it admits stays queued.
    return create_app(settings.with_overrides(
        jobs_queue=f"hostile-{uuid.uuid4().hex}", max_waits_per_tenant=2, max_waits=3,
    ))  # fmt: skip


@pytest.fixture
def hc(hostile_app: Flask) -> FlaskClient:
    return hostile_app.test_client()


def problem(response: Any, *statuses: int) -> dict[str, Any]:
    assert response.status_code in statuses, (response.status_code, response.data[:300])
    assert response.mimetype == "application/problem+json", response.data[:300]
    body: dict[str, Any] = response.json
    assert body["status"] == response.status_code and body["detail"]
    return body


def job(**extra: Any) -> dict[str, Any]:
    return {"model": "digits", "inputs": {"pixels": ROW}, **extra}


def test_hostile_bodies_and_headers_get_clear_4xx_problems(
    hc: FlaskClient, tenant: TenantAuth
) -> None:
    auth = tenant.headers
    mine = hc.post("/jobs", json=job(), headers=auth).json["id"]
    deep = "[" * 100_000 + "]" * 100_000

    def raw(text: str) -> dict[str, Any]:
        return {"data": text, "content_type": "application/json", "headers": auth}

    def pixels(value: str) -> str:
        return '{"model":"digits","inputs":{"pixels":[[' + ",".join([value] * 64) + "]]}}"

    bool_shape = [{"name": "pixels", "shape": [True, 64], "datatype": "FP32", "data": [0.0] * 64}]
    nested_inputs = '{"model":"digits","inputs":{"pixels":' + "[" * 5000 + "]" * 5000 + "}}"

    def cancel_after(value: str) -> Any:
        return hc.post("/jobs", json=job(), headers={**auth, "Cancel-After": value})

    cases: list[tuple[str, Any, int]] = [
        ("Cancel-After 1.4e307", cancel_after("1.4e307"), 422),
        ("Cancel-After 1e12", cancel_after("1e12"), 422),
        ("Cancel-After word", cancel_after("x"), 422),
        ("offset +17:13", hc.post("/dead-letters/replay", headers=auth,
                                  json={"since": "1748-03-07T21:57:07+17:13"}), 422),
        ("deadline offset", hc.post("/jobs", headers=auth,
                                    json=job(deadline="2999-01-01T00:00:00-23:59")), 422),
        ("deadline year 9999", hc.post("/jobs", headers=auth,
                                       json=job(deadline="9999-12-31T23:59:59-14:00")), 202),
        ("nested 100k deep", hc.post("/jobs", **raw(deep)), 400),
        ("inputs nested deep", hc.post("/jobs", **raw(nested_inputs)), 400),
        ("5000-digit integer", hc.post("/jobs", **raw(pixels("9" * 5000))), 400),
        ("1e999", hc.post("/jobs", **raw(pixels("1e999"))), 422),
        ("shape of booleans", hc.post("/jobs", headers=auth,
                                      json={"model": "digits", "inputs": bool_shape}), 422),
        ("v2 shape of booleans", hc.post("/v2/models/digits/infer", headers=auth,
                                         json={"inputs": bool_shape}), 422),
        ("v2 nested deep", hc.post("/v2/models/digits/infer", **raw(deep)), 422),
        ("INT8 300", hc.post("/jobs", json={"model": "int8", "inputs": {"x": [[300, 1]]}},
                             headers=auth), 422),
        ("INT8 -129", hc.post("/jobs", json={"model": "int8", "inputs": {"x": [[-129, 1]]}},
                              headers=auth), 422),
        ("Last-Event-ID ²", hc.get(f"/jobs/{mine}/events",
                                   headers={**auth, "Last-Event-ID": "²"}), 400),
        ("Last-Event-ID -1", hc.get(f"/jobs/{mine}/events",
                                    headers={**auth, "Last-Event-ID": "-1"}), 400),
        ("model as object", hc.post("/jobs", json={"model": {"a": 1}, "inputs": {}}, headers=auth),
         422),
        ("body not UTF-8", hc.post("/jobs", data=b"\xff\xfe", content_type="application/json",
                                   headers=auth), 400),
        ("wait NaN", hc.get(f"/jobs/{mine}?wait=nan", headers=auth), 422),
        ("NUL in a filter", hc.get("/jobs?model=%00", headers=auth), 400),
        ("NUL in a replay filter", hc.post("/dead-letters/replay", json={"model": "a\x00"},
                                           headers=auth), 400),
        ("NUL in Idempotency-Key", hc.post("/jobs", json=job(),
                                           headers={**auth, "Idempotency-Key": "k\x00"}), 400),
        ("NUL in a file name", hc.post("/files?filename=a%00.npy", data=b"x", headers=auth), 400),
    ]  # fmt: skip
    for name, response, status in cases:
        if status == 202:
            assert response.status_code == 202, (name, response.json)
            continue
        body = problem(response, status)
        assert "Internal" not in body["title"], name
    int8 = hc.post("/jobs", json={"model": "int8", "inputs": {"x": [[300, 1]]}}, headers=auth)
    assert "INT8's range (-128 to 127)" in int8.json["detail"]
    ok = hc.post("/jobs", json={"model": "int8", "inputs": {"x": [[127, -128]]}}, headers=auth)
    assert ok.status_code == 202


def test_authentication_comes_before_any_body_is_read(hc: FlaskClient) -> None:
    deep = "[" * 100_000 + "]" * 100_000
    for method, path in [("post", "/jobs"), ("post", "/dead-letters/replay"), ("post", "/batches"),
                         ("post", "/schedules"), ("post", "/v2/models/digits/infer"),
                         ("get", "/jobs?limit=abc"), ("get", "/dead-letters?since=x")]:  # fmt: skip
        response = getattr(hc, method)(path, data=deep, content_type="application/json")
        assert response.status_code == 401, (path, response.status_code)
        bad_key = getattr(hc, method)(path, data=deep, content_type="application/json",
                                      headers={"Authorization": "Bearer ik_nope"})  # fmt: skip
        assert bad_key.status_code == 401, (path, bad_key.status_code)


def test_a_finished_jobs_stream_ends_and_an_impossible_id_is_refused(
    client: FlaskClient, tenant: TenantAuth, worker: Any
) -> None:
    auth = tenant.headers
    submitted = client.post("/jobs", json=job(), headers=auth).json
    wait_for_job(client, auth, submitted["id"])
    started = time.monotonic()
    replay = client.get(f"/jobs/{submitted['id']}/events", headers=auth)  # ends by itself
    assert replay.status_code == 200 and time.monotonic() - started < 10
    ids = [int(line[4:]) for line in replay.data.decode().splitlines() if line.startswith("id: ")]
    assert "event: job.succeeded" in replay.data.decode() and len(ids) >= 3
    done = client.get(
        f"/jobs/{submitted['id']}/events", headers={**auth, "Last-Event-ID": str(ids[-1])}
    )
    assert done.status_code == 204 and done.data == b""  # an EventSource stops reconnecting
    later = client.get(
        f"/jobs/{submitted['id']}/events?last_event_id={ids[-1] + 10**9}", headers=auth
    )
    problem(later, 400)
    middle = client.get(
        f"/jobs/{submitted['id']}/events", headers={**auth, "Last-Event-ID": str(ids[0])}
    )
    assert middle.status_code == 200 and "job.succeeded" in middle.data.decode()


def test_waiting_requests_are_bounded_per_tenant_and_in_total(
    hostile_app: Flask, database: Database, tenant: TenantAuth
) -> None:
    """max_waits_per_tenant=2, max_waits=3 in this app; its jobs stay queued."""
    hc = hostile_app.test_client()
    a, b, c = tenant, make_tenant(database), make_tenant(database)
    queued = {t.id: hc.post("/jobs", json=job(), headers=t.headers).json["id"] for t in (a, b, c)}
    stop = threading.Event()
    held: list[int] = []

    def hold(t: TenantAuth) -> None:
        response = hostile_app.test_client().get(f"/jobs/{queued[t.id]}?wait=30", headers=t.headers)
        held.append(response.status_code)

    threads = [threading.Thread(target=hold, args=(t,), daemon=True) for t in (a, a, b)]
    for thread in threads:
        thread.start()
    holds = container_of(hostile_app).parts.limits.holds
    wait_until(lambda: sum(holds._held.values()) == 3, "all three requests to be waiting")
    over_tenant = hc.get(f"/jobs/{queued[a.id]}?wait=5", headers=a.headers)
    body = problem(over_tenant, 429)
    assert "MAX_WAITS_PER_TENANT" in body["detail"] and over_tenant.headers["Retry-After"]
    over_total = hc.get(f"/jobs/{queued[c.id]}?wait=5", headers=c.headers)
    assert "MAX_WAITS" in problem(over_total, 429)["detail"]
    stream = hc.get(f"/jobs/{queued[c.id]}/events", headers=c.headers)
    problem(stream, 429)
    sync = hc.post("/v2/models/digits/infer", headers=c.headers, json={"inputs": [
        {"name": "pixels", "shape": [1, 64], "datatype": "FP32", "data": ROW[0]}]})  # fmt: skip
    problem(sync, 429)
    # Requests that do not wait are never refused: the headroom is kept for them.
    started = time.monotonic()
    assert hc.post("/jobs", json=job(), headers=c.headers).status_code == 202
    assert hc.get(f"/jobs/{queued[c.id]}", headers=c.headers).status_code == 200
    assert hc.get("/v2/health/ready").status_code == 200
    assert time.monotonic() - started < 5
    prefer = hc.post("/jobs", json=job(), headers={**c.headers, "Prefer": "wait=5"})
    assert prefer.status_code == 202 and "Preference-Applied" not in prefer.headers
    for t in (a, b, c):  # finishing the held jobs releases their waits
        hc.post(f"/jobs/{queued[t.id]}/cancel", headers=t.headers)
    for thread in threads:
        thread.join(30)
    assert held == [200, 200, 200]
    again = hc.get(f"/jobs/{queued[a.id]}?wait=1", headers=a.headers)
    assert again.status_code == 200
    stop.set()


def test_a_tenant_s_requests_in_progress_are_bounded_before_their_bodies_are_read(
    make_app: Callable[..., Flask],
    serve: Callable[[Flask], LiveServer],
    database: Database,
    tenant: TenantAuth,
) -> None:
    """MAX_REQUESTS_PER_TENANT=2: two bodies of tenant A that never finish hold two
    requests; A's third is a 429 at once (its body unread), B's is served, and A
    gets its share back when a stuck request ends."""
    app = make_app(max_requests_per_tenant=2, jobs_queue=f"bounded-{uuid.uuid4().hex}")
    server, other = serve(app), make_tenant(database)
    requests = app.extensions[IN_PROGRESS]
    stuck = [_unfinished_post(server.port, tenant) for _ in range(2)]
    try:
        wait_until(lambda: requests._held[tenant.id] == 2, "A's two bodies to be awaited")
        refused = requests_post(server.port, tenant, _JOB)
        assert refused.status == 429, refused.body[:300]
        body = json.loads(refused.body)
        assert body["type"].endswith("/too-many-requests"), body
        assert "MAX_REQUESTS_PER_TENANT" in body["detail"] and refused.retry_after == "1"
        assert requests_post(server.port, other, _JOB).status == 202
    finally:
        stuck.pop().close()
    wait_until(lambda: requests._held[tenant.id] == 1, "a stuck request to end")
    assert requests_post(server.port, tenant, _JOB).status == 202
    stuck.pop().close()


_JOB = json.dumps({"model": "digits", "inputs": {"pixels": [[0.0] * 64]}}).encode()


@dataclass(frozen=True)
class _Answer:
    status: int
    body: bytes
    retry_after: str | None


def requests_post(port: int, auth: TenantAuth, body: bytes) -> _Answer:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("POST", "/jobs", body, {**auth.headers, "Content-Type": "application/json"})
        answer = conn.getresponse()
        return _Answer(answer.status, answer.read(), answer.getheader("Retry-After"))
    finally:
        conn.close()


def _unfinished_post(port: int, auth: TenantAuth) -> socket.socket:
    """A POST /jobs with the tenant's key whose body stops halfway, for ever."""
    conn = socket.create_connection(("127.0.0.1", port))
    head = "".join(f"{k}: {v}\r\n" for k, v in auth.headers.items())
    conn.sendall(f"POST /jobs HTTP/1.1\r\nHost: x\r\n{head}Content-Type: application/json\r\n"
                 f"Content-Length: 100000\r\n\r\n".encode() + b'{"model": ')  # fmt: skip
    return conn


def test_lists_leave_outputs_out_unless_asked(
    client: FlaskClient, tenant: TenantAuth, database: Database, worker: Any
) -> None:
    from sqlalchemy import event

    done = client.post("/jobs", json=job(), headers=tenant.headers).json
    wait_for_job(client, tenant.headers, done["id"])
    statements: list[str] = []

    def record(_conn: Any, _cursor: Any, sql: str, *_: Any) -> None:
        statements.append(sql)

    engine = container_of(client.application).parts.database.engine
    event.listen(engine, "before_cursor_execute", record)
    try:
        plain = client.get("/jobs?limit=200", headers=tenant.headers).json["items"]
    finally:
        event.remove(engine, "before_cursor_execute", record)
    listed = [s for s in statements if "FROM jobs" in s]
    loaded = ("jobs.outputs", "jobs.inputs", "jobs.input_data", "jobs.output_data")
    assert listed and not [s for s in listed if any(column in s for column in loaded)]
    assert plain[0]["id"] == done["id"] and plain[0]["outputs"] is None
    full = client.get("/jobs?include=outputs", headers=tenant.headers).json["items"]
    assert full[0]["outputs"]["label"] == [1] or "label" in full[0]["outputs"]
    assert client.get("/jobs?include=inputs", headers=tenant.headers).status_code == 422
