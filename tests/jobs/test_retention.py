"""Retention beyond inputs and outputs: the logs every job leaves (events, webhook
payloads, delivery attempts, dead letters, audit rows) are pruned by the purge
sweep, each after its own setting, in bounded batches."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from flask import Flask

from app.container import Container
from app.jobs import retention
from app.platform.database import Database
from app.platform.settings import Settings
from app.tenancy import keys
from app.web.context import container_of
from tests.conftest import TenantAuth, insert_queued_job

DAY = 24 * 3600.0


@pytest.fixture
def ctx(app: Flask) -> Iterator[None]:
    with app.app_context():
        yield


def run(database: Database, sql: str, **params: Any) -> Any:
    with database.engine.begin() as conn:
        return conn.execute(sa.text(sql), params)


def count(database: Database, sql: str, **params: Any) -> int:
    with database.engine.connect() as conn:
        value: int = conn.execute(sa.text(sql), params).scalar_one()
    return value


def purge(settings: Settings) -> dict[str, Any]:
    """One purge run, as the control worker's is, with these settings."""
    container = Container(settings)
    try:
        with container.scope():
            return container.worker.maintenance.purge()
    finally:
        container.close()


def delivery(database: Database, tenant: TenantAuth, job_id: uuid.UUID, status: str,
             age_days: float) -> int:  # fmt: skip
    row = run(
        database,
        "INSERT INTO webhook_deliveries (job_id, tenant_id, event_type, message_id, url, "
        "payload, status, created_at) VALUES (:j, :t, 'job.succeeded', :m, 'https://x.test/', "
        "'{\"outputs\": 1}', :s, now() - make_interval(days => :age)) RETURNING id",
        j=job_id, t=tenant.id, m=f"msg_{uuid.uuid4().hex}", s=status, age=age_days,
    ).scalar_one()  # fmt: skip
    run(database, "INSERT INTO webhook_attempts (delivery_id, url, status_code, at) "
        "VALUES (:d, 'https://x.test/', 200, now() - make_interval(days => :age))",
        d=row, age=age_days)  # fmt: skip
    delivery_id: int = row
    return delivery_id


def dead_letter(database: Database, tenant: TenantAuth, job_id: uuid.UUID, age_days: float,
                delivery_id: int | None = None) -> None:  # fmt: skip
    run(
        database,
        "INSERT INTO dead_letters (job_id, tenant_id, model, model_version, error_code, "
        "error_class, message, attempts, first_failed_at, last_failed_at, created_at, "
        "delivery_id) VALUES (:j, :t, 'staged', '1', 'x', 'X', 'x', 1, now(), now(), "
        "now() - make_interval(days => :age), :d)",
        j=job_id, t=tenant.id, age=age_days, d=delivery_id,
    )  # fmt: skip


def test_logs_are_pruned_each_after_its_retention(
    ctx: None, app: Flask, database: Database, tenant: TenantAuth
) -> None:
    settings: Settings = container_of(app).settings.with_overrides(
        job_event_retention_seconds=30 * DAY, webhook_payload_retention_seconds=7 * DAY,
        webhook_log_retention_seconds=30 * DAY, dead_letter_retention_seconds=90 * DAY,
        audit_retention_seconds=365 * DAY,
    )  # fmt: skip
    old_job, new_job = (
        insert_queued_job(database, tenant.id),
        insert_queued_job(database, tenant.id),
    )
    run(database, "UPDATE job_events SET at = now() - interval '31 days' WHERE job_id = :j",
        j=old_job)  # fmt: skip
    kept_payload = delivery(database, tenant, new_job, "delivered", 1)
    cleared_payload = delivery(database, tenant, new_job, "delivered", 8)
    pending_old = delivery(database, tenant, new_job, "pending", 40)  # still being retried
    gone = delivery(database, tenant, old_job, "delivered", 31)
    lettered = delivery(database, tenant, old_job, "failed", 31)  # kept with its letter
    dead_letter(database, tenant, old_job, 10, lettered)
    dead_letter(database, tenant, old_job, 91)
    for age in (1, 366):
        run(database, "INSERT INTO audit_events (tenant_id, action, subject, at) VALUES "
            "(:t, 'test.retention', 'x', now() - make_interval(days => :age))",
            t=tenant.id, age=age)  # fmt: skip

    result = purge(settings)

    assert count(database, "SELECT count(*) FROM job_events WHERE job_id = :j", j=old_job) == 0
    assert count(database, "SELECT count(*) FROM job_events WHERE job_id = :j", j=new_job) >= 1
    payloads = dict(
        run(database, "SELECT id, payload IS NOT NULL FROM webhook_deliveries "
            "WHERE tenant_id = :t", t=tenant.id).all()
    )  # fmt: skip
    assert payloads == {kept_payload: True, cleared_payload: False, pending_old: True,
                        lettered: False}, payloads  # fmt: skip
    assert gone not in payloads
    attempts = "SELECT count(*) FROM webhook_attempts WHERE delivery_id = :d"
    assert count(database, attempts, d=gone) == 0
    assert count(database, attempts, d=kept_payload) == 1
    assert count(database, "SELECT count(*) FROM dead_letters WHERE tenant_id = :t",
                 t=tenant.id) == 1  # fmt: skip
    assert count(database, "SELECT count(*) FROM audit_events WHERE tenant_id = :t",
                 t=tenant.id) == 1  # fmt: skip
    assert result["job_events"] >= 1 and result["webhook_deliveries"] >= 1


