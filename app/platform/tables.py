"""SQLAlchemy models. The `jobs` row is the source of truth for a job's state."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
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
    UniqueConstraint,
    false,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, UUID
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

JOB_STATUSES = ("queued", "running", "succeeded", "failed", "cancelled", "expired")
TERMINAL_STATUSES = frozenset({"succeeded", "failed", "cancelled", "expired"})
BATCH_STATUSES = (
    "queued", "running", "succeeded", "partially_succeeded", "failed", "cancelled",
)  # fmt: skip
BATCH_TERMINAL_STATUSES = frozenset(BATCH_STATUSES[2:])


class Base(DeclarativeBase):
    pass


class Tenant(Base):
    __tablename__ = "tenants"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(100), unique=True)
    # Standard Webhooks signing secret (`whsec_...`). It must be readable to sign with.
    webhook_secret: Mapped[str] = mapped_column(String(100))
    # During a rotation's overlap, deliveries are signed with both secrets.
    previous_webhook_secret: Mapped[str | None] = mapped_column(String(100))
    previous_secret_expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    # Quotas (app.jobs.quotas), set with `manage.py tenants set`; NULL: the TENANT_*
    # setting's default. Jobs queued or running at once; submits a second (every
    # door); batch rows in 24 h; bytes of uploads and batch results kept; the highest
    # `priority` its jobs may ask for.
    max_in_flight: Mapped[int | None] = mapped_column(Integer)
    max_submits_per_second: Mapped[float | None] = mapped_column(Float)
    max_batch_rows_per_day: Mapped[int | None] = mapped_column(BigInteger)
    max_stored_bytes: Mapped[int | None] = mapped_column(BigInteger)
    max_priority: Mapped[int | None] = mapped_column(SmallInteger)


API_KEY_KINDS = ("tenant", "operator")


class ApiKey(Base):
    """A tenant's key (job routes) or an operator's (the model repository routes).
    An operator key belongs to no tenant, so it can never read a tenant's jobs."""

    __tablename__ = "api_keys"
    __table_args__ = (
        CheckConstraint(
            "(kind = 'tenant' AND tenant_id IS NOT NULL) OR "
            "(kind = 'operator' AND tenant_id IS NULL)",
            name="api_keys_kind_valid",
        ),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    tenant_id: Mapped[int | None] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    kind: Mapped[str] = mapped_column(String(16), server_default="tenant")
    # SHA-256 of the key: keys are 256-bit random tokens, so a fast hash is safe and
    # keeps the per-request lookup an index probe.
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    # The first characters of the key, so a person can tell keys apart.
    prefix: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # A key given a lifetime stops working at this time (NULL: until revoked).
    expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class Job(Base):
    __tablename__ = "jobs"
    # Fetch server defaults (created_at, ...) in the INSERT's RETURNING: no extra query.
    __mapper_args__ = {"eager_defaults": True}
    __table_args__ = (
        CheckConstraint(
            "status IN (" + ", ".join(f"'{s}'" for s in JOB_STATUSES) + ")",
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
            postgresql_where=text("status IN ('queued', 'running')"),
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
        Index(
            "ix_jobs_deadline",
            "deadline_at",
            postgresql_where=text("status IN ('queued', 'running') AND deadline_at IS NOT NULL"),
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
            postgresql_where=text("batch_id IS NOT NULL AND status IN ('queued', 'running')"),
        ),
    )

    id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True)
    tenant_id: Mapped[int] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    model: Mapped[str] = mapped_column(String(100))
    model_version: Mapped[str] = mapped_column(String(50))
    status: Mapped[str] = mapped_column(String(16), server_default="queued")
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
    # the record is committed (app.jobs.replies); NULL for every other job.
    reply_to: Mapped[str | None] = mapped_column(Text)


class File(Base):
    """An uploaded input file (`.npy`, `.jsonl`, `.csv`, `.parquet`). Its bytes are
    the file store's object `store_key`; files uploaded before the store keep
    theirs in `file_parts` (`store_key` NULL)."""

    __tablename__ = "files"
    __table_args__ = (Index("ix_files_tenant_created", "tenant_id", "created_at"),)

    id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True)
    tenant_id: Mapped[int] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    filename: Mapped[str] = mapped_column(String(255))
    format: Mapped[str] = mapped_column(String(8))
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    sha256: Mapped[str] = mapped_column(String(64))
    parts: Mapped[int] = mapped_column(Integer)
    store_key: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


