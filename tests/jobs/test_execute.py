"""The execute path's guarantees, checked on the database directly.

No worker here: these call the one execute function the Celery task calls,
the way a duplicate or late delivery would.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from flask import Flask
from sqlalchemy import event

from app.jobs import telemetry
from app.jobs.claims import claim
from app.jobs.transitions import Outcome, finish
from app.operations import JobRequest
from app.platform.database import Database
from app.web.context import container_of, services
from tests.conftest import TenantAuth, insert_queued_job, load_job, outputs_of, packed
from tests.support import FakeClock, execute

PIXELS = {"pixels": [[0.0] * 64]}


@pytest.fixture
def queued_job(database: Database, tenant: TenantAuth) -> uuid.UUID:
    return insert_queued_job(database, tenant.id)


@pytest.fixture
def ctx(app: Flask) -> Iterator[None]:
    with app.app_context():
        yield


def test_a_second_delivery_neither_runs_nor_writes(
    ctx: None, database: Database, queued_job: uuid.UUID
) -> None:
    first = execute(services(), [queued_job])
    second = execute(services(), [queued_job])
    assert [o.status for o in first] == ["succeeded"]
    assert second == []
    job = load_job(database, queued_job)
    assert job.status == "succeeded" and job.attempts == 1


def test_a_stale_attempt_cannot_overwrite_the_result(
    ctx: None, database: Database, queued_job: uuid.UUID
) -> None:
    with database.sessionmaker() as session:
        [claimed] = claim(session, [queued_job], lease_s=60)
        stale = Outcome(queued_job, claimed.attempt - 1, "failed", error_code="x")
        assert finish(session, [stale]) == set()
        good = Outcome(queued_job, claimed.attempt, "succeeded", output_data=packed(label=0))
        assert finish(session, [good]) == {queued_job}
        assert finish(session, [good]) == set(), "a finished job cannot be finished again"
        session.commit()
    assert outputs_of(load_job(database, queued_job)) == {"label": [0]}


def test_concurrent_claims_have_one_winner(
    ctx: None, database: Database, queued_job: uuid.UUID
) -> None:
    wins: list[int] = []
    barrier = threading.Barrier(8)

    def contend() -> None:
        with database.sessionmaker() as session:
            barrier.wait()
            wins.append(len(claim(session, [queued_job], lease_s=60)))
            session.commit()

    threads = [threading.Thread(target=contend) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(wins) == [0] * 7 + [1]
    assert load_job(database, queued_job).attempts == 1


def test_a_job_costs_two_small_writes_in_the_worker_and_one_at_submit(
    make_app: Callable[..., Flask],
    clock: FakeClock,
    tenant: TenantAuth,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    statements: list[str] = []

    def record(_conn: Any, _cursor: Any, sql: str, *_: Any) -> None:
        statements.append(" ".join(sql.split()).upper())

    woken: list[str] = []

    def wake(_self: object, model: str, force: bool = False) -> bool:
        woken.append(model)
        return True

    monkeypatch.setattr("app.execution.dispatch.Dispatcher.wake", wake)
    # Its own app on a clock that stands still: no cached reading expires mid-test.
    container = container_of(make_app(clock=clock))
    engine = container.parts.database.engine  # the operations', and their job writer's
    with container.scope() as session:  # the queue bound's reading, taken at most
        container.parts.limits.admission.admit(session, "digits", 0)  # every 0.5 s per model
        container.parts.limits.quotas.admit_jobs(session, tenant.id, 1)  # and the tenant's quotas
        container.parts.repository.resolve("digits")  # and the shared model states, every 2 s
        telemetry.tenant_name(session, tenant.id)  # and its name, once per worker process
    event.listen(engine, "before_cursor_execute", record)
    try:
        with container.scope() as session:
            job = container.jobs.submit(tenant.ref, JobRequest("digits", PIXELS))
            assert [q.split()[0] for q in statements] == ["INSERT"]
            assert woken == ["digits"]
            statements.clear()
            execute(container, [job.id])
    finally:
        event.remove(engine, "before_cursor_execute", record)
    # Two round trips: the claim, then the finish (one statement that also writes a
    # dead letter when the job failed), prepared once on a connection new to it.
    prepared = [q for q in statements if q.startswith("PREPARE ")]
    assert len(statements) - len(prepared) == 2, statements
    assert statements[0].startswith("UPDATE JOBS SET STATUS = 'RUNNING'")
    assert statements[-1].startswith("EXECUTE FINISH (")
    assert [q.split()[1] for q in prepared] in ([], ["FINISH"])
    assert all("UPDATE JOBS AS J SET" in q for q in prepared)


def test_a_bad_row_fails_only_its_own_job(
    ctx: None, database: Database, tenant: TenantAuth
) -> None:
    slipped_through = {"pixels": [[0.0] * 63]}
    ids = [
        insert_queued_job(database, tenant.id, inputs)
        for inputs in (PIXELS, slipped_through, PIXELS)
    ]
    outcomes = execute(services(), ids)
    assert [o.status for o in outcomes] == ["succeeded", "failed", "succeeded"]
    bad = load_job(database, ids[1])
    assert bad.status == "failed" and bad.error_code == "inference_error"
    assert "pixels" in (bad.error_message or "") or "dimension" in (bad.error_message or "").lower()


def test_a_job_for_a_removed_model_fails_clearly(
    ctx: None, database: Database, tenant: TenantAuth
) -> None:
    job_id = insert_queued_job(database, tenant.id, model="retired")
    [outcome] = execute(services(), [job_id])
    assert outcome.status == "failed" and outcome.error_code == "model_unavailable"
    assert load_job(database, job_id).error_message == outcome.error_message
