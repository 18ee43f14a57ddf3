"""Claiming jobs: a guarded UPDATE moves queued jobs to running under a lease
(the attempt that claimed a job owns it until the lease runs out), and the
lease is renewed while they run. Celery may deliver a message twice; a second
claim then matches no row. Unguarded (`guarded=False`, the fault suite only) a
running job can be claimed again.
"""

from __future__ import annotations

import functools
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import bindparam, text
from sqlalchemy.orm import Session

from app.jobs.transitions import UUIDS
from app.platform.database import Prepared
from app.statuses import OPEN_SQL


@dataclass(frozen=True)
class ClaimedJob:
    id: uuid.UUID
    model: str
    model_version: str
    inputs: dict[str, Any] | None  # JSON, for rows written before input_data
    input_data: bytes | None
    attempt: int
    max_attempts: int
    batch_id: uuid.UUID | None = None  # a chunk of this batch
    input_file_id: uuid.UUID | None = None  # its rows are in this file, from input_offset
    input_offset: int | None = None
    input_key: str | None = None  # the file store's object its rows are in
    batch_index: int | None = None
    reply_to: str | None = None  # a sync call's: where its answer is published
    tenant_id: int | None = None  # whose job: a decode loop shares its slots by tenant
    priority: int = 0
    created_at: datetime | None = None  # (a generation's time to first token counts from it)
    traceparent: str | None = None  # the trace its spans join


_CLAIMED = (
    "id, model, model_version, inputs, input_data, attempts, max_attempts, created_at, batch_id, "
    "input_file_id, input_offset, input_key, batch_index, reply_to, tenant_id, priority, "
    "traceparent"
)
_LEASE = "lease_expires_at = now() + make_interval(secs => :lease)"
_CLAIMABLE = """
    AND ((status = 'queued' AND run_after <= now()) {expired})
    AND attempts < max_attempts
    AND (deadline_at IS NULL OR deadline_at > now())
"""


def claim(
    session: Session,
    job_ids: list[uuid.UUID],
    lease_s: float,
    *,
    guarded: bool = True,
    reclaim_expired: bool = True,
) -> list[ClaimedJob]:
    """Move these jobs to running under a lease, where claimable; returns those
    this call won, in the order of `job_ids`.

    Claimable: queued and due, or running with a lease that ran out (its worker
    died), within the attempt cap and the deadline.
    """
    expired = "OR (status = 'running' AND lease_expires_at < now())" if reclaim_expired else ""
    where = _CLAIMABLE.format(expired=expired) if guarded else ""
    statement = text(
        f"""
        UPDATE jobs SET status = 'running', attempts = attempts + 1, started_at = now(), {_LEASE}
        WHERE id = ANY(:ids) {where}
        RETURNING {_CLAIMED}
        """
    ).bindparams(bindparam("ids", type_=UUIDS))
    position = {job_id: i for i, job_id in enumerate(job_ids)}
    # RETURNING has no order; callers (a batch streaming results) keep theirs.
    rows = sorted(
        session.execute(statement, {"ids": job_ids, "lease": lease_s}), key=lambda r: position[r.id]
    )
    return [_claimed(r) for r in rows]


def claim_next(
    session: Session, model: str, max_rows: int, lease_s: float, *, guarded: bool = True,
    version: str | None = None,
) -> tuple[list[ClaimedJob], bool]:  # fmt: skip
    """Claim queued, due jobs of `model` (of `version` only, if given: a decode loop
    serves one version) whose rows fit in `max_rows` (a job bigger than that
    alone), under a lease, fairly between tenants. Returns them in the order
    taken, and whether more were waiting.

    Fair dispatch: higher `priority` first; within a priority, tenants take turns
    (each tenant's oldest, then each one's second oldest, ...), so one tenant's
    flood of queued jobs delays another tenant's next job by about one turn, not
    by the whole flood. The tenants come from a skip scan of ix_jobs_claim (one
    index probe per tenant with queued jobs of the model), each tenant's head of
    the queue from the same index: the cost grows with the number of tenants
    waiting, never with the length of the queue.

    SKIP LOCKED lets worker processes claim side by side without waiting on each
    other; candidates left over are unlocked when this transaction commits.
    Unguarded (the fault suite only) a running job can be claimed again.

    A job back from a worker that died running it (`worker_lost`) is claimed
    alone: if its own rows killed the process (the OOM killer), its next
    attempts kill only it, not the jobs beside it, which would otherwise use
    up their attempts with it and be dead-lettered for its rows.
    """
    params = {"model": model, "max_rows": max_rows, "lease": lease_s,
              "per_tenant": 2 * max_rows, "version": version}  # fmt: skip
    statement = claim_next_statement(guarded, versioned=version is not None)
    rows = sorted(statement.execute(session, params), key=lambda r: r.position)
    more = bool(rows) and (rows[0].candidates > len(rows) or len(rows) == max_rows)
    return [_claimed(r) for r in rows], more