class FilePart(Base):
    __tablename__ = "file_parts"

    file_id: Mapped[uuid.UUID] = mapped_column(
        UUID(as_uuid=True), ForeignKey("files.id", ondelete="CASCADE"), primary_key=True
    )
    seq: Mapped[int] = mapped_column(Integer, primary_key=True)
    data: Mapped[bytes] = mapped_column(LargeBinary)


class Batch(Base):
    """Many rows for one model, run as chunk jobs (`jobs.batch_id`). Progress is
    counted from the chunks; the batch row holds what the chunks cannot say."""

    __tablename__ = "batches"
    __mapper_args__ = {"eager_defaults": True}
    __table_args__ = (
        CheckConstraint(
            "status IN (" + ", ".join(f"'{s}'" for s in BATCH_STATUSES) + ")",
            name="batches_status_valid",
        ),
        Index("ix_batches_tenant_created", "tenant_id", text("created_at DESC"), text("id DESC")),
        Index(
            "ix_batches_open", "split_at", postgresql_where=text("status IN ('queued', 'running')")
        ),
        Index(
            "ix_batches_schedule_run",
            "schedule_id",
            "scheduled_for",
            unique=True,
            postgresql_where=text("schedule_id IS NOT NULL"),
        ),
        Index(
            "ix_batches_to_purge",
            "finished_at",
            postgresql_where=text("purged_at IS NULL AND finished_at IS NOT NULL"),
        ),
        Index(
            "ix_batches_to_export",
            "finished_at",
            postgresql_where=text("output_path IS NOT NULL AND exported_at IS NULL"),
        ),
    )

    id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True)
    tenant_id: Mapped[int] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    model: Mapped[str] = mapped_column(String(100))
    model_version: Mapped[str] = mapped_column(String(50))
    # queued: its file is being cut into chunks; running: every chunk exists.
    status: Mapped[str] = mapped_column(String(24), server_default="queued")
    input_file_id: Mapped[uuid.UUID | None] = mapped_column(
        UUID(as_uuid=True), ForeignKey("files.id", ondelete="SET NULL")
    )
    chunk_rows: Mapped[int] = mapped_column(Integer)
    rows: Mapped[int | None] = mapped_column(BigInteger)  # known once split
    # Bytes of its chunks' stored outputs, counted when it finished (storage quota).
    result_bytes: Mapped[int | None] = mapped_column(BigInteger)
    chunks: Mapped[int | None] = mapped_column(Integer)
    # Rows cut into chunks so far, and when: a split that stopped resumes from here.
    split_rows: Mapped[int] = mapped_column(BigInteger, server_default="0")
    split_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    max_attempts: Mapped[int] = mapped_column(Integer, server_default="3")
    error_code: Mapped[str | None] = mapped_column(String(64))
    error_message: Mapped[str | None] = mapped_column(Text)
    webhook_url: Mapped[str | None] = mapped_column(Text)
    webhook_events: Mapped[list[str] | None] = mapped_column(ARRAY(String(32)))
    cancel_requested_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # Set when retention deleted its objects (chunk inputs, results) from the file store.
    purged_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # A schedule's run: which tick it is, and where its results are written.
    schedule_id: Mapped[uuid.UUID | None] = mapped_column(
        UUID(as_uuid=True), ForeignKey("schedules.id", ondelete="SET NULL")
    )
    scheduled_for: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    output_path: Mapped[str | None] = mapped_column(Text)
    exported_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class Schedule(Base):
    """A cron schedule whose every run is a batch (`batches.schedule_id`)."""

    __tablename__ = "schedules"
    __mapper_args__ = {"eager_defaults": True}
    __table_args__ = (
        CheckConstraint(
            "(input_file_id IS NULL) <> (input_path IS NULL)", name="schedules_one_input"
        ),
        UniqueConstraint("tenant_id", "name", name="uq_schedules_tenant_name"),
        Index("ix_schedules_due", "next_run_at", postgresql_where=text("NOT paused")),
    )

    id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True)
    tenant_id: Mapped[int] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(100))
    cron: Mapped[str] = mapped_column(String(120))
    timezone: Mapped[str] = mapped_column(String(64))
    model: Mapped[str] = mapped_column(String(100))
    model_version: Mapped[str | None] = mapped_column(String(50))
    # The input: an uploaded file, or a file or folder in the tenant's data area.
    input_file_id: Mapped[uuid.UUID | None] = mapped_column(
        UUID(as_uuid=True), ForeignKey("files.id", ondelete="RESTRICT")
    )
    input_path: Mapped[str | None] = mapped_column(Text)
    # A folder of the tenant's data area each run's results are written to, if any.
    output_path: Mapped[str | None] = mapped_column(Text)
    paused: Mapped[bool] = mapped_column(Boolean, server_default=false())
    # The one tick due next; firing it moves it on (see app.schedules.service.fire_due).
    next_run_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    last_run_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


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


