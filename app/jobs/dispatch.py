"""Handing job ids to the broker. Messages carry ids only; PostgreSQL has the job."""

from __future__ import annotations

import logging
import uuid

from flask import current_app
from kombu.exceptions import ChannelError
from sqlalchemy.orm import Session

from app.jobs.transitions import take_stale_queued

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


def republish_stale(session: Session, older_than_s: float, limit: int) -> int:
    """Publish again the queued jobs whose message was lost (a failed publish, a
    flushed or restarted broker).

    Only while the queue is empty: a job that waits behind a backlog is not
    lost, and republishing it would grow the backlog. With the queue drained,
    a job still queued in PostgreSQL after `older_than_s` has no message left.
    A job a worker has reserved but not claimed may get a second message; the
    claim's guard makes that one a no-op.
    """
    if queue_depth() > 0:
        return 0
    ids = take_stale_queued(session, older_than_s, limit)
    if ids:
        logger.info("republishing %d queued job(s) whose message was lost", len(ids))
        enqueue(ids)
    return len(ids)