def test_pruning_goes_in_bounded_batches(
    monkeypatch: pytest.MonkeyPatch, ctx: None, app: Flask, database: Database,
    tenant: TenantAuth,
) -> None:  # fmt: skip
    monkeypatch.setattr(retention, "BATCH", 3)
    monkeypatch.setattr(retention, "MAX_BATCHES", 2)
    for _ in range(10):
        run(database, "INSERT INTO audit_events (tenant_id, action, subject, at) VALUES "
            "(:t, 'test.batches', 'x', now() - interval '400 days')", t=tenant.id)  # fmt: skip
    rule = retention.Rule("audit_events", "audit_events", "at", f"tenant_id = {tenant.id}")
    container = container_of(app)
    with container.scope():
        maintenance = container.worker.maintenance
        assert maintenance.prune(rule, 365 * DAY) == 6  # two batches of three, per run
        assert maintenance.prune(rule, 365 * DAY) == 4
        assert maintenance.prune(rule, 365 * DAY) == 0


def test_a_rotated_out_webhook_secret_is_erased_when_its_overlap_ends(
    database: Database, tenant: TenantAuth
) -> None:
    from app.tenancy.keys import rotate_webhook_secret
    from app.tenancy.tables import Tenant

    with database.sessionmaker() as session:
        name = session.scalar(sa.select(Tenant.name).where(Tenant.id == tenant.id))
        other = session.scalar(sa.select(Tenant.name).where(Tenant.id != tenant.id).limit(1))
        rotate_webhook_secret(session, str(name), overlap_hours=24)
        if other is not None:
            rotate_webhook_secret(session, str(other), overlap_hours=24)
        session.execute(
            sa.update(Tenant).where(Tenant.id == tenant.id)
            .values(previous_secret_expires_at=sa.func.now() - sa.text("interval '1 second'"))
        )  # fmt: skip
        session.commit()
        assert keys.forget_previous_secrets(session) >= 1  # others of this run may expire too
        session.commit()
        mine = session.get(Tenant, tenant.id)
        assert mine is not None and mine.previous_webhook_secret is None
        if other is not None:  # still within its overlap: kept
            kept = session.scalar(sa.select(Tenant).where(Tenant.name == other))
            assert kept is not None and kept.previous_webhook_secret is not None


def finished(database: Database, tenant: TenantAuth, age_days: float, status: str = "succeeded",
             batch: uuid.UUID | None = None) -> uuid.UUID:  # fmt: skip
    """A job that ended `status` `age_days` ago (its events with it), in `batch`."""
    job_id = insert_queued_job(database, tenant.id)
    run(database, "UPDATE jobs SET status = :s, finished_at = now() - make_interval(days => :age), "
        "batch_id = :b, batch_index = CASE WHEN CAST(:b AS uuid) IS NULL THEN NULL ELSE "
        "(SELECT count(*) FROM jobs WHERE batch_id = :b) END WHERE id = :j",
        s=status, age=age_days, b=batch, j=job_id)  # fmt: skip
    return job_id


def finished_batch(database: Database, tenant: TenantAuth, age_days: float) -> uuid.UUID:
    batch_id = uuid.uuid4()
    run(database, "INSERT INTO batches (id, tenant_id, model, model_version, status, chunk_rows, "
        "finished_at) VALUES (:id, :t, 'staged', '1', 'succeeded', 1, "
        "now() - make_interval(days => :age))", id=batch_id, t=tenant.id, age=age_days)  # fmt: skip
    return batch_id


def jobs_left(database: Database, job_ids: list[uuid.UUID]) -> set[uuid.UUID]:
    with database.engine.connect() as conn:
        return set(conn.execute(sa.text("SELECT id FROM jobs WHERE id = ANY(:ids)"),
                                {"ids": job_ids}).scalars())  # fmt: skip