class JobEvent(Base):
    """A job's change of state, written by a trigger on `jobs` in the same statement
    as the change (see the migration), so it costs no extra round trip and can
    never disagree with the job row. Event streams read from here."""

    __tablename__ = "job_events"
    __table_args__ = (Index("ix_job_events_job", "job_id", "id"),)

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    job_id: Mapped[uuid.UUID] = mapped_column(
        UUID(as_uuid=True), ForeignKey("jobs.id", ondelete="CASCADE")
    )
    status: Mapped[str] = mapped_column(String(16))
    attempt: Mapped[int] = mapped_column(Integer)
    at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


class IdempotencyKey(Base):
    """An `Idempotency-Key` a tenant sent with POST /jobs, and the job it created."""

    __tablename__ = "idempotency_keys"

    tenant_id: Mapped[int] = mapped_column(
        ForeignKey("tenants.id", ondelete="CASCADE"), primary_key=True
    )
    key: Mapped[str] = mapped_column(String(255), primary_key=True)
    request_hash: Mapped[str] = mapped_column(String(64))
    job_id: Mapped[uuid.UUID] = mapped_column(
        UUID(as_uuid=True), ForeignKey("jobs.id", ondelete="CASCADE")
    )
    created_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), server_default=func.now(), index=True
    )


class WebhookDelivery(Base):
    """One event to push to one URL; retried on its schedule, kept as a log."""

    __tablename__ = "webhook_deliveries"
    __table_args__ = (
        Index("ix_webhook_deliveries_job", "job_id", "id"),
        Index(
            "ix_webhook_deliveries_due",
            "next_attempt_at",
            postgresql_where=text("status IN ('pending', 'sending')"),
        ),
        # The delivery sweep's other branch: sends whose worker died (lease run out).
        Index(
            "ix_webhook_deliveries_lease",
            "lease_expires_at",
            postgresql_where=text("status IN ('sending', 'in_flight')"),
        ),
        Index("ix_webhook_deliveries_batch", "batch_id", "id"),
        CheckConstraint(
            "job_id IS NOT NULL OR batch_id IS NOT NULL", name="webhook_deliveries_subject"
        ),
    )

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    # The job the event is about, or the batch (batch.* events).
    job_id: Mapped[uuid.UUID | None] = mapped_column(
        UUID(as_uuid=True), ForeignKey("jobs.id", ondelete="CASCADE")
    )
    batch_id: Mapped[uuid.UUID | None] = mapped_column(
        UUID(as_uuid=True), ForeignKey("batches.id", ondelete="CASCADE")
    )
    tenant_id: Mapped[int] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    event_type: Mapped[str] = mapped_column(String(32))
    # The Standard Webhooks message id: the same on every attempt of this event.
    message_id: Mapped[str] = mapped_column(String(64), unique=True)
    url: Mapped[str] = mapped_column(Text)
    # Fixed at the first attempt, so every retry sends the same body.
    payload: Mapped[str | None] = mapped_column(Text)
    status: Mapped[str] = mapped_column(String(16), server_default="pending")
    attempts: Mapped[int] = mapped_column(Integer, server_default="0")
    next_attempt_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), server_default=func.now()
    )
    lease_expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    delivered_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class WebhookAttempt(Base):
    """One HTTP attempt of a delivery: the delivery log clients read."""

    __tablename__ = "webhook_attempts"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    delivery_id: Mapped[int] = mapped_column(
        BigInteger, ForeignKey("webhook_deliveries.id", ondelete="CASCADE"), index=True
    )
    at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    url: Mapped[str] = mapped_column(Text)
    status_code: Mapped[int | None] = mapped_column(Integer)
    error: Mapped[str | None] = mapped_column(Text)
    latency_ms: Mapped[float | None] = mapped_column()


DISABLE_REASONS = ("gone", "failing")


