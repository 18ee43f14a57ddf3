"""API keys: looked up once per few seconds, and a revoked key stops working."""

from __future__ import annotations

import time

import sqlalchemy as sa
from sqlalchemy import event

from app import create_app
from app.config import Settings
from app.db.models import ApiKey
from app.db.session import Database
from tests.conftest import TenantAuth


def test_a_key_is_looked_up_once_per_cache_period(
    settings: Settings, database: Database, tenant: TenantAuth
) -> None:
    app = create_app(settings.with_overrides(api_key_cache_seconds=60))
    client = app.test_client()
    statements: list[str] = []
    engine = app.extensions["database"].engine

    def record(_conn: object, _cursor: object, sql: str, *_: object) -> None:
        statements.append(sql)

    event.listen(engine, "before_cursor_execute", record)
    try:
        for _ in range(5):
            assert client.get("/jobs?limit=1", headers=tenant.headers).status_code == 200
    finally:
        event.remove(engine, "before_cursor_execute", record)
    assert sum("api_keys" in sql for sql in statements) == 1


def test_a_revoked_key_stops_working_once_its_cache_entry_expires(
    settings: Settings, database: Database, tenant: TenantAuth
) -> None:
    app = create_app(settings.with_overrides(api_key_cache_seconds=0.5))
    client = app.test_client()
    assert client.get("/jobs?limit=1", headers=tenant.headers).status_code == 200
    with database.engine.begin() as conn:
        conn.execute(
            sa.update(ApiKey).where(ApiKey.tenant_id == tenant.id).values(revoked_at=sa.func.now())
        )
    time.sleep(0.6)
    refused = client.get("/jobs?limit=1", headers=tenant.headers)
    assert refused.status_code == 401 and refused.content_type == "application/problem+json"


def test_an_unknown_key_is_refused_every_time(settings: Settings) -> None:
    client = create_app(settings).test_client()
    for _ in range(3):
        response = client.get("/jobs", headers={"Authorization": "Bearer ik_not-a-key"})
        assert response.status_code == 401
