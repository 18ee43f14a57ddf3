"""Thin tasks: each takes ids (or nothing) and calls the job layer. No app import here."""

from __future__ import annotations

import random
import uuid
from typing import Any

from celery import Task, shared_task
from flask import current_app
from sqlalchemy.exc import InterfaceError, OperationalError

from app.db.session import current_session
from app.jobs import dispatch, runner, sweeps
from app.jobs.runtime import current_runtime


@shared_task(name=dispatch.RUN_JOB_TASK, bind=True, max_retries=8)
def run_job(self: Task, job_id: str) -> None:
    try:
        runner.execute(current_session(), current_runtime(), [uuid.UUID(job_id)])
    except (OperationalError, InterfaceError) as exc:
        # The database went away: send the message again with backoff and jitter. If
        # the job was claimed meanwhile, its lease brings it back even without this.
        if "retry" in current_app.extensions["settings"].guards_off:
            raise
        countdown = random.uniform(0, min(60, 2 ** (self.request.retries + 1)))
        raise self.retry(exc=exc, countdown=countdown) from exc


@shared_task(name=dispatch.SWEEP_TASK, ignore_result=True)
def sweep() -> dict[str, int]:
    return sweeps.sweep(current_session(), current_app.extensions["settings"])


@shared_task(name=dispatch.PURGE_TASK, ignore_result=True)
def purge() -> dict[str, Any]:
    return sweeps.purge(current_session(), current_app.extensions["settings"])
