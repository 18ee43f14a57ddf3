"""Leases, retries, dead letters, deadlines and retention, on the database itself.

These call the execute path and the sweeps the way a worker and beat would,
in this process, so each race or crash can be staged exactly.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
from flask import Flask
from sqlalchemy import select, text

from app.execution.runner import Runner
from app.jobs import claims, transitions
from app.jobs.guards import ALL_ON, Guards
from app.jobs.tables import DeadLetter
from app.operations.maintenance import Maintenance, MaintenanceSettings
from app.platform.database import Database
from app.web.context import container_of, services
from tests.conftest import STAGED, TenantAuth, insert_queued_job, load_job, outputs_of, packed
from tests.models import HUGE
from tests.support import execute

SLOW = {"x": [[0.1] * 64]}


@pytest.fixture
def ctx(app: Flask) -> Iterator[None]:
    with app.app_context():
        yield


def runner_with(guards: Guards = ALL_ON, **settings: Any) -> Runner:
    """The container's runner with other guards, or other `RunSettings`."""
    base = services().parts.runner
    return replace(base, guards=guards, settings=replace(base.settings, **settings))


def letters_for(database: Database, job_id: uuid.UUID) -> list[DeadLetter]:
    with database.sessionmaker() as session:
        return list(session.scalars(select(DeadLetter).where(DeadLetter.job_id == job_id)))


def update_job(database: Database, job_id: uuid.UUID, assignment: str, **params: Any) -> None:
    """Stage a job's state directly: `assignment` is the SET clause."""
    with database.engine.begin() as conn:
        conn.execute(text(f"UPDATE jobs SET {assignment} WHERE id = :id"), {"id": job_id, **params})


def make_due(database: Database, job_id: uuid.UUID) -> None:
    update_job(database, job_id, "run_after = now()")


def expire_lease(database: Database, job_id: uuid.UUID) -> None:
    update_job(database, job_id, "lease_expires_at = now() - interval '1 second'")


def set_cap(database: Database, job_id: uuid.UUID, cap: int) -> None:
    update_job(database, job_id, "max_attempts = :cap", cap=cap)


def test_out_of_memory_is_retried_with_backoff_then_dead_lettered(
    ctx: None, database: Database, tenant: TenantAuth
) -> None:
    job_id = insert_queued_job(database, tenant.id, {"n": [HUGE]}, model="memhog")
    set_cap(database, job_id, 2)
    [first] = execute(services(), [job_id])
    assert first.status == "retry" and first.error_code == "resource_exhausted"
    assert "Failed to allocate memory" in (first.error_message or "")
    job = load_job(database, job_id)
    assert job.status == "queued" and job.attempts == 1 and job.enqueued_at is None
    assert job.run_after > job.started_at  # waits out its backoff before being sent again
    assert execute(services(), [job_id]) == [], "not due yet"

    make_due(database, job_id)
    [second] = execute(services(), [job_id])
    assert second.status == "failed" and second.error_code == "retries_exhausted"
    job = load_job(database, job_id)
    assert job.status == "failed" and job.attempts == 2
    [letter] = letters_for(database, job_id)
    assert letter.error_code == "retries_exhausted" and letter.attempts == 2
    assert letter.error_class == "Fail" and "Traceback" in (letter.traceback or "")
    assert letter.first_failed_at < letter.last_failed_at


def test_a_permanent_error_fails_at_once_with_a_dead_letter(
    ctx: None, database: Database, tenant: TenantAuth
) -> None:
    job_id = insert_queued_job(database, tenant.id, {"pixels": [[0.0] * 63]})
    [outcome] = execute(services(), [job_id])
    assert outcome.status == "failed" and outcome.error_code == "inference_error"
    assert load_job(database, job_id).attempts == 1
    [letter] = letters_for(database, job_id)
    assert letter.error_code == "inference_error" and letter.attempts == 1


def test_a_dead_workers_job_is_queued_again_then_capped(
    ctx: None, database: Database, tenant: TenantAuth
) -> None:
    job_id = insert_queued_job(database, tenant.id)
    set_cap(database, job_id, 2)
    for attempt in (1, 2):
        with database.sessionmaker() as session:
            [claimed] = claims.claim(session, [job_id], lease_s=60)  # then the worker dies
            session.commit()
        assert claimed.attempt == attempt
        expire_lease(database, job_id)
        with database.sessionmaker() as session:
            requeued = transitions.take_back_expired_leases(session, 0.01, 0.01, 500)
            session.commit()
        job = load_job(database, job_id)
        if attempt == 1:
            assert requeued == [job_id]
            assert job.status == "queued" and job.error_code == "worker_lost"
            make_due(database, job_id)
            with database.sessionmaker() as session:  # the sweep wakes its model again
                assert transitions.models_waiting(session, 60).get(STAGED, 0) >= 1
        else:
            assert requeued == []
            assert job.status == "failed" and job.error_code == "attempts_exhausted"
    [letter] = letters_for(database, job_id)
    assert letter.error_class == "WorkerLost" and letter.attempts == 2


