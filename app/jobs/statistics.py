"""A tenant's inference statistics per model version, as Triton's statistics
extension counts them (GET /v2/models/<m>/stats, gRPC ModelStatistics).

Read from the job rows themselves in one aggregate query, like GET /usage, so
they need no bookkeeping of their own and agree with GET /jobs/<id>. Only the
calling tenant's jobs are counted: a tenant never sees another tenant's counts,
nor that another tenant used a model at all. Cumulative over the job records
kept, as Triton's are since it started; jobs still queued or running are not
counted yet, nor cancelled ones (their caller gave up; no inference failed).

How each figure maps onto a job's record:

- success: the jobs that succeeded, each from submission (`created_at`; for a
  call run inline in the API, its start) to `finished_at`.
- fail: the jobs that failed or expired past their deadline, measured the same.
- queue: per succeeded job, `started_at - created_at` (a retried job's from its
  submission to its last attempt's start).
- compute_infer: per succeeded job, `compute_seconds`: its share of its
  micro-batch's ONNX Runtime call (a generation's decode steps).
- compute_input / compute_output: the service does not time preparing inputs
  or extracting outputs apart from the ONNX Runtime call (both are inside it,
  or in the worker's handling around it), so their count is the succeeded jobs
  and their duration is reported as 0.
- inference_count: the rows of the succeeded jobs (a batched request of 64 rows
  counts 64, as Triton counts it).
- execution_count: the number of succeeded jobs, not of micro-batches: a job
  records its share of the ONNX Runtime call it ran in, not which call, and a
  micro-batch may hold other tenants' jobs, so the tenant's executions cannot
  be told apart; each request is counted as one execution.
- last_inference: when the newest counted job finished, in ms since the epoch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import text
from sqlalchemy.orm import Session


def _ns(seconds: str, where: str) -> str:
    """The sum of `seconds` over the rows `where`, in nanoseconds (summed in numeric)."""
    return f"coalesce(round(sum({seconds}) FILTER (WHERE {where}) * 1e9), 0)::bigint"


# From submission; a call run inline in the API is recorded after it ran, so from
# its start (least() passes over a NULL started_at).
_TOOK = "extract(epoch FROM finished_at - least(created_at, started_at))"
_QUERY = text(f"""
    SELECT model, model_version,
           count(*) FILTER (WHERE status = 'succeeded') AS succeeded,
           coalesce(sum(batch_rows) FILTER (WHERE status = 'succeeded'), 0) AS inferences,
           {_ns(_TOOK, "status = 'succeeded'")} AS success_ns,
           count(*) FILTER (WHERE status <> 'succeeded') AS failed,
           {_ns(_TOOK, "status <> 'succeeded'")} AS fail_ns,
           {
    _ns("greatest(extract(epoch FROM started_at - created_at), 0)", "status = 'succeeded'")
} AS queue_ns,
           {_ns("compute_seconds", "status = 'succeeded'")} AS compute_ns,
           coalesce(floor(extract(epoch FROM max(finished_at)) * 1000), 0)::bigint AS last_ms
    FROM jobs
    WHERE tenant_id = :tenant AND model = ANY(:models)
      AND (CAST(:version AS text) IS NULL OR model_version = :version)
      AND status IN ('succeeded', 'failed', 'expired')
    GROUP BY model, model_version
""")


@dataclass(frozen=True)
class VersionStatistics:
    """One model version's figures for one tenant (all zero where it ran nothing)."""

    succeeded: int = 0
    inferences: int = 0  # rows of the succeeded jobs
    success_ns: int = 0
    failed: int = 0
    fail_ns: int = 0
    queue_ns: int = 0
    compute_ns: int = 0
    last_ms: int = 0


def model_statistics(
    session: Session, tenant_id: int, models: Sequence[str], version: str | None = None
) -> dict[tuple[str, str], VersionStatistics]:
    """By (model, version), the figures of the tenant's finished jobs of `models`
    (only `version` of them when given); a version it never ran is absent."""
    values = {"tenant": tenant_id, "models": list(models), "version": version}
    rows = session.execute(_QUERY, values)
    # The query's columns after (model, version) are the figures, in their order.
    return {(r[0], r[1]): VersionStatistics(*(int(x) for x in r[2:])) for r in rows}
