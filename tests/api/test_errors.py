"""Every error is RFC 9457 problem+json that names what was wrong and what was expected.

Bad input is refused at submit time, so no job is created for it.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from typing import Any

import pytest
import redis
from flask import Flask
from flask.testing import FlaskClient
from sqlalchemy import func, select, text

from app import create_app
from app.jobs.tables import Job
from app.platform.database import Database
from app.platform.settings import Settings
from tests.conftest import TenantAuth

PIXELS = [[0.0] * 64]


def problem(response: Any, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.get_data(as_text=True)
    assert response.content_type == "application/problem+json"
    body: dict[str, Any] = response.json
    assert body["status"] == status
    assert body["type"] == f"/problems/{code}"
    assert body["title"] and body["detail"]
    return body


def job_count(database: Database) -> int:
    with database.sessionmaker() as session:
        return session.scalar(select(func.count()).select_from(Job)) or 0


@pytest.mark.parametrize(
    "headers",
    [{}, {"Authorization": "Bearer ik_not-a-real-key"}, {"Authorization": "Basic dXNlcjpwdw=="}],
    ids=["missing", "unknown key", "wrong scheme"],
)
def test_job_routes_need_a_valid_key(client: FlaskClient, headers: dict[str, str]) -> None:
    for method, url in [
        ("get", "/jobs"),
        ("post", "/jobs"),
        ("get", f"/jobs/{'0' * 8}-0000-0000-0000-{'0' * 12}"),
    ]:
        response = getattr(client, method)(
            url, headers=headers, json={"model": "digits", "inputs": {}}
        )
        body = problem(response, 401, "unauthorized")
        assert "Bearer" in response.headers["WWW-Authenticate"]
        assert "Authorization" in body["detail"] or "API key" in body["detail"]


def test_unknown_model_is_404_and_lists_known_models(
    client: FlaskClient, auth: dict[str, str]
) -> None:
    body = problem(
        client.post("/jobs", json={"model": "nope", "inputs": {}}, headers=auth),
        404,
        "unknown-model",
    )
    assert "nope" in body["detail"]
    assert "digits" in body["known_models"]


def test_unknown_version_is_404(client: FlaskClient, auth: dict[str, str]) -> None:
    response = client.post(
        "/jobs",
        json={"model": "digits", "version": "9", "inputs": {"pixels": PIXELS}},
        headers=auth,
    )
    body = problem(response, 404, "unknown-model")
    assert "version '9'" in body["detail"] and body["known_models"] == ["digits:1"]


@pytest.mark.parametrize(
    ("inputs", "field", "needle"),
    [
        ({"image": PIXELS}, "image", "no input 'image'"),
        ({"image": PIXELS}, "pixels", "missing"),
        ({"pixels": [[0.0] * 63]}, "pixels", "shape [1, 63]"),
        ({"pixels": [0.0] * 64}, "pixels", "shape [64]"),
        ({"pixels": [["a"] * 64]}, "pixels", "only numbers"),
        ({"pixels": [[0.0] * 64, [0.0] * 3]}, "pixels", "ragged"),
        ({"pixels": []}, "pixels", "shape [0]"),
        ("pixels", "inputs", "expected an object"),
        (
            [{"name": "pixels", "shape": [1, 64], "datatype": "INT64", "data": [0] * 64}],
            "pixels",
            "expected FP32",
        ),
        (
            [{"name": "pixels", "shape": [2, 64], "datatype": "FP32", "data": [0] * 64}],
            "pixels",
            "needs 128",
        ),
        ([{"name": "pixels"}], "inputs[0]", "name, shape, datatype and data"),
    ],
    ids=[
        "unknown name",
        "missing input",
        "wrong width",
        "missing batch dim",
        "strings",
        "ragged",
        "empty",
        "not an object",
        "v2 wrong datatype",
        "v2 wrong shape",
        "v2 incomplete",
    ],
)
def test_inputs_that_do_not_match_the_model_are_422_at_submit(
    client: FlaskClient,
    auth: dict[str, str],
    database: Database,
    inputs: Any,
    field: str,
    needle: str,
) -> None:
    before = job_count(database)
    response = client.post("/jobs", json={"model": "digits", "inputs": inputs}, headers=auth)
    body = problem(response, 422, "invalid-input")
    assert needle in body["errors"][field], body
    assert body["expected"] == [{"name": "pixels", "datatype": "FP32", "shape": [-1, 64]}]
    if field == "pixels" and needle.startswith("shape"):
        assert "FP32 tensor of shape [any, 64]" in body["errors"]["pixels"]
    assert job_count(database) == before, "a refused submission must not create a job"


def test_missing_fields_are_422_naming_the_field(client: FlaskClient, auth: dict[str, str]) -> None:
    body = problem(client.post("/jobs", json={"inputs": {}}, headers=auth), 422, "validation-error")
    assert "model" in body["errors"]
    assert "model" in body["detail"]


def test_malformed_json_is_400(client: FlaskClient, auth: dict[str, str]) -> None:
    response = client.post(
        "/jobs", data='{"model": "digits", ', headers=auth, content_type="application/json"
    )
    body = problem(response, 400, "malformed-request")
    assert "JSON" in body["detail"]


def test_body_over_the_limit_is_413(client: FlaskClient, auth: dict[str, str], app: Flask) -> None:
    limit = app.config["MAX_CONTENT_LENGTH"]
    big = b'{"model": "digits", "inputs": {"pixels": [[' + b"0," * (limit // 2) + b"0]]}}"
    assert len(big) > limit
    response = client.post("/jobs", data=big, headers=auth, content_type="application/json")
    body = problem(response, 413, "payload-too-large")
    assert "MAX_REQUEST_BYTES" in body["detail"] or "large" in body["detail"].lower()


def test_bad_list_arguments_are_422(client: FlaskClient, auth: dict[str, str]) -> None:
    body = problem(client.get("/jobs?status=bogus", headers=auth), 422, "validation-error")
    assert "status" in body["errors"]
    body = problem(client.get("/jobs?cursor=%%%", headers=auth), 422, "validation-error")
    assert "cursor" in body["errors"]


def test_unknown_route_and_method(client: FlaskClient) -> None:
    problem(client.get("/nope"), 404, "not-found")
    problem(client.delete("/models"), 405, "method-not-allowed")


def test_problem_types_are_documented(client: FlaskClient, auth: dict[str, str]) -> None:
    body = problem(
        client.post("/jobs", json={"model": "nope", "inputs": {}}, headers=auth),
        404,
        "unknown-model",
    )
    doc = client.get(body["type"])
    assert doc.status_code == 200 and doc.json["status"] == 404 and doc.json["description"]


def test_a_full_database_disk_is_503_naming_it(
    client: FlaskClient, auth: dict[str, str], tenant: TenantAuth, database: Database
) -> None:
    """PostgreSQL out of disk space (SQLSTATE 53100, psycopg2's DiskFull: a table
    it cannot extend) is a 503 that says so, with Retry-After, and keeps nothing;
    the error is raised by a trigger on this tenant's inserts only, so the same
    real error reaches the API without filling a disk."""
    name = f"disk_full_{tenant.id}"
    with database.engine.begin() as conn:
        conn.execute(text(
            f"CREATE FUNCTION {name}() RETURNS trigger AS $$ BEGIN RAISE EXCEPTION USING "
            "ERRCODE = '53100', MESSAGE = 'could not extend file \"base/1/2\": No space left "
            f"on device'; END $$ LANGUAGE plpgsql; CREATE TRIGGER {name} BEFORE INSERT ON jobs "
            f"FOR EACH ROW WHEN (NEW.tenant_id = {tenant.id}) EXECUTE FUNCTION {name}()"
        ))  # fmt: skip
    try:
        before = job_count(database)
        body = {"model": "digits", "inputs": {"pixels": PIXELS}}
        response = client.post("/jobs", json=body, headers=auth)
    finally:
        with database.engine.begin() as conn:
            conn.execute(text(f"DROP TRIGGER {name} ON jobs; DROP FUNCTION {name}()"))
    refused = problem(response, 503, "service-unavailable")
    assert "disk is full" in refused["detail"], refused
    assert int(response.headers["Retry-After"]) > 0
    assert job_count(database) == before


def test_redis_not_answering_is_503_not_an_internal_error(settings: Settings) -> None:
    """Redis restarting closes each connection as it opens (what a process saw
    through a proxy while Redis restarted, before its reply subscriber noticed):
    whatever route was using it answers 503 with Retry-After, not 500."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def close_each() -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = listener.accept()
                conn.close()

    threading.Thread(target=close_each, daemon=True).start()
    app = create_app(settings)

    @app.get("/redis-probe")
    def probe() -> str:
        redis.Redis(port=port, socket_timeout=2).ping()
        return "unreachable"

    try:
        response = app.test_client().get("/redis-probe")
    finally:
        listener.close()
    body = problem(response, 503, "service-unavailable")
    assert "Redis" in body["detail"] and response.headers["Retry-After"] == "2"
