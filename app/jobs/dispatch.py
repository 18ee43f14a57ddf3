"""Handing job ids to the broker. Messages carry ids only; PostgreSQL has the job."""

from __future__ import annotations

import logging
import uuid

from flask import current_app

logger = logging.getLogger(__name__)

RUN_JOB_TASK = "jobs.run"
REPUBLISH_TASK = "jobs.republish_stale"


def enqueue(job_ids: list[uuid.UUID]) -> bool:
    """Publish one run message per job, after the job row is committed.

    Returns False when the broker refused; the jobs stay queued in PostgreSQL
    and the republish sweep sends them again, so a broker outage delays work
    but does not lose it.
    """
    celery = current_app.extensions["celery"]
    queue = current_app.extensions["settings"].jobs_queue
    try:
        for job_id in job_ids:
            celery.send_task(RUN_JOB_TASK, args=[str(job_id)], queue=queue)
    except Exception as exc:  # kombu / redis-py raise many kinds; all mean "not sent"
        logger.warning("could not publish %d job(s), the sweep will retry: %s", len(job_ids), exc)
        return False
    return True
