"""Handing job ids to the broker. Messages carry ids only; PostgreSQL has the job."""

from __future__ import annotations

import logging
import uuid

from flask import current_app
from kombu.exceptions import ChannelError

logger = logging.getLogger(__name__)

RUN_JOB_TASK = "jobs.run"
SWEEP_TASK = "jobs.sweep"
PURGE_TASK = "jobs.purge"


def enqueue(job_ids: list[uuid.UUID]) -> bool:
    """Publish one run message per job, after the job row is committed.

    Returns False when the broker refused; the caller leaves the jobs queued in
    PostgreSQL for the sweeps, so a broker outage delays work but loses none.
    """
    celery = current_app.extensions["celery"]
    queue = current_app.extensions["settings"].jobs_queue
    try:
        for job_id in job_ids:
            celery.send_task(RUN_JOB_TASK, args=[str(job_id)], queue=queue)
    except Exception as exc:  # kombu / redis-py raise many kinds; all mean "not sent"
        logger.warning("could not publish %d job(s): %s", len(job_ids), exc)
        return False
    return True


def queue_depth() -> int:
    """Messages waiting in the jobs queue (not counting those a worker holds)."""
    celery = current_app.extensions["celery"]
    queue = current_app.extensions["settings"].jobs_queue
    with celery.connection_for_read() as conn:
        try:
            depth: int = conn.default_channel.queue_declare(queue, passive=True).message_count
        except ChannelError:  # the queue does not exist: nothing was ever left in it
            return 0
    return depth
