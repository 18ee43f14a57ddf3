"""The status page at / and /status.json over HTTP: aggregate numbers for
anyone, equal to the tables; the operator view only with an operator's key
(Bearer, or the sign-in form's session cookie); tenant keys never."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import time
import uuid
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from flask import Flask
from flask.testing import FlaskClient

from app import create_app
from app.platform.database import Database
from app.platform.settings import ROOT, Settings
from app.status.board import DEAD_LETTER_CAP
from app.status.census import WorkerCensus
from app.tenancy.keys import create_operator_key, hash_key, revoke_api_keys
from app.web.context import container_of
from tests.conftest import (
    STAGED,
    TenantAuth,
    WorkerProcess,
    insert_queued_job,
    make_tenant,
)
from tests.status.oracle import as_page, expected_lines, open_dead_letters, shown, table_of
from tests.support import free_port

SAME_SITE = {"Origin": "http://localhost", "Sec-Fetch-Site": "same-origin"}


@pytest.fixture(scope="module")
def status_app(settings: Settings) -> Iterator[Flask]:
    """No caching (every load reads the tables), keys looked up every time."""
    app = create_app(
        settings.with_overrides(
            status_cache_seconds=0, api_key_cache_seconds=0, flower_url="http://127.0.0.1:5555"
        )
    )
    yield app
    container_of(app).parts.database.engine.dispose()


@pytest.fixture
def web(status_app: Flask) -> FlaskClient:
    return status_app.test_client()


@pytest.fixture
def operator_key(database: Database) -> str:
    with database.sessionmaker.begin() as session:
        return create_operator_key(session)


@pytest.fixture
def hidden_model(database: Database, tenant: TenantAuth) -> str:
    """Queued jobs of a model no tenant may list publicly (not in the repository),
    and of a public one."""
    name = f"secret-{uuid.uuid4().hex[:8]}"
    for _ in range(3):
        insert_queued_job(database, tenant.id, model=name, enqueued_seconds_ago=90)
    insert_queued_job(database, tenant.id, model=STAGED)
    return name


def public_models(client: FlaskClient) -> set[str]:
    return {m["name"] for m in client.get("/models").json["models"]}


def test_the_public_page_shows_the_tables_numbers_and_names_only_public_models(
    web: FlaskClient, database: Database, hidden_model: str
) -> None:
    response = web.get("/")
    assert response.status_code == 200 and response.mimetype == "text/html"
    html = response.get_data(as_text=True)
    assert table_of(shown(html)) == as_page(expected_lines(database, public_models(web)))
    assert int(shown(html)[("", "dead-letters")]) == open_dead_letters(database)
    assert hidden_model not in html
    assert 'id="operator"' not in html and 'action="/status/sign-in"' in html
    for link in ('href="/docs"', 'href="/openapi.json"', 'href="http://127.0.0.1:5555"'):
        assert link in html
    assert response.headers["Cache-Control"] == "no-cache"
    assert {"Cookie", "Authorization"} <= set(response.vary)
    assert "frame-ancestors 'none'" in response.headers["Content-Security-Policy"]
    assert "<script" not in html and "http://" not in html.replace("http://127.0.0.1:5555", "")

    body = web.get("/status.json").json
    assert body["operator"] is False and "dead_letters" not in body
    assert "hosts" not in body["workers"]
    assert hidden_model not in json.dumps(body)
    other = [line for line in body["models"] if line["model"] is None]
    assert len(other) == 1 and other[0]["queued"] >= 3
    assert other[0]["oldest_queued_seconds"] >= 0
    assert body["links"] == {"docs": "/docs", "openapi": "/openapi.json",
                             "flower": "http://127.0.0.1:5555"}  # fmt: skip


def test_an_operator_key_shows_every_model_and_the_newest_dead_letters(
    web: FlaskClient, database: Database, hidden_model: str, operator_key: str
) -> None:
    letters = _dead_letters(database, 3)
    bearer = {"Authorization": f"Bearer {operator_key}"}
    response = web.get("/", headers=bearer)
    html = response.get_data(as_text=True)
    assert response.status_code == 200 and 'id="operator"' in html
    assert response.headers["Cache-Control"] == "no-store"
    assert table_of(shown(html)) == as_page(expected_lines(database, None))
    assert hidden_model in html and all(f'data-letter="{i}"' in html for i in letters)

    body = web.get("/status.json", headers=bearer).json
    assert body["operator"] is True and "hosts" in body["workers"]
    ids = [letter["id"] for letter in body["dead_letters"]]
    assert ids[:3] == sorted(letters, reverse=True) and len(ids) <= 20
    newest = body["dead_letters"][0]
    assert newest["kind"] == "job" and newest["error_code"] == "retries_exhausted"
    assert newest["job_id"] and newest["tenant"].startswith("tenant-")
    assert {line["model"] for line in body["models"]} >= {hidden_model, STAGED}


def test_a_tenant_key_never_opens_the_operator_view(web: FlaskClient, auth: dict[str, str]) -> None:
    for path in ("/", "/status.json"):
        refused = web.get(path, headers=auth)
        assert refused.status_code == 403 and refused.mimetype == "application/problem+json"
        wrong = web.get(path, headers={"Authorization": "Bearer ik_not-a-key"})
        assert wrong.status_code == 401 and wrong.mimetype == "application/problem+json"

    key = auth["Authorization"].removeprefix("Bearer ")
    posted = web.post("/status/sign-in", data={"key": key}, headers=SAME_SITE)
    assert posted.status_code == 303 and posted.headers["Location"] == "/"
    page = web.get("/").get_data(as_text=True)
    assert "That is a tenant&#39;s key" in page and 'id="operator"' not in page
    assert web.get("/status.json").json["operator"] is False


def test_the_sign_in_form_sets_a_strict_httponly_cookie_that_holds_no_key(
    web: FlaskClient, operator_key: str
) -> None:
    posted = web.post("/status/sign-in", data={"key": operator_key}, headers=SAME_SITE)
    assert posted.status_code == 303
    cookie = posted.headers["Set-Cookie"]
    flags = {part.strip().split("=")[0].lower() for part in cookie.split(";")[1:]}
    assert {"httponly", "path"} <= flags and "SameSite=Strict" in cookie
    assert "secure" not in flags  # plain HTTP here; see the HTTPS test below
    value = cookie.split(";")[0].split("=", 1)[1]
    assert operator_key not in value and operator_key not in _payload(value)
    assert hash_key(operator_key) in _payload(value)

    page = web.get("/")
    assert 'id="operator"' in page.get_data(as_text=True)
    assert page.headers["Cache-Control"] == "no-store"
    assert web.get("/status.json").json["operator"] is True

    out = web.post("/status/sign-out", headers=SAME_SITE)
    assert out.status_code == 303
    assert 'id="operator"' not in web.get("/").get_data(as_text=True)


def test_behind_the_tls_proxy_the_cookie_is_secure(web: FlaskClient, operator_key: str) -> None:
    posted = web.post("/status/sign-in", data={"key": operator_key},
                      headers={**SAME_SITE, "X-Forwarded-Proto": "https"})  # fmt: skip
    assert "; Secure" in posted.headers["Set-Cookie"]


def test_a_revoked_key_signs_its_sessions_out(
    web: FlaskClient, database: Database, operator_key: str
) -> None:
    web.post("/status/sign-in", data={"key": operator_key}, headers=SAME_SITE)
    assert web.get("/status.json").json["operator"] is True
    with database.sessionmaker.begin() as session:
        assert revoke_api_keys(session, prefix=operator_key[:10], tenant=None)
    assert web.get("/status.json").json["operator"] is False
    assert 'id="operator"' not in web.get("/").get_data(as_text=True)


def test_sign_in_posts_from_another_site_are_refused(web: FlaskClient, operator_key: str) -> None:
    for headers in ({"Origin": "http://evil.example"}, {"Sec-Fetch-Site": "cross-site"},
                    {"Origin": "null"}):  # fmt: skip
        refused = web.post("/status/sign-in", data={"key": operator_key}, headers=headers)
        assert refused.status_code == 403 and refused.mimetype == "application/problem+json"
        assert "Set-Cookie" not in refused.headers
    assert web.get("/status.json").json["operator"] is False


def test_a_wrong_key_in_the_form_says_so(web: FlaskClient) -> None:
    for key in ("iko_wrong", "x" * 5000):
        posted = web.post("/status/sign-in", data={"key": key}, headers=SAME_SITE)
        assert posted.status_code == 303
        assert "That key is not valid" in web.get("/").get_data(as_text=True)


def test_api_processes_without_secret_key_share_the_one_kept_in_var_dir(
    settings: Settings, operator_key: str, tmp_path: Path
) -> None:
    """Two apps stand for two gunicorn processes: a cookie one signs, the other takes."""
    one, two = (create_app(settings.with_overrides(var_dir=tmp_path)) for _ in range(2))
    other = create_app(settings.with_overrides(var_dir=tmp_path, secret_key="another-key"))
    try:
        first = one.test_client()
        first.post("/status/sign-in", data={"key": operator_key}, headers=SAME_SITE)
        cookie = first.get_cookie("status_session")
        assert cookie is not None
        for app, operator in ((two, True), (other, False)):
            client = app.test_client()
            client.set_cookie("status_session", cookie.value)
            assert client.get("/status.json").json["operator"] is operator
        assert (tmp_path / "secret-key").stat().st_mode & 0o777 == 0o600
    finally:
        for app in (one, two, other):
            container_of(app).parts.database.engine.dispose()


def test_processes_starting_at_once_keep_one_secret(tmp_path: Path) -> None:
    path = tmp_path / "var" / "secret-key"
    code = (
        "from pathlib import Path; from app.platform.kept_secrets import kept_secret; "
        f"print(kept_secret(Path({str(path)!r})))"
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True)
        for _ in range(6)
    ]
    secrets = {p.communicate(timeout=60)[0].strip() for p in procs}
    assert len(secrets) == 1 and len(secrets.pop()) >= 40
    assert [p.name for p in path.parent.iterdir()] == ["secret-key"]  # no drafts left


@pytest.mark.processes
def test_the_census_counts_the_workers_of_each_queue(
    settings: Settings, operator_key: str, tmp_path: Path
) -> None:
    own = settings.with_overrides(jobs_queue=f"status-{uuid.uuid4().hex[:8]}",
                                  status_cache_seconds=0)  # fmt: skip
    app = create_app(own)
    bearer = {"Authorization": f"Bearer {operator_key}"}
    try:
        client = app.test_client()
        assert client.get("/status.json").json["workers"]["queues"][own.jobs_queue] == 0
        worker = WorkerProcess(own, tmp_path / "worker.log", concurrency=1)
        try:
            body = client.get("/status.json", headers=bearer).json["workers"]
            assert body["reachable"] is True and body["queues"][own.jobs_queue] == 1
            serving = [h for h in body["hosts"] if own.jobs_queue in h["queues"]]
            assert len(serving) == 1 and serving[0]["hostname"].startswith("test-")
            html = client.get("/").get_data(as_text=True)
            assert shown(html)[(own.jobs_queue, "workers")] == "1"
        finally:
            worker.stop()
        assert client.get("/status.json").json["workers"]["queues"][own.jobs_queue] == 0
    finally:
        container_of(app).parts.database.engine.dispose()


def test_a_broker_that_does_not_answer_is_said_so_quickly(status_app: Flask) -> None:
    dead = f"redis://127.0.0.1:{free_port()}/0"
    census = WorkerCensus(container_of(status_app).parts.celery, dead, ("inference",), ttl_s=0)
    started = time.monotonic()
    answer = census.current()
    assert answer.reachable is False and answer.workers == {}
    assert time.monotonic() - started < 15  # a liveness bound, not a timing claim


def test_the_page_answers_with_the_broker_down(settings: Settings) -> None:
    app = create_app(settings.with_overrides(redis_url=f"redis://127.0.0.1:{free_port()}/0"))
    try:
        response = app.test_client().get("/")
        html = response.get_data(as_text=True)
        assert response.status_code == 200
        assert shown(html)[("", "workers-online")] == "?"
        assert "The broker did not answer" in html
    finally:
        container_of(app).parts.database.engine.dispose()


def test_dead_letters_are_counted_up_to_a_cap(web: FlaskClient, database: Database) -> None:
    tenant = make_tenant(database)
    job = insert_queued_job(database, tenant.id, model=STAGED)
    with database.engine.begin() as conn:
        conn.execute(
            sa.text(
                """
                INSERT INTO dead_letters (job_id, tenant_id, model, model_version, error_code,
                    error_class, message, attempts, first_failed_at, last_failed_at)
                SELECT :job, :tenant, 'staged', '1', 'test', 'Test', '', 1, now(), now()
                FROM generate_series(1, :n)
                """
            ),
            {"job": job, "tenant": tenant.id, "n": DEAD_LETTER_CAP + 5},
        )
    try:
        html = web.get("/").get_data(as_text=True)
        assert shown(html)[("", "dead-letters")] == f"{DEAD_LETTER_CAP}+"
        assert web.get("/status.json").json["dead_letters_open"] == DEAD_LETTER_CAP + 1
    finally:
        with database.engine.begin() as conn:
            conn.execute(sa.text("DELETE FROM dead_letters WHERE tenant_id = :t"),
                         {"t": tenant.id})  # fmt: skip


def test_the_json_twin_is_in_the_openapi_document_and_the_page_is_not(web: FlaskClient) -> None:
    paths = web.get("/openapi.json").json["paths"]
    assert "/status.json" in paths
    assert not {"/", "/status/sign-in", "/status/sign-out"} & set(paths)


def _dead_letters(database: Database, count: int) -> list[int]:
    """Jobs that failed their only attempt, as the worker's finish writes them."""
    tenant = make_tenant(database)
    ids: list[int] = []
    with database.engine.begin() as conn:
        for _ in range(count):
            job = insert_queued_job(database, tenant.id, model=STAGED)
            ids.append(
                conn.execute(
                    sa.text(
                        """
                        INSERT INTO dead_letters (job_id, tenant_id, model, model_version,
                            error_code, error_class, message, attempts, first_failed_at,
                            last_failed_at)
                        VALUES (:job, :tenant, 'staged', '1', 'retries_exhausted',
                                'RuntimeError', 'out of memory', 1, now(), now())
                        RETURNING id
                        """
                    ),
                    {"job": job, "tenant": tenant.id},
                ).scalar_one()
            )
    return ids


def _payload(cookie: str) -> str:
    """The readable part of Flask's signed cookie (itsdangerous: base64 JSON,
    zlib-compressed when it starts with a dot)."""
    data = cookie.split(".")[1] if cookie.startswith(".") else cookie.split(".")[0]
    raw = base64.urlsafe_b64decode(data + "=" * (-len(data) % 4))
    return (zlib.decompress(raw) if cookie.startswith(".") else raw).decode()