def test_an_old_attempt_cannot_write_after_its_lease_was_taken_back(
    ctx: None, database: Database, tenant: TenantAuth
) -> None:
    job_id = insert_queued_job(database, tenant.id)
    with database.sessionmaker() as session:
        [old] = claims.claim(session, [job_id], lease_s=60)
        session.commit()
        expire_lease(database, job_id)
        [new] = claims.claim(session, [job_id], lease_s=60)  # redelivery after the lease
        session.commit()
        late = transitions.Outcome(job_id, old.attempt, "succeeded", output_data=packed(stale=1))
        assert transitions.finish(session, [late]) == set()
        fresh = transitions.Outcome(job_id, new.attempt, "succeeded", output_data=packed(fresh=1))
        assert transitions.finish(session, [fresh]) == {job_id}
        session.commit()
    assert outputs_of(load_job(database, job_id)) == {"fresh": [1]}


GUARD = pytest.mark.parametrize("guarded", [True, False], ids=["guard on", "guard off"])


def test_the_container_and_its_execute_path_keep_every_guard(ctx: None) -> None:
    assert services().guards == Guards() == ALL_ON
    assert services().parts.runner.guards == ALL_ON
    assert all(getattr(ALL_ON, name) for name in Guards.names())
    off = Guards.off("lease", "cap")
    assert {name for name in Guards.names() if not getattr(off, name)} == {"lease", "cap"}
    with pytest.raises(ValueError, match="no such guard: leases"):
        Guards.off("leases")


@GUARD
def test_the_attempt_cap_is_the_policys(
    ctx: None, database: Database, tenant: TenantAuth, guarded: bool
) -> None:
    job_id = insert_queued_job(database, tenant.id, {"n": [HUGE]}, model="memhog")
    set_cap(database, job_id, 1)
    runner = runner_with(ALL_ON if guarded else Guards.off("cap"))
    [outcome] = execute(services(), [job_id], runner)
    if guarded:
        assert outcome.status == "failed" and outcome.error_code == "retries_exhausted"
    else:
        assert outcome.status == "retry", "the cap is what stops it"
        assert load_job(database, job_id).status == "queued"


@GUARD
def test_taking_back_a_dead_workers_job_is_the_policys(
    ctx: None, database: Database, tenant: TenantAuth, guarded: bool
) -> None:
    """By a redelivered message (execute) and by the sweep: with the lease guard off
    neither takes the job back, and it stays `running` for good."""
    redelivered = insert_queued_job(database, tenant.id)
    swept = insert_queued_job(database, tenant.id)
    with database.sessionmaker() as session:
        claims.claim(session, [redelivered, swept], lease_s=60)  # then the worker dies
        session.commit()
    expire_lease(database, redelivered)
    expire_lease(database, swept)
    guards = Guards.off("republish") if guarded else Guards.off("lease", "republish")
    outcomes = execute(services(), [redelivered], runner_with(guards))
    assert [o.status for o in outcomes] == (["succeeded"] if guarded else [])
    container = services()
    parts, settings = container.parts, container.settings.with_overrides(retry_backoff_seconds=0.01)
    maintenance = Maintenance(
        parts.database, parts.dispatcher, parts.store, MaintenanceSettings.of(settings), guards
    )
    with container.scope():
        counts = maintenance.sweep()
    assert ("requeued_after_lost_worker" in counts) is guarded
    assert "woken_for" not in counts  # republish off: no wake-up sent
    statuses = (load_job(database, redelivered).status, load_job(database, swept).status)
    assert statuses == (("succeeded", "queued") if guarded else ("running", "running"))


def slow_inputs(seconds: float) -> dict[str, Any]:
    return {**SLOW, "steps": [int(seconds / 2e-6)]}


