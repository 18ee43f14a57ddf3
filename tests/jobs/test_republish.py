"""The beat sweep republishes queued jobs whose message was lost, and only those."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from flask import Flask

from app import create_app
from app.config import Settings
from app.db.models import Job
from app.db.session import Database, current_session
from app.jobs import dispatch, sweeps
from tests.conftest import TenantAuth, insert_queued_job, wait_for_job


@pytest.mark.usefixtures("worker")
def test_a_lost_message_is_republished_and_the_job_completes(
    app: Flask, database: Database, tenant: TenantAuth
) -> None:
    job_id = insert_queued_job(database, tenant.id, enqueued_seconds_ago=600)
    with app.app_context():
        assert sweeps.republish_lost(current_session(), older_than_s=60) >= 1
    assert wait_for_job(app.test_client(), tenant.headers, str(job_id))["status"] == "succeeded"
    with app.app_context():  # now fresh again: not republished a second time
        assert sweeps.republish_lost(current_session(), older_than_s=60) == 0


@pytest.fixture
def backlogged(settings: Settings) -> Iterator[Flask]:
    """An app on a queue with no worker, holding one waiting message."""
    app = create_app(settings.with_overrides(jobs_queue=f"{settings.jobs_queue}-backlog"))
    with app.app_context():
        assert dispatch.enqueue([uuid.uuid4()])
        assert dispatch.queue_depth() == 1
    yield app
    with app.app_context(), app.extensions["celery"].connection_for_write() as conn:
        conn.default_channel.queue_purge(app.extensions["settings"].jobs_queue)


def test_jobs_waiting_behind_a_backlog_are_not_republished(
    backlogged: Flask, database: Database, tenant: TenantAuth
) -> None:
    job_id = insert_queued_job(database, tenant.id, enqueued_seconds_ago=600)
    with backlogged.app_context():
        assert sweeps.republish_lost(current_session(), older_than_s=60) == 0
        assert dispatch.queue_depth() == 1
    with database.sessionmaker() as session:
        job = session.get(Job, job_id)
        assert job is not None and job.status == "queued"