def test_finished_jobs_and_batches_are_deleted_with_what_hangs_on_them_after_their_retention(
    app: Flask, database: Database, tenant: TenantAuth
) -> None:
    settings: Settings = container_of(app).settings.with_overrides(
        job_retention_seconds=30 * DAY, dead_letter_retention_seconds=90 * DAY
    )
    old, recent = finished(database, tenant, 31), finished(database, tenant, 29)
    old_failed = finished(database, tenant, 40, "failed")
    lettered = finished(database, tenant, 40, "failed")  # kept while its letter is
    dead_letter(database, tenant, lettered, 40)
    unfinished = insert_queued_job(database, tenant.id)
    run(database, "UPDATE jobs SET created_at = now() - interval '60 days' WHERE id = :j",
        j=unfinished)  # fmt: skip
    gone_delivery = delivery(database, tenant, old, "delivered", 1)
    run(database, "INSERT INTO idempotency_keys (tenant_id, key, request_hash, job_id) "
        "VALUES (:t, :k, 'x', :j)", t=tenant.id, k=f"key-{uuid.uuid4().hex}", j=old)  # fmt: skip
    old_batch, new_batch = finished_batch(database, tenant, 31), finished_batch(database, tenant, 2)
    old_chunks = [finished(database, tenant, 31, batch=old_batch) for _ in range(3)]
    new_chunks = [finished(database, tenant, 31, batch=new_batch) for _ in range(2)]

    result = purge(settings)

    mine = [old, recent, old_failed, lettered, unfinished, *old_chunks, *new_chunks]
    assert jobs_left(database, mine) == {recent, lettered, unfinished, *new_chunks}
    assert count(database, "SELECT count(*) FROM job_events WHERE job_id = ANY(:j)",
                 j=[old, old_failed, *old_chunks]) == 0  # fmt: skip
    assert count(database, "SELECT count(*) FROM job_events WHERE job_id = :j", j=recent) >= 1
    assert count(database, "SELECT count(*) FROM webhook_deliveries WHERE id = :d",
                 d=gone_delivery) == 0  # fmt: skip
    assert count(database, "SELECT count(*) FROM webhook_attempts WHERE delivery_id = :d",
                 d=gone_delivery) == 0  # fmt: skip
    assert count(database, "SELECT count(*) FROM idempotency_keys WHERE job_id = :j", j=old) == 0
    batches = count(database, "SELECT count(*) FROM batches WHERE id = ANY(:b)",
                    b=[old_batch, new_batch])  # fmt: skip
    assert batches == 1 and jobs_left(database, new_chunks) == set(new_chunks)
    assert result["jobs"] >= 5 and result["batches"] >= 1


def test_deleting_old_jobs_goes_in_bounded_pieces(
    monkeypatch: pytest.MonkeyPatch, app: Flask, database: Database, tenant: TenantAuth
) -> None:
    monkeypatch.setattr(retention, "BATCH", 3)
    monkeypatch.setattr(retention, "MAX_BATCHES", 2)
    jobs = [finished(database, tenant, 400) for _ in range(8)]
    container = container_of(app)
    with container.scope():
        maintenance = container.worker.maintenance
        runs = [maintenance.delete_old_rows(365 * DAY)["jobs"] for _ in range(3)]
    # Two pieces of three a run; other tests' jobs are younger than a year.
    assert runs == [6, 2, 0]
    assert jobs_left(database, jobs) == set()


def test_the_oldest_finished_jobs_are_found_by_an_index_range(database: Database) -> None:
    with database.engine.connect() as conn, conn.begin():
        conn.execute(sa.text("SET LOCAL enable_seqscan = off"))  # as with many rows
        plan = conn.execute(
            sa.text("EXPLAIN (FORMAT JSON) " + retention._OLDEST_FINISHED),
            {"age": 30 * DAY, "terminal": ["succeeded"], "limit": 500},
        ).scalar_one()  # fmt: skip
    found = {node.get("Index Name") for node in nodes(plan[0]["Plan"])}
    assert "ix_jobs_finished" in found, plan


def nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from nodes(child)


def test_the_purge_runs_as_often_as_purge_interval_seconds_says(settings: Settings) -> None:
    """A run deletes at most MAX_BATCHES pieces of each kind, so a service finishing
    more jobs than that an hour sets the purge to run more often."""
    from app.execution.dispatch import PURGE_TASK
    from app.parts import beat_schedule

    often = beat_schedule(settings.with_overrides(purge_interval_seconds=60.0))
    purge = next(entry for entry in often.values() if entry["task"] == PURGE_TASK)
    assert purge["schedule"] == 60.0
    assert purge["options"]["expires"] == 120  # one pending message at most, as every sweep
    hourly = beat_schedule(settings)
    assert next(e for e in hourly.values() if e["task"] == PURGE_TASK)["schedule"] == 3600.0
    per_run = retention.BATCH * retention.MAX_BATCHES
    assert per_run / 3600 > 270 and per_run / 60 > 16_000  # what the setting's help says