@pytest.mark.parametrize("guarded", [True, False], ids=["guard on", "claim guard off"])
def test_a_running_job_keeps_its_lease_while_it_runs(
    ctx: None, database: Database, tenant: TenantAuth, guarded: bool
) -> None:
    """A second delivery while a long job runs must not claim it (the lease is renewed);
    with the claim guard off, it does: the job would run twice."""
    job_id = insert_queued_job(database, tenant.id, slow_inputs(1.5), model="slow")
    runner, container = runner_with(lease_s=0.5), services()
    outcome: list[Any] = []
    worker = threading.Thread(target=lambda: outcome.extend(execute(container, [job_id], runner)))
    worker.start()
    time.sleep(1.0)  # two lease lengths into the run
    with database.sessionmaker() as session:
        second = claims.claim(session, [job_id], lease_s=0.5, guarded=guarded)
        session.commit()
    worker.join()
    job = load_job(database, job_id)
    if guarded:
        assert second == [] and job.attempts == 1
        assert [o.status for o in outcome] == ["succeeded"] and job.status == "succeeded"
    else:
        assert len(second) == 1 and job.attempts == 2, "the guard is what prevents this"


def test_cancel_while_running_ends_cancelled_without_a_result(
    ctx: None, database: Database, tenant: TenantAuth
) -> None:
    job_id = insert_queued_job(database, tenant.id)
    with database.sessionmaker() as session:
        [claimed] = claims.claim(session, [job_id], lease_s=60)
        assert transitions.request_cancel(session, tenant.id, job_id) == "running"
        done = transitions.Outcome(
            job_id, claimed.attempt, "succeeded", output_data=packed(label=1)
        )
        assert transitions.finish(session, [done]) == {job_id}
        assert transitions.request_cancel(session, tenant.id, job_id) is None
        session.commit()
    job = load_job(database, job_id)
    assert job.status == "cancelled" and outputs_of(job) is None and job.finished_at is not None


def test_overdue_jobs_expire_and_are_not_claimed(
    ctx: None, database: Database, tenant: TenantAuth
) -> None:
    queued = insert_queued_job(database, tenant.id)
    running = insert_queued_job(database, tenant.id)
    with database.sessionmaker() as session:
        [claimed] = claims.claim(session, [running], lease_s=60)
        session.commit()
    with database.engine.begin() as conn:
        conn.execute(
            text("UPDATE jobs SET deadline_at = now() - interval '1 second' WHERE id IN (:a, :b)"),
            {"a": queued, "b": running},
        )
    with database.sessionmaker() as session:
        assert claims.claim(session, [queued], lease_s=60) == []
        assert transitions.expire_overdue(session, 500) >= 2
        late = transitions.Outcome(
            running, claimed.attempt, "succeeded", output_data=packed(late=1)
        )
        assert transitions.finish(session, [late]) == set(), "an expired job keeps no late result"
        session.commit()
    for job_id in (queued, running):
        job = load_job(database, job_id)
        assert job.status == "expired" and job.error_code == "deadline_exceeded"


def test_retention_deletes_old_inputs_and_outputs_but_keeps_the_job(
    ctx: None, database: Database, tenant: TenantAuth
) -> None:
    job_id = insert_queued_job(database, tenant.id)
    execute(services(), [job_id])
    update_job(database, job_id, "finished_at = now() - interval '8 days'")
    with services().scope():
        assert services().worker.maintenance.purge()["purged"] >= 1
    job = load_job(database, job_id)
    assert outputs_of(job) is None and job.purged_at is not None and job.status == "succeeded"
    with database.engine.connect() as conn:
        stored = conn.execute(
            text("SELECT inputs, input_data FROM jobs WHERE id = :id"), {"id": job_id}
        ).one()
    assert stored.inputs is None and stored.input_data is None


def test_a_model_added_after_the_worker_started_is_found(
    ctx: None, database: Database, tenant: TenantAuth, model_repository: Any
) -> None:
    import shutil

    job_id = insert_queued_job(database, tenant.id, model="digits-late")
    target = model_repository / "digits-late"
    shutil.copytree(model_repository / "digits", target)
    try:
        [outcome] = execute(services(), [job_id])
    finally:
        shutil.rmtree(target)
        services().parts.runner.repository.refresh()
    assert outcome.status == "succeeded"


def test_a_card_sets_its_models_attempt_limit(
    app: Flask, ctx: None, database: Database, tenant: TenantAuth, model_repository: Any
) -> None:
    import json

    from app.operations import JobRequest

    card_path = model_repository / "slow" / "1" / "card.json"
    original = card_path.read_text()
    card_path.write_text(json.dumps({**json.loads(original), "max_attempts": 7}))
    repository = services().parts.runner.repository
    repository.refresh()
    try:
        with container_of(app).scope():
            job = container_of(app).jobs.submit(
                tenant.ref, JobRequest("slow", {"x": [[0.0] * 64], "steps": [1]})
            )
    finally:
        card_path.write_text(original)
        repository.refresh()
    assert load_job(database, job.id).max_attempts == 7
