"""Thin tasks: each takes ids and calls the job service. No app import here."""

from __future__ import annotations

import logging
import uuid

from celery import shared_task
from flask import current_app
from sqlalchemy.exc import DBAPIError

from app.db.session import current_session
from app.jobs import dispatch, runner
from app.jobs.runtime import current_runtime
from app.jobs.transitions import take_stale_queued

logger = logging.getLogger(__name__)


@shared_task(
    name=dispatch.RUN_JOB_TASK,
    # Lost database connections are transient: retry with backoff and jitter.
    autoretry_for=(DBAPIError,),
    retry_backoff=2,
    retry_backoff_max=60,
    retry_jitter=True,
    max_retries=8,
)
def run_job(job_id: str) -> None:
    runner.execute(current_session(), current_runtime(), [uuid.UUID(job_id)])


@shared_task(name=dispatch.REPUBLISH_TASK)
def republish_stale(limit: int = 500) -> int:
    """Publish again the queued jobs that no worker picked up in time."""
    settings = current_app.extensions["settings"]
    ids = take_stale_queued(current_session(), settings.republish_after_seconds, limit)
    if ids:
        logger.info("republishing %d stale queued job(s)", len(ids))
        dispatch.enqueue(ids)
    return len(ids)
