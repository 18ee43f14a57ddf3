"""Thin tasks: each takes ids and calls the job service. No app import here."""

from __future__ import annotations

import uuid

from celery import shared_task
from flask import current_app
from sqlalchemy.exc import InterfaceError, OperationalError

from app.db.session import current_session
from app.jobs import dispatch, runner
from app.jobs.runtime import current_runtime


@shared_task(
    name=dispatch.RUN_JOB_TASK,
    # A lost database connection is transient: retry with backoff and jitter.
    autoretry_for=(OperationalError, InterfaceError),
    retry_backoff=2,
    retry_backoff_max=60,
    retry_jitter=True,
    max_retries=8,
)
def run_job(job_id: str) -> None:
    runner.execute(current_session(), current_runtime(), [uuid.UUID(job_id)])


@shared_task(name=dispatch.REPUBLISH_TASK)
def republish_stale(limit: int = 500) -> int:
    settings = current_app.extensions["settings"]
    return dispatch.republish_stale(current_session(), settings.republish_after_seconds, limit)
