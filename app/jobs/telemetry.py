"""What a worker records of the jobs it ran: one query per claim, after their
outcomes are written (in the same transaction), for the tenant's name and the
job's own timestamps; then per job a counter, two histogram observations and
one log line (`job_id`, `model`, `tenant`, `status`: a job followed across
processes by its id)."""

from __future__ import annotations

import logging
import uuid
from collections import Counter

from sqlalchemy import bindparam, text
from sqlalchemy.orm import Session

from app import metrics
from app.jobs.transitions import UUIDS, ClaimedJob

logger = logging.getLogger("app.jobs")

_FINISHED = text(
    """
    SELECT j.id, j.model, j.status, j.error_code, t.name AS tenant,
           extract(epoch FROM j.started_at - j.created_at) AS queued_s,
           extract(epoch FROM j.finished_at - j.started_at) AS running_s
    FROM jobs j JOIN tenants t ON t.id = j.tenant_id
    WHERE j.id = ANY(:ids) AND j.status IN ('succeeded', 'failed', 'cancelled')
    """
).bindparams(bindparam("ids", type_=UUIDS))


def finished(session: Session, claimed: list[ClaimedJob], written: set[uuid.UUID]) -> None:
    """Record a claim's jobs: how many ran together, and each one that finished
    (a retry is not finished: its next attempt is recorded when it ends)."""
    for model, jobs in Counter(job.model for job in claimed).items():
        metrics.CLAIM_JOBS.labels(model).observe(jobs)
    if not written:
        return
    for row in session.execute(_FINISHED, {"ids": list(written)}):
        metrics.JOBS_FINISHED.labels(row.model, row.tenant, row.status).inc()
        if row.status == "failed":  # finish wrote its dead letter
            metrics.DEAD_LETTERS.labels(row.model, "job").inc()
        queued = float(row.queued_s) if row.queued_s is not None else None
        running = float(row.running_s) if row.running_s is not None else None
        if queued is not None:
            metrics.JOB_QUEUED_SECONDS.labels(row.model).observe(max(0.0, queued))
        if running is not None:
            metrics.JOB_RUNNING_SECONDS.labels(row.model).observe(max(0.0, running))
        logger.info(
            "job %s %s%s (model %s, tenant %s, queued %.3fs, ran %.3fs)", row.id, row.status,
            f": {row.error_code}" if row.error_code else "", row.model, row.tenant,
            queued or 0.0, running or 0.0,
            extra={"job_id": str(row.id), "model": row.model, "tenant": row.tenant,
                   "status": row.status, "error_code": row.error_code,
                   "queued_s": queued, "running_s": running},
        )  # fmt: skip