@functools.cache
def claim_next_statement(guarded: bool = True, versioned: bool = False) -> Prepared:
    """claim_next's statement; params model, max_rows, per_tenant and lease (and
    version, `versioned`). Made once per process (parsing its text was 6% of a
    worker's CPU on one-row jobs) and prepared once per connection (planning it
    took 0.7 ms of PostgreSQL's CPU a call, more than running it).

    A version is no column of ix_jobs_claim: a tenant's jobs of other versions
    ahead of its next one of this version are read and passed over. Several
    versions of a model queued at once are the short while after a roll, or
    callers who pin an old one."""
    waiting = "status = 'queued'" if guarded else f"status IN ({OPEN_SQL})"
    of_version = " AND model_version = :version" if versioned else ""
    types = {"model": "text", "max_rows": "integer", "per_tenant": "integer", "lease": "float8"}

    def due(table: str) -> str:
        return f"{table}.{waiting}" + (f" AND {table}.run_after <= now()" if guarded else "")

    return Prepared(
        ("claim_next" if guarded else "claim_next_unguarded") + ("_version" if versioned else ""),
        f"""
        WITH RECURSIVE tenants AS (  -- ordered as ix_jobs_claim is, so it walks that index
            (SELECT tenant_id FROM jobs WHERE model = :model AND {waiting}
             ORDER BY tenant_id, priority DESC, created_at LIMIT 1)
            UNION ALL
            SELECT (SELECT j.tenant_id FROM jobs j
                    WHERE j.model = :model AND j.{waiting} AND j.tenant_id > t.tenant_id
                    ORDER BY j.tenant_id, j.priority DESC, j.created_at LIMIT 1)
            FROM tenants t WHERE t.tenant_id IS NOT NULL
        ),
        heads AS (  -- each tenant's next jobs; the spare covers rows others hold locked
            SELECT h.id, h.priority, h.created_at,
                   row_number() OVER (PARTITION BY t.tenant_id, h.priority
                                      ORDER BY h.created_at) AS turn
            FROM tenants t CROSS JOIN LATERAL (
                SELECT id, priority, created_at FROM jobs
                WHERE model = :model AND tenant_id = t.tenant_id AND {due("jobs")}{of_version}
                  AND attempts < max_attempts AND (deadline_at IS NULL OR deadline_at > now())
                ORDER BY priority DESC, created_at LIMIT :per_tenant
            ) AS h
            WHERE t.tenant_id IS NOT NULL
        ),
        candidates AS (  -- locked in turn order, one primary-key probe each, until enough
            SELECT h.id, j.rows, h.priority, h.turn, h.created_at
            FROM (SELECT * FROM heads ORDER BY priority DESC, turn, created_at, id) AS h
            CROSS JOIN LATERAL (  -- a job its worker died running fills a claim alone
                SELECT CASE WHEN j.error_code = 'worker_lost' THEN :max_rows + 1
                            ELSE j.batch_rows END AS rows
                FROM jobs j WHERE j.id = h.id AND {due("j")}
                FOR UPDATE SKIP LOCKED
            ) AS j
            LIMIT :max_rows
        ),
        picked AS (
            SELECT pid, position FROM (
                SELECT id AS pid, sum(rows) OVER w AS running,
                       row_number() OVER w AS position
                FROM candidates
                WINDOW w AS (ORDER BY priority DESC, turn, created_at, id)
            ) AS c
            WHERE running <= :max_rows OR position = 1
        )
        UPDATE jobs SET status = 'running', attempts = attempts + 1, started_at = now(), {_LEASE}
        FROM picked
        WHERE jobs.id = picked.pid
        RETURNING {_CLAIMED}, picked.position, (SELECT count(*) FROM candidates) AS candidates
        """,
        {**types, "version": "text"} if versioned else types,
    )


def _claimed(r: Any) -> ClaimedJob:
    return ClaimedJob(
        r.id, r.model, r.model_version, r.inputs, r.input_data, r.attempts, r.max_attempts,
        r.batch_id, r.input_file_id, r.input_offset, r.input_key, r.batch_index, r.reply_to,
        r.tenant_id, r.priority, r.created_at, r.traceparent,
    )  # fmt: skip


