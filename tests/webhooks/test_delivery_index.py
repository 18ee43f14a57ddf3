"""The delivery sweep runs every second: each branch of its query must be an index
range, never a scan of every delivery ever made (EXPLAIN on the real query)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from app.platform.database import Database
from app.platform.settings import Settings
from app.webhooks import delivery
from app.webhooks.delivery import DeliverySettings


def nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from nodes(child)


def test_every_branch_of_take_due_is_an_index_range(database: Database, settings: Settings) -> None:
    captured: list[tuple[str, Any]] = []
    with database.engine.connect() as conn:
        outer = conn.begin()

        @sa.event.listens_for(conn, "before_cursor_execute")
        def capture(_c: Any, _cur: Any, statement: str, params: Any, *_: Any) -> None:
            if "webhook_deliveries" in statement and statement.lstrip().startswith("UPDATE"):
                captured.append((statement, params))

        with Session(bind=conn, join_transaction_mode="create_savepoint") as session:
            delivery.take_due(session, DeliverySettings.of(settings).lease_s)
        [(statement, params)] = captured
        cursor = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
        cursor.execute("SET LOCAL enable_seqscan = off")  # what it would take with many rows
        cursor.execute("EXPLAIN (FORMAT JSON) " + statement, params)
        [(explained,)] = cursor.fetchall()
        [plan] = explained
        outer.rollback()
    scans = [n for n in nodes(plan["Plan"]) if n["Node Type"] in
             ("Seq Scan", "Index Scan", "Index Only Scan", "Bitmap Index Scan")]  # fmt: skip
    described = [(n["Node Type"], n.get("Index Name"), n.get("Index Cond")) for n in scans]
    assert not [n for n in scans if n["Node Type"] == "Seq Scan"], described
    assert all("Index Cond" in n for n in scans), described
    used = {n.get("Index Name") for n in scans}
    assert {"ix_webhook_deliveries_due", "ix_webhook_deliveries_lease"} <= used, described
