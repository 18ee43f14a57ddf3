"""The execute path's guarantees, checked on the database directly.

No worker here: these call the one execute function the Celery task calls,
the way a duplicate or late delivery would.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from flask import Flask
from sqlalchemy import event, select

from app.db.models import Job, Tenant
from app.db.session import Database
from app.jobs import runner, service
from app.jobs.runtime import current_runtime
from app.jobs.transitions import Outcome, claim, finish
from app.tenants import create_api_key

PIXELS = {"pixels": [[0.0] * 64]}


@pytest.fixture
def tenant_id(database: Database) -> int:
    with database.sessionmaker() as session:
        creds = create_api_key(session, f"exec-{uuid.uuid4().hex[:8]}")
        tenant = session.scalar(select(Tenant).where(Tenant.name == creds.tenant))
        assert tenant is not None
        return tenant.id


@pytest.fixture
def queued_job(app: Flask, database: Database, tenant_id: int) -> uuid.UUID:
    """A queued job row (no message published: these tests are the delivery)."""
    with database.sessionmaker() as session:
        job = Job(
            id=uuid.uuid4(),
            tenant_id=tenant_id,
            model="digits",
            model_version="1",
            status="queued",
            inputs=PIXELS,
            attempts=0,
        )
        session.add(job)
        session.commit()
        return job.id


@pytest.fixture
def ctx(app: Flask) -> Iterator[None]:
    with app.app_context():
        yield


def load(database: Database, job_id: uuid.UUID) -> Job:
    with database.sessionmaker() as session:
        job = session.get(Job, job_id)
        assert job is not None
        return job


def test_a_second_delivery_neither_runs_nor_writes(
    ctx: None, database: Database, queued_job: uuid.UUID
) -> None:
    with database.sessionmaker() as session:
        first = runner.execute(session, current_runtime(), [queued_job])
        second = runner.execute(session, current_runtime(), [queued_job])
    assert [o.status for o in first] == ["succeeded"]
    assert second == []
    job = load(database, queued_job)
    assert job.status == "succeeded" and job.attempts == 1


def test_a_stale_attempt_cannot_overwrite_the_result(
    ctx: None, database: Database, queued_job: uuid.UUID
) -> None:
    with database.sessionmaker() as session:
        [claimed] = claim(session, [queued_job])
        stale = Outcome(
            queued_job, claimed.attempt - 1, "failed", error_code="x", error_message="y"
        )
        assert finish(session, [stale]) == set()
        good = Outcome(queued_job, claimed.attempt, "succeeded", outputs={"label": [0]})
        assert finish(session, [good]) == {queued_job}
        assert finish(session, [good]) == set(), "a finished job cannot be finished again"
    assert load(database, queued_job).outputs == {"label": [0]}


def test_concurrent_claims_have_one_winner(
    ctx: None, database: Database, queued_job: uuid.UUID
) -> None:
    wins: list[int] = []
    barrier = threading.Barrier(8)

    def contend() -> None:
        with database.sessionmaker() as session:
            barrier.wait()
            wins.append(len(claim(session, [queued_job])))

    threads = [threading.Thread(target=contend) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(wins) == [0] * 7 + [1]
    assert load(database, queued_job).attempts == 1


def test_a_job_costs_two_small_writes_in_the_worker_and_one_at_submit(
    app: Flask, ctx: None, database: Database, tenant_id: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    statements: list[str] = []

    def record(_conn: Any, _cursor: Any, sql: str, *_: Any) -> None:
        statements.append(sql.split(None, 1)[0].upper())

    published: list[list[uuid.UUID]] = []
    monkeypatch.setattr("app.jobs.dispatch.enqueue", published.append)
    event.listen(database.engine, "before_cursor_execute", record)
    try:
        with database.sessionmaker() as session:
            job = service.submit(
                session, app.extensions["models"], tenant_id, "digits", None, PIXELS
            )
            assert statements == ["INSERT"] and published == [[job.id]]
            statements.clear()
            runner.execute(session, current_runtime(), [job.id])
    finally:
        event.remove(database.engine, "before_cursor_execute", record)
    assert statements == ["UPDATE", "UPDATE"]


def test_a_bad_row_fails_only_its_own_job(ctx: None, database: Database, tenant_id: int) -> None:
    ids = []
    with database.sessionmaker() as session:
        for inputs in (PIXELS, {"pixels": [[0.0] * 63]}, PIXELS):  # the middle one slipped through
            job = Job(
                id=uuid.uuid4(),
                tenant_id=tenant_id,
                model="digits",
                model_version="1",
                status="queued",
                inputs=inputs,
                attempts=0,
            )
            session.add(job)
            ids.append(job.id)
        session.commit()
        outcomes = runner.execute(session, current_runtime(), ids)
    assert [o.status for o in outcomes] == ["succeeded", "failed", "succeeded"]
    bad = load(database, ids[1])
    assert bad.status == "failed" and bad.error_code == "inference_error"
    assert "pixels" in (bad.error_message or "") or "dimension" in (bad.error_message or "").lower()


def test_a_job_for_a_removed_model_fails_clearly(
    ctx: None, database: Database, tenant_id: int
) -> None:
    with database.sessionmaker() as session:
        job = Job(
            id=uuid.uuid4(),
            tenant_id=tenant_id,
            model="retired",
            model_version="3",
            status="queued",
            inputs=PIXELS,
            attempts=0,
        )
        session.add(job)
        session.commit()
        [outcome] = runner.execute(session, current_runtime(), [job.id])
    assert outcome.status == "failed" and outcome.error_code == "model_unavailable"
    assert load(database, job.id).error_message == outcome.error_message
