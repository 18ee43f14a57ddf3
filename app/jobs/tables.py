"""Jobs and what they leave: events, idempotency keys, dead letters, audit events.

The `jobs` row is the source of truth for a job's state."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    SmallInteger,
    String,
    Text,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, UUID
from sqlalchemy.orm import Mapped, mapped_column

from app.platform.orm import Base
from app.statuses import OPEN_SQL, JobStatus, sql_list

# Clients ask for 0 to MAX_PRIORITY (within their tenant's allowance); sync calls run
# at SYNC_PRIORITY, ahead of every async job.
MAX_PRIORITY = 9
SYNC_PRIORITY = 10


class Job(Base):
    __tablename__ = "jobs"
    # Fetch server defaults (created_at, ...) in the INSERT's RETURNING: no extra query.
    __mapper_args__ = {"eager_defaults": True}
    __table_args__ = (
        CheckConstraint(
            f"status IN ({sql_list(JobStatus)})",
            name="jobs_status_valid",
        ),
        # GET /jobs: a tenant's jobs, newest first, keyset-paginated on (created_at, id).
        Index("ix_jobs_tenant_created", "tenant_id", text("created_at DESC"), text("id DESC")),
        # Workers claim a model's queued jobs tenant by tenant (a skip scan over
        # tenant_id), each tenant's by priority then age: fair dispatch.
        Index(
            "ix_jobs_claim",
            "model",
            "tenant_id",
            text("priority DESC"),
            "created_at",
            postgresql_where=text("status = 'queued'"),
        ),
        # A tenant's jobs in flight, for its quota.
        Index(
            "ix_jobs_tenant_open",
            "tenant_id",
            postgresql_where=text(f"status IN ({OPEN_SQL})"),
        ),
        # The sweeps each read one narrow slice of the table.
        Index(
            "ix_jobs_queued_enqueued",
            "enqueued_at",
            postgresql_where=text("status = 'queued'"),
        ),
        Index(
            "ix_jobs_due",
            "run_after",
            postgresql_where=text("status = 'queued' AND enqueued_at IS NULL"),
        ),
        Index("ix_jobs_lease", "lease_expires_at", postgresql_where=text("status = 'running'")),
        # Retention deletes finished jobs oldest first (a batch's go with it).
        Index(
            "ix_jobs_finished",
            "finished_at",
            postgresql_where=text("finished_at IS NOT NULL AND batch_id IS NULL"),
        ),
        Index(
            "ix_jobs_deadline",
            "deadline_at",
            postgresql_where=text(f"status IN ({OPEN_SQL}) AND deadline_at IS NOT NULL"),
        ),
        Index(
            "ix_jobs_retention",
            "finished_at",
            postgresql_where=text("purged_at IS NULL AND finished_at IS NOT NULL"),
        ),
        Index(
            "ix_jobs_batch_chunk",
            "batch_id",
            "batch_index",
            unique=True,
            postgresql_where=text("batch_id IS NOT NULL"),
        ),
        Index(
            "ix_jobs_batch_open",
            "batch_id",
            postgresql_where=text(f"batch_id IS NOT NULL AND status IN ({OPEN_SQL})"),
        ),
    )

    id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True)
    tenant_id: Mapped[int] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    model: Mapped[str] = mapped_column(String(100))
    model_version: Mapped[str] = mapped_column(String(50))
    status: Mapped[str] = mapped_column(String(16), server_default=JobStatus.QUEUED.value)
    # Inputs as packed tensors of their declared datatypes (app.runtime.tensors.pack):
    # float32 stays 4 bytes a value, where JSON took about 20. `inputs` (JSON) is
    # read for rows written before, or staged by hand.
    input_data: Mapped[bytes | None] = mapped_column(LargeBinary, deferred=True)
    inputs: Mapped[dict[str, Any] | None] = mapped_column(JSONB, deferred=True)
    outputs: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    error_code: Mapped[str | None] = mapped_column(String(64))
    error_message: Mapped[str | None] = mapped_column(Text)
    # Rows along the model's batch dimension (1 for models that do not batch): a
    # worker claims jobs until their rows fill one ONNX Runtime call.
    batch_rows: Mapped[int] = mapped_column(Integer, server_default="1")
    # Higher runs first among a model's queued jobs (0-9 asked by clients, within the
    # tenant's allowance; sync calls run above every async job).
    priority: Mapped[int] = mapped_column(SmallInteger, server_default="0")
    # What the job cost: its share of its micro-batch (its rows over the call's) and
    # that share of the ONNX Runtime call's wall time.
    batch_share: Mapped[float | None] = mapped_column(Float)
    compute_seconds: Mapped[float | None] = mapped_column(Float)
    # A generation's tokens (NULL for one-shot models), for GET /usage.
    prompt_tokens: Mapped[int | None] = mapped_column(Integer)
    completion_tokens: Mapped[int | None] = mapped_column(Integer)
    attempts: Mapped[int] = mapped_column(Integer, server_default="0")
    # The cap on attempts, fixed at submit: a job that crashes its worker every time
    # stops here, whatever the workers' settings.
    max_attempts: Mapped[int] = mapped_column(Integer, server_default="3")
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    # When a message for the job was last handed to the broker; NULL while the job
    # waits for `run_after` (a retry's backoff) with no message outstanding.
    enqueued_at: Mapped[datetime | None] = mapped_column(
        DateTime(timezone=True), server_default=func.now()
    )
    run_after: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    # A running job belongs to the attempt that claimed it until this time; the worker
    # renews it while it runs, the lease sweep takes back jobs whose worker died.
    lease_expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    deadline_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    cancel_requested_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    first_failed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # Set when retention deleted the job's inputs and outputs.
    purged_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # Where to push this job's events; deliveries are made by the job_events trigger.
    webhook_url: Mapped[str | None] = mapped_column(Text)
    webhook_events: Mapped[list[str] | None] = mapped_column(ARRAY(String(32)))
    # A chunk of a batch: its place in the batch and its first row. Its outputs are
    # packed tensors, never JSON, in the file store (`output_bytes` their size) or,
    # for chunks finished before the store, in `output_data`.
    batch_id: Mapped[uuid.UUID | None] = mapped_column(
        UUID(as_uuid=True), ForeignKey("batches.id", ondelete="CASCADE")
    )
    batch_index: Mapped[int | None] = mapped_column(Integer)
    first_row: Mapped[int | None] = mapped_column(BigInteger)
    output_data: Mapped[bytes | None] = mapped_column(LargeBinary, deferred=True)
    # Rows read in place from an uploaded .npy (input_data then holds only the header).
    input_file_id: Mapped[uuid.UUID | None] = mapped_column(
        UUID(as_uuid=True), ForeignKey("files.id", ondelete="SET NULL")
    )
    input_offset: Mapped[int | None] = mapped_column(BigInteger)
    # The file store's object the chunk's rows are in: its upload (from input_offset)
    # or its own packed inputs. NULL: the rows are in PostgreSQL, as before the store.
    input_key: Mapped[str | None] = mapped_column(Text)
    output_bytes: Mapped[int | None] = mapped_column(BigInteger)
    # A sync call's job: the Redis channel its worker publishes the answer on, once
    # the record is committed (app.sync.replies); NULL for every other job.
    reply_to: Mapped[str | None] = mapped_column(Text)
    # A line of a batch in OpenAI's Batch format: its `custom_id` and, for a line
    # refused before it ran, `refused` ("line": not a request; "request": a body
    # the /v1 door would refuse, with that answer's `status_code` and `param`).
    batch_line: Mapped[dict[str, Any] | None] = mapped_column(JSONB, deferred=True)
    # The W3C trace context its spans join (app.observability.tracing): admission's.
    traceparent: Mapped[str | None] = mapped_column(String(55))


class JobStep(Base):
    """A finished step of a pipeline job (or one element of a mapped step, -1 for a
    whole step): its outputs, packed. Written once; a retried job resumes after it."""

    __tablename__ = "job_steps"

    job_id: Mapped[uuid.UUID] = mapped_column(
        UUID(as_uuid=True), ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True
    )
    step: Mapped[str] = mapped_column(String(100), primary_key=True)
    element: Mapped[int] = mapped_column(Integer, primary_key=True)
    attempt: Mapped[int] = mapped_column(Integer)
    outputs: Mapped[bytes] = mapped_column(LargeBinary)
    finished_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), server_default=func.now()
    )


class JobEvent(Base):
    """A job's change of state, written by a trigger on `jobs` in the same statement
    as the change (see the migration), so it costs no extra round trip and can
    never disagree with the job row; or a piece of a generation's output (status
    `output`). Event streams read from here."""

    __tablename__ = "job_events"
    __table_args__ = (Index("ix_job_events_job", "job_id", "id"),)

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    job_id: Mapped[uuid.UUID] = mapped_column(
        UUID(as_uuid=True), ForeignKey("jobs.id", ondelete="CASCADE")
    )
    status: Mapped[str] = mapped_column(String(16))
    attempt: Mapped[int] = mapped_column(Integer)
    at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    # A generation's piece of output (status `output`, inserted by the decoding
    # worker, app.jobs.outputs): its text and the token ids that made it.
    text: Mapped[str | None] = mapped_column(Text)
    tokens: Mapped[list[int] | None] = mapped_column(ARRAY(Integer))
    # Its tokens' log-probabilities (OpenAI's `logprobs.content` items), when asked for.
    logprobs: Mapped[list[Any] | None] = mapped_column(JSONB)


class IdempotencyKey(Base):
    """An `Idempotency-Key` a tenant sent with POST /jobs, and the job it created."""

    __tablename__ = "idempotency_keys"

    tenant_id: Mapped[int] = mapped_column(
        ForeignKey("tenants.id", ondelete="CASCADE"), primary_key=True
    )
    key: Mapped[str] = mapped_column(String(255), primary_key=True)
    request_hash: Mapped[str] = mapped_column(String(64))
    # Indexed: a job's deletion finds its key here (the cascade).
    job_id: Mapped[uuid.UUID] = mapped_column(
        UUID(as_uuid=True), ForeignKey("jobs.id", ondelete="CASCADE"), index=True
    )
    created_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), server_default=func.now(), index=True
    )


class DeadLetter(Base):
    """A failed job, kept for a person to inspect, replay or purge."""

    __tablename__ = "dead_letters"
    __table_args__ = (
        Index(
            "ix_dead_letters_tenant_created", "tenant_id", text("created_at DESC"), text("id DESC")
        ),
        CheckConstraint("job_id IS NOT NULL OR batch_id IS NOT NULL", name="dead_letters_subject"),
    )

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    job_id: Mapped[uuid.UUID | None] = mapped_column(
        UUID(as_uuid=True), ForeignKey("jobs.id", ondelete="CASCADE"), index=True
    )
    # A batch's webhook that could not be delivered.
    batch_id: Mapped[uuid.UUID | None] = mapped_column(
        UUID(as_uuid=True), ForeignKey("batches.id", ondelete="CASCADE")
    )
    tenant_id: Mapped[int] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    model: Mapped[str] = mapped_column(String(100))
    model_version: Mapped[str] = mapped_column(String(50))
    error_code: Mapped[str] = mapped_column(String(64))
    error_class: Mapped[str] = mapped_column(String(200))
    message: Mapped[str] = mapped_column(Text)
    traceback: Mapped[str | None] = mapped_column(Text)
    attempts: Mapped[int] = mapped_column(Integer)
    first_failed_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    last_failed_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    # Set once, by the replay that won; a second replay of the same letter is a 409.
    replayed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # Set for a webhook delivery that used up its schedule; replay sends it again.
    delivery_id: Mapped[int | None] = mapped_column(
        BigInteger, ForeignKey("webhook_deliveries.id", ondelete="CASCADE")
    )


class AuditEvent(Base):
    """Who did what to which job or dead letter (replays, purges)."""

    __tablename__ = "audit_events"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    tenant_id: Mapped[int] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    action: Mapped[str] = mapped_column(String(64))
    subject: Mapped[str] = mapped_column(String(100))
    detail: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
