"""Alembic: one head, and the migrations create exactly what the models declare."""

from __future__ import annotations

import psycopg2
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory

from app.platform.database import Database
from app.platform.migrate import alembic_config
from app.schema import metadata


def test_one_head() -> None:
    script = ScriptDirectory.from_config(alembic_config("unused"))
    assert len(script.get_heads()) == 1


def test_models_match_the_migrated_schema(database: Database) -> None:
    with database.engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), metadata)
    assert diff == [], f"models and migrations differ; write a migration: {diff}"


def test_keys_are_stored_hashed(database: Database, auth: dict[str, str]) -> None:
    key = auth["Authorization"].removeprefix("Bearer ")
    with database.engine.connect() as conn:
        stored = conn.execute(sa.text("SELECT key_hash, prefix FROM api_keys")).all()
    assert stored, "the auth fixture made a key"
    assert all(key not in row.key_hash for row in stored)
    assert any(key.startswith(row.prefix) and len(row.prefix) < 12 for row in stored)


def test_a_pinged_connection_holds_no_transaction(database: Database) -> None:
    """The idle ping must not leave a transaction open: the event listener then
    cannot switch to autocommit, and now() would be the ping's time."""
    fresh = Database(database.engine.url.render_as_string(hide_password=False))
    raw = fresh.engine.raw_connection()  # a new connection has never been used: pinged
    try:
        assert raw.driver_connection.status == psycopg2.extensions.STATUS_READY
    finally:
        raw.close()
        fresh.engine.dispose()