class DisabledWebhookUrl(Base):
    """A URL nothing more is sent to for the tenant: it answered 410 Gone (`gone`), or
    every delivery to it failed for WEBHOOK_DISABLE_AFTER_SECONDS (`failing`)."""

    __tablename__ = "disabled_webhook_urls"
    __table_args__ = (
        CheckConstraint(
            "reason IN (" + ", ".join(f"'{r}'" for r in DISABLE_REASONS) + ")",
            name="disabled_webhook_urls_reason_valid",
        ),
    )

    tenant_id: Mapped[int] = mapped_column(
        ForeignKey("tenants.id", ondelete="CASCADE"), primary_key=True
    )
    url: Mapped[str] = mapped_column(Text, primary_key=True)
    disabled_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), server_default=func.now()
    )
    reason: Mapped[str] = mapped_column(String(16), server_default="gone")


class FailingWebhookUrl(Base):
    """A tenant's URL whose deliveries have all failed since `failing_since` (its first
    failure after its last success): the row goes at the next success."""

    __tablename__ = "failing_webhook_urls"

    tenant_id: Mapped[int] = mapped_column(
        ForeignKey("tenants.id", ondelete="CASCADE"), primary_key=True
    )
    url: Mapped[str] = mapped_column(Text, primary_key=True)
    failing_since: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), server_default=func.now()
    )


MODEL_STATES = ("READY", "UNAVAILABLE")


class ModelState(Base):
    """A model version's load state, shared by every API and worker process (which
    may run on other machines): a version with no row serves if its files are in
    the repository; UNAVAILABLE (unloaded, or failed its check) does not.
    Processes notice changes by the newest `updated_at` (app.models.states)."""

    __tablename__ = "model_states"
    __table_args__ = (
        CheckConstraint(
            "state IN (" + ", ".join(f"'{s}'" for s in MODEL_STATES) + ")",
            name="model_states_state_valid",
        ),
        Index("ix_model_states_updated", "updated_at"),
    )

    name: Mapped[str] = mapped_column(String(100), primary_key=True)
    version: Mapped[str] = mapped_column(String(50), primary_key=True)
    state: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str | None] = mapped_column(Text)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


class StreamBinding(Base):
    """A tenant's model bound to an input log and an output log (the stream door):
    entries appended to `input` become jobs, each result is appended to `output`,
    entries that cannot become a job go to `dead_letter`. The names are the full
    log names (`<STREAMS_PREFIX>:<tenant>:<name>`), kept as they were made, so a
    later change of STREAMS_PREFIX never moves an existing binding's logs."""

    __tablename__ = "stream_bindings"
    __mapper_args__ = {"eager_defaults": True}
    __table_args__ = (UniqueConstraint("input", name="uq_stream_bindings_input"),)

    id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True)
    tenant_id: Mapped[int] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    model: Mapped[str] = mapped_column(String(100))
    # None: the newest serving version, looked up for each batch of entries.
    model_version: Mapped[str | None] = mapped_column(String(50))
    input: Mapped[str] = mapped_column(String(300))
    output: Mapped[str] = mapped_column(String(300))
    dead_letter: Mapped[str] = mapped_column(String(300))
    paused: Mapped[bool] = mapped_column(Boolean, server_default=false())
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


class StreamEntry(Base):
    """An input entry that became a job, and the outbox of its result.

    Written in the transaction that inserts the job, keyed by the entry's id in its
    log: a redelivered entry finds its job here instead of making a second one.
    `published_at` is set once the result was appended to the output log."""

    __tablename__ = "stream_entries"
    __table_args__ = (
        # The publisher's sweep and the unpublished count per binding.
        Index(
            "ix_stream_entries_unpublished",
            "binding_id",
            "created_at",
            postgresql_where=text("published_at IS NULL"),
        ),
        # The publisher's look-up of the jobs a NOTIFY named.
        Index("ix_stream_entries_job", "job_id", postgresql_where=text("published_at IS NULL")),
        # Retention deletes old rows by age: a BRIN index costs next to nothing to keep.
        Index("ix_stream_entries_created", "created_at", postgresql_using="brin"),
    )

    binding_id: Mapped[uuid.UUID] = mapped_column(
        UUID(as_uuid=True), ForeignKey("stream_bindings.id", ondelete="CASCADE"), primary_key=True
    )
    entry_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    # The caller's own id of the request (the entry's `id` field).
    request_id: Mapped[str] = mapped_column(String(200))
    # Deferred: the entry is inserted first (ON CONFLICT DO NOTHING decides which
    # entries are new), then the jobs of the new ones, in the same transaction.
    job_id: Mapped[uuid.UUID] = mapped_column(
        UUID(as_uuid=True),
        ForeignKey("jobs.id", ondelete="CASCADE", deferrable=True, initially="DEFERRED"),
    )
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    published_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
