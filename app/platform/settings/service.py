"""The settings of the service as a whole: its servers, request and upload limits,
waits, queues and quotas, the model repository, batches and the database pool."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import BeforeValidator, Field
from pydantic_settings import BaseSettings

from app.platform.settings.values import (
    ROOT,
    Words,
    json_object,
)


class ServiceSettings(BaseSettings):
    """The settings of the service as a whole: its servers, request and upload limits,"""

    database_url: str = Field(
        default="",
        description="SQLAlchemy URL of PostgreSQL; empty = embedded server under VAR_DIR.",
    )
    redis_url: str = Field(
        default="",
        description="`redis://host:port/db` or `unix:///path.sock`; empty = embedded server.",
    )
    var_dir: Path = Field(
        default=ROOT / "var", description="Where the embedded PostgreSQL and Redis keep their data."
    )
    model_repository: Path = Field(
        default=ROOT / "models",
        description="The models, as `<name>/<version>/model.onnx` + `card.json`.",
    )
    max_request_bytes: int = Field(
        default=8 * 1024 * 1024, description="Request bodies above this are refused with 413."
    )
    max_upload_bytes: int = Field(
        default=2 * 1024 * 1024 * 1024,
        description="The largest file POST /files accepts (stored in the file store).",
    )
    file_store_url: str = Field(
        default="",
        description="Where uploaded files and batch results are kept: a directory, or any "
        "fsspec URL (`s3://bucket/prefix` through s3fs, which requirements.txt installs). "
        "Every API and worker process must name the same store. Empty: VAR_DIR/files.",
    )
    file_store_options: Annotated[str, BeforeValidator(json_object)] = Field(
        default="{}",
        description="The store's fsspec storage options as a JSON object, e.g. "
        '`{"endpoint_url": "http://minio:9000"}` for s3fs (which also reads '
        "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY itself).",
    )
    max_waits: int = Field(
        default=24,
        description="Requests one API process lets wait at once (event streams, long-polls, "
        "Prefer: wait, sync calls); keep it below its threads (make run: 32) so ordinary "
        "requests always find one.",
    )
    max_waits_per_tenant: int = Field(default=12, description="One tenant's share of MAX_WAITS.")
    max_requests_per_tenant: int = Field(
        default=24,
        description="Requests of one tenant whose bodies an API process awaits at once "
        "(uploads: until they end); each holds a thread meanwhile, so one tenant's slow "
        "clients leave threads for the others (beyond it, 429 too-many-requests). Keep it "
        "below the process's threads (make run: 32); 0 = no bound.",
    )
    max_queued_per_model: int = Field(
        default=50_000,
        description="Queued jobs a model takes before submits get 429 with Retry-After "
        "(batch chunks count as jobs); 0 = no bound.",
    )
    tenant_max_in_flight: int = Field(
        default=10_000,
        description="A tenant's jobs (and batch chunks) queued or running at once; below "
        "MAX_QUEUED_PER_MODEL, so no single tenant can fill a model's queue; 0 = no limit. "
        "This and the other TENANT_MAX_* settings are the quotas of tenants with none of "
        "their own (`manage.py tenants set`).",
    )
    tenant_max_submits_per_second: float = Field(
        default=0.0,
        description="A tenant's requests that make work (jobs, sync calls, batches) a second, "
        "counted across API processes (Redis); 0 = no limit.",
    )
    tenant_max_batch_rows_per_day: int = Field(
        default=0, description="A tenant's batch rows in any 24 hours; 0 = no limit."
    )
    tenant_max_stored_bytes: int = Field(
        default=0,
        description="A tenant's uploaded files plus batch results that retention still "
        "keeps; 0 = no limit.",
    )
    tenant_max_priority: int = Field(
        default=5, description="The highest `priority` (0-9) a tenant's jobs may ask for."
    )
    tenant_max_tokens_per_minute: int = Field(
        default=0,
        description="Tokens a tenant's generations take in any minute (prompt plus "
        "completion, counted by the decoding workers across machines in Redis); once "
        "spent, a generation's submit gets 429 with Retry-After; 0 = no limit.",
    )
    max_model_bytes: int = Field(
        default=2 * 1024 * 1024 * 1024,
        description="The largest model.onnx PUT /v2/repository/models/... accepts (streamed "
        "to a file in MODEL_REPOSITORY, never held in memory).",
    )
    allow_code_uploads: bool = Field(
        default=False,
        description="Whether PUT /v2/repository/models/... takes an archive of a folder with "
        "a model.py (code the workers run) from an operator key; off, code is added only "
        "with `manage.py models add` on a machine of the service. A tenant's key never "
        "uploads anything.",
    )
    model_state_cache_seconds: float = Field(
        default=2.0,
        description="How often a process checks the shared model states (PostgreSQL) and "
        "the repository's folder on its own. Changes made through the service (add, load, "
        "unload, remove) are announced over Redis and reach every process within a second; "
        "this is the fallback when Redis is away, and for files copied in by hand.",
    )
    batch_chunk_rows: int = Field(
        default=32768,
        description="Rows per chunk job of a batch, at most (a model's card may set its own): "
        "each chunk costs a claim and a finish, so fewer, larger chunks run closer to raw "
        "ONNX Runtime; a retry repeats one chunk.",
    )
    batch_chunk_bytes: int = Field(
        default=16 * 1024 * 1024,
        description="Bytes of inputs per chunk job, at most: rows of a large input make "
        "smaller chunks (a worker holds a chunk's inputs and outputs in memory).",
    )
    data_dir: Path = Field(
        default=ROOT / "var" / "data",
        description="Tenants' data areas (`DATA_DIR/<tenant>`), where schedules read inputs "
        "and write results: a folder every worker can reach (a shared mount in production). "
        "Unset: VAR_DIR/data.",
    )
    schedule_tick_seconds: float = Field(
        default=10.0, description="How often beat asks a worker to fire due schedules."
    )
    schedule_catch_up_seconds: float = Field(
        default=300.0,
        ge=0,
        description="A schedule's ticks missed for at most this long (Redis or PostgreSQL "
        "restarting, the control plane changing hands) each fire, late; ticks missed for "
        "longer are left out, but for the earliest, which fires once so the outage leaves a "
        "trace. 0: only that one.",
    )
    jobs_queue: str = Field(
        default="inference",
        description="The Celery queue of batch file splits, and of the wake-ups of models "
        "whose card names no queue (unless DEFAULT_MODEL_QUEUE says otherwise).",
    )
    default_model_queue: str = Field(
        default="",
        description="The queue a model's jobs run on when its card names none "
        '(`"queue": "gpu"`); empty = JOBS_QUEUE.',
    )
    worker_queues: Annotated[tuple[str, ...], Words] = Field(
        default=(),
        description="Comma list of the queues `manage.py worker` (and `make run`'s worker) "
        "serves: those of the models this machine can run. Empty: `manage.py worker` serves "
        "the default model queue and JOBS_QUEUE; `make run` every queue a model names too.",
    )
    drain_seconds: float = Field(
        default=1.0,
        description="How long one wake-up may keep a worker process on one model's jobs "
        "before it hands the rest to another wake-up, so other models get their turn.",
    )
    drain_linger_ms: float = Field(
        default=20.0,
        description="How long a worker keeps looking (every quarter of it) for a model's new "
        "jobs after its queue ran empty, before it lets the wake-up go.",
    )
    db_pool_size: int = Field(
        default=20,
        description="Database connections each process keeps; at least the API's threads, so "
        "a busy API never opens and closes connections per request.",
    )
    db_prepared_statements: bool = Field(
        default=True,
        description="Prepare the hottest statements (the workers' claim and finish) once per "
        "connection, so PostgreSQL does not plan them at every call. Set false behind a "
        "pooler that gives each transaction another server session (PgBouncer in "
        "transaction mode).",
    )
    api_key_cache_seconds: float = Field(
        default=5.0,
        description="How long an API process trusts a key it looked up; a revoked key stops "
        "working within this time. 0 looks every key up every time.",
    )