def renew_leases(session: Session, jobs: list[ClaimedJob], lease_s: float) -> set[uuid.UUID]:
    """Extend the leases this worker still holds; returns the ids still owned."""
    statement = text(
        """
        UPDATE jobs SET lease_expires_at = now() + make_interval(secs => :lease)
        FROM unnest(CAST(:ids AS uuid[]), CAST(:attempts AS integer[])) AS o(id, attempt)
        WHERE jobs.id = o.id AND jobs.status = 'running' AND jobs.attempts = o.attempt
        RETURNING jobs.id
        """
    )
    params = {
        "ids": [str(j.id) for j in jobs],
        "attempts": [j.attempt for j in jobs],
        "lease": lease_s,
    }
    owned = {r.id for r in session.execute(statement, params)}
    return owned


@dataclass(frozen=True)
class Head:
    """A tenant's next claimable job of a model, and the version it names."""

    id: uuid.UUID
    tenant_id: int
    priority: int
    version: str


_HEADS = text(
    """
    WITH RECURSIVE tenants AS (  -- a skip scan of ix_jobs_claim: one probe per tenant
        (SELECT tenant_id FROM jobs WHERE model = :model AND status = 'queued'
         ORDER BY tenant_id, priority DESC, created_at LIMIT 1)
        UNION ALL
        SELECT (SELECT j.tenant_id FROM jobs j
                WHERE j.model = :model AND j.status = 'queued' AND j.tenant_id > t.tenant_id
                ORDER BY j.tenant_id, j.priority DESC, j.created_at LIMIT 1)
        FROM tenants t WHERE t.tenant_id IS NOT NULL
    )
    SELECT h.id, t.tenant_id, h.priority, h.model_version FROM tenants t CROSS JOIN LATERAL (
        SELECT id, priority, created_at, model_version FROM jobs
        WHERE model = :model AND tenant_id = t.tenant_id AND status = 'queued'
          AND run_after <= now() AND attempts < max_attempts
          AND (deadline_at IS NULL OR deadline_at > now())
        ORDER BY priority DESC, created_at LIMIT 1
    ) AS h
    WHERE t.tenant_id IS NOT NULL
    ORDER BY h.priority DESC, h.created_at, h.id
    """
)


def waiting_heads(session: Session, model: str) -> list[Head]:
    """Each tenant's next claimable job of `model`, first in line first (a decode
    loop whose slots are all taken looks for tenants waiting without one; one
    starting serves the version the first names). Costs a probe per tenant with
    queued jobs of the model, never the length of the queue."""
    rows = session.execute(_HEADS, {"model": model})
    return [Head(r.id, r.tenant_id, r.priority, r.model_version) for r in rows]


def hand_back(session: Session, jobs: list[ClaimedJob]) -> set[uuid.UUID]:
    """Queue these running jobs again at once, where this attempt still holds them
    (a worker shutting down hands its generations to another). The attempt stays
    counted and the cap grows by one: a hand-over is no failure, and the next
    attempt's number is still new (the finish guard tells the two apart).
    Returns the ids handed back."""
    statement = text(
        """
        UPDATE jobs SET status = 'queued', lease_expires_at = NULL, enqueued_at = NULL,
                        run_after = now(), max_attempts = jobs.max_attempts + 1
        FROM unnest(CAST(:ids AS uuid[]), CAST(:attempts AS integer[])) AS o(id, attempt)
        WHERE jobs.id = o.id AND jobs.status = 'running' AND jobs.attempts = o.attempt
        RETURNING jobs.id
        """
    )
    params = {"ids": [str(j.id) for j in jobs], "attempts": [j.attempt for j in jobs]}
    return {r.id for r in session.execute(statement, params)}


def cancel_requested(connection: Any, job_ids: list[uuid.UUID]) -> list[uuid.UUID]:
    """Those of these jobs whose cancellation was asked for (a running decode
    loop's look, between steps)."""
    found = connection.execute(
        text("SELECT id FROM jobs WHERE id = ANY(CAST(:ids AS uuid[])) "
             "AND cancel_requested_at IS NOT NULL"), {"ids": [str(i) for i in job_ids]},
    ).scalars()  # fmt: skip
    return [uuid.UUID(str(job_id)) for job_id in found]


def any_queued(connection: Any, model: str) -> bool:
    """Whether a job of `model` is queued (a loop that ends wakes the next for it)."""
    statement = text(
        "SELECT EXISTS (SELECT 1 FROM jobs WHERE model = :model AND status = 'queued')"
    )
    return bool(connection.execute(statement, {"model": model}).scalar())
