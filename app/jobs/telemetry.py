"""What a worker records of the jobs it ran, from the rows their outcomes'
UPDATE returned (no query of its own; a tenant's name is looked up once per
process): per job a counter, two histogram observations and one log line
(`job_id`, `model`, `tenant`, `status`: a job followed across processes by its
id)."""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any

from sqlalchemy import text
from sqlalchemy.orm import Session

from app.jobs.claims import ClaimedJob
from app.observability import metrics
from app.statuses import JobStatus

logger = logging.getLogger("app.jobs")

_TENANT_NAMES: dict[int, str] = {}  # tenants are never renamed


def tenant_name(session: Session, tenant_id: int) -> str:
    name = _TENANT_NAMES.get(tenant_id)
    if name is None:
        found = session.scalar(text("SELECT name FROM tenants WHERE id = :id"), {"id": tenant_id})
        name = _TENANT_NAMES[tenant_id] = str(found)
    return name


def finished(session: Session, claimed: list[ClaimedJob], written: list[Any]) -> None:
    """Record a claim's jobs: how many ran together, and each one that finished
    (`written`: the rows `finish_rows` returned; a retry is not finished, its
    next attempt is recorded when it ends)."""
    for model, jobs in Counter(job.model for job in claimed).items():
        metrics.CLAIM_JOBS.labels(model).observe(jobs)
    for row in written:
        if row.status not in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED):
            continue
        tenant = tenant_name(session, row.tenant_id)
        metrics.JOBS_FINISHED.labels(row.model, tenant, row.status).inc()
        if row.status == JobStatus.FAILED:  # finish wrote its dead letter
            metrics.DEAD_LETTERS.labels(row.model, "job").inc()
        queued = float(row.queued_s) if row.queued_s is not None else None
        running = float(row.running_s) if row.running_s is not None else None
        if queued is not None:
            metrics.JOB_QUEUED_SECONDS.labels(row.model).observe(max(0.0, queued))
        if running is not None:
            metrics.JOB_RUNNING_SECONDS.labels(row.model).observe(max(0.0, running))
        logger.info(
            "job %s %s%s (model %s, tenant %s, queued %.3fs, ran %.3fs)", row.id, row.status,
            f": {row.error_code}" if row.error_code else "", row.model, tenant,
            queued or 0.0, running or 0.0,
            extra={"job_id": str(row.id), "model": row.model, "tenant": tenant,
                   "status": row.status, "error_code": row.error_code,
                   "queued_s": queued, "running_s": running},
        )  # fmt: skip


def recorded(session: Session, records: list[dict[str, Any]]) -> None:
    """Record sync calls whose records were just written behind (app.sync.records)."""
    for record in records:
        tenant = tenant_name(session, record["tenant_id"])
        metrics.JOBS_FINISHED.labels(record["model"], tenant, record["status"]).inc()
        metrics.JOB_RUNNING_SECONDS.labels(record["model"]).observe(record["compute_seconds"])
