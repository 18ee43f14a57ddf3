"""What a tenant's jobs cost over a period, per model: for GET /usage.

Summed from the job rows themselves (time queued, time running, each job's
share of its micro-batch's ONNX Runtime time, and a generation's tokens, written
when it finished), so the
report needs no bookkeeping of its own and agrees with GET /jobs/<id>.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import text
from sqlalchemy.orm import Session

from app.errors import InvalidRequest
from app.statuses import OPEN_SQL

# A report reads every job of the period (through ix_jobs_tenant_created): bounded.
MAX_PERIOD = timedelta(days=31)

_REPORT = text(
    f"""
    SELECT model,
           count(*) AS jobs,
           count(*) FILTER (WHERE batch_id IS NOT NULL) AS batch_chunks,
           count(*) FILTER (WHERE status = 'succeeded') AS succeeded,
           count(*) FILTER (WHERE status IN ('failed', 'expired')) AS failed,
           count(*) FILTER (WHERE status = 'cancelled') AS cancelled,
           count(*) FILTER (WHERE status IN ({OPEN_SQL})) AS unfinished,
           coalesce(sum(batch_rows), 0) AS rows,
           coalesce(sum(extract(epoch FROM coalesce(started_at, finished_at) - created_at)), 0)
               AS queued_seconds,
           coalesce(sum(extract(epoch FROM finished_at - started_at)), 0) AS running_seconds,
           coalesce(sum(compute_seconds), 0) AS compute_seconds,
           coalesce(sum(prompt_tokens), 0) AS prompt_tokens,
           coalesce(sum(completion_tokens), 0) AS completion_tokens
    FROM jobs
    WHERE tenant_id = :tenant AND created_at >= :start AND created_at < :end
    GROUP BY model ORDER BY model
    """
)


@dataclass(frozen=True)
class ModelUsage:
    model: str
    jobs: int
    batch_chunks: int
    succeeded: int
    failed: int
    cancelled: int
    unfinished: int
    rows: int
    queued_seconds: float
    running_seconds: float
    compute_seconds: float
    prompt_tokens: int  # a generative model's; 0 for the others
    completion_tokens: int

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


def _usage(r: Any) -> ModelUsage:
    return ModelUsage(
        r.model, r.jobs, r.batch_chunks, r.succeeded, r.failed, r.cancelled, r.unfinished,
        int(r.rows), float(r.queued_seconds), float(r.running_seconds), float(r.compute_seconds),
        int(r.prompt_tokens), int(r.completion_tokens),
    )  # fmt: skip


def report(session: Session, tenant_id: int, start: datetime, end: datetime) -> list[ModelUsage]:
    """Per model, the tenant's jobs created in [start, end)."""
    if end <= start:
        raise InvalidRequest("`to` must come after `from`", errors={"to": ["after from"]})
    if end - start > MAX_PERIOD:
        raise InvalidRequest(
            f"a report covers at most {MAX_PERIOD.days} days; ask for several periods",
            errors={"from": [f"at most {MAX_PERIOD.days} days before `to`"]},
        )
    rows = session.execute(_REPORT, {"tenant": tenant_id, "start": start, "end": end})
    return [_usage(r) for r in rows]
