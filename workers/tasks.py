"""Thin tasks: each takes ids (or nothing) and calls the job layer. No app import here."""

from __future__ import annotations

import uuid
from typing import Any

from celery import shared_task
from flask import current_app
from sqlalchemy.exc import InterfaceError, OperationalError

from app.db.session import current_session
from app.jobs import dispatch, runner, sweeps
from app.jobs.runtime import current_runtime


@shared_task(
    name=dispatch.RUN_JOB_TASK,
    # A lost database connection is transient: retry the message with backoff and
    # jitter. If the job was claimed meanwhile, its lease brings it back instead.
    autoretry_for=(OperationalError, InterfaceError),
    retry_backoff=2,
    retry_backoff_max=60,
    retry_jitter=True,
    max_retries=8,
)
def run_job(job_id: str) -> None:
    runner.execute(current_session(), current_runtime(), [uuid.UUID(job_id)])


@shared_task(name=dispatch.SWEEP_TASK, ignore_result=True)
def sweep() -> dict[str, int]:
    return sweeps.sweep(current_session(), current_app.extensions["settings"])


@shared_task(name=dispatch.PURGE_TASK, ignore_result=True)
def purge() -> dict[str, Any]:
    return sweeps.purge(current_session(), current_app.extensions["settings"])
