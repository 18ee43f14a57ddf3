"""Every setting, read once from the environment.

`Settings.from_env()` is the only place that reads `os.environ` for the service;
everything else receives a `Settings`. Unset `DATABASE_URL` / `REDIS_URL` mean
"use the embedded PostgreSQL / Redis under `VAR_DIR`" (see `app.platform.embedded`),
which the launcher resolves to real URLs before the processes start.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the checkout, two above app/platform/


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    return int(raw) if raw not in (None, "") else default


def _env_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    return float(raw) if raw not in (None, "") else default


def _env_str(name: str, default: str) -> str:
    raw = os.environ.get(name)
    return raw if raw not in (None, "") else default


@dataclass(frozen=True)
class Settings:
    """Service settings. Field comments name the environment variable."""

    # DATABASE_URL: SQLAlchemy URL of PostgreSQL; empty = embedded server under VAR_DIR.
    database_url: str = ""
    # REDIS_URL: redis://host:port/db or unix:///path.sock; empty = embedded server.
    redis_url: str = ""
    # VAR_DIR: where the embedded PostgreSQL and Redis keep their data.
    var_dir: Path = field(default_factory=lambda: ROOT / "var")
    # MODEL_REPOSITORY: <name>/<version>/model.onnx + card.json.
    model_repository: Path = field(default_factory=lambda: ROOT / "models")
    # MAX_REQUEST_BYTES: request bodies above this are refused with 413.
    max_request_bytes: int = 8 * 1024 * 1024
    # MAX_UPLOAD_BYTES: the largest file POST /files accepts (stored in PostgreSQL).
    max_upload_bytes: int = 2 * 1024 * 1024 * 1024
    # MAX_WAITS: requests one API process lets wait at once (event streams, long-polls,
    # Prefer: wait, sync calls); keep it below its threads (make run: 32) so ordinary
    # requests always find one. MAX_WAITS_PER_TENANT: one tenant's share of them.
    max_waits: int = 24
    max_waits_per_tenant: int = 12
    # MAX_QUEUED_PER_MODEL: queued jobs a model takes before submits get 429 with
    # Retry-After (batch chunks count as jobs); 0 = no bound.
    max_queued_per_model: int = 50_000
    # Per-tenant quotas' defaults, for tenants with none of their own (`manage.py tenants
    # set`); 0 = no limit. TENANT_MAX_IN_FLIGHT: a tenant's jobs (and batch chunks)
    # queued or running at once; below MAX_QUEUED_PER_MODEL, so no single tenant can
    # fill a model's queue.
    tenant_max_in_flight: int = 10_000
    # TENANT_MAX_SUBMITS_PER_SECOND: a tenant's requests that make work (jobs, sync
    # calls, batches) a second, counted across API processes (Redis); 0 = no limit.
    tenant_max_submits_per_second: float = 0
    # TENANT_MAX_BATCH_ROWS_PER_DAY: a tenant's batch rows in any 24 hours; 0 = no limit.
    tenant_max_batch_rows_per_day: int = 0
    # TENANT_MAX_STORED_BYTES: a tenant's uploaded files plus batch results that
    # retention still keeps; 0 = no limit.
    tenant_max_stored_bytes: int = 0
    # TENANT_MAX_PRIORITY: the highest `priority` (0-9) a tenant's jobs may ask for.
    tenant_max_priority: int = 5
    # MAX_MODEL_BYTES: the largest model.onnx PUT /v2/repository/models/... accepts
    # (streamed to a file in MODEL_REPOSITORY, never held in memory).
    max_model_bytes: int = 2 * 1024 * 1024 * 1024
    # MODEL_STATE_CACHE_SECONDS: how often a process checks the shared model states
    # (PostgreSQL) for a load, unload or new model; such changes reach every API and
    # worker process within this time.
    model_state_cache_seconds: float = 2.0
    # BATCH_CHUNK_ROWS: rows per chunk job of a batch (a model's card may set its own).
    batch_chunk_rows: int = 4096
    # DATA_DIR: tenants' data areas (DATA_DIR/<tenant>), where schedules read inputs and
    # write results: a folder every worker can reach (a shared mount in production).
    # Default: VAR_DIR/data.
    data_dir: Path = field(default_factory=lambda: ROOT / "var" / "data")
    # SCHEDULE_TICK_SECONDS: how often beat asks a worker to fire due schedules.
    schedule_tick_seconds: float = 10.0
    # JOBS_QUEUE: the Celery queue of batch file splits, and of the wake-ups of models
    # whose card names no queue (unless DEFAULT_MODEL_QUEUE says otherwise).
    jobs_queue: str = "inference"
    # DEFAULT_MODEL_QUEUE: the queue a model's jobs run on when its card names none
    # (`"queue": "gpu"`); empty = JOBS_QUEUE.
    default_model_queue: str = ""
    # WORKER_QUEUES: comma list of the queues `manage.py worker` (and `make run`'s worker)
    # serves: those of the models this machine can run. Empty: `manage.py worker` serves
    # the default model queue and JOBS_QUEUE; `make run` every queue a model names too.
    worker_queues: tuple[str, ...] = ()
    # DRAIN_SECONDS: how long one wake-up may keep a worker process on one model's jobs
    # before it hands the rest to another wake-up, so other models get their turn.
    drain_seconds: float = 1.0
    # DRAIN_LINGER_MS: how long a worker keeps looking (every quarter of it) for a
    # model's new jobs after its queue ran empty, before it lets the wake-up go.
    drain_linger_ms: float = 20.0
    # DB_POOL_SIZE: database connections each process keeps; at least the API's threads,
    # so a busy API never opens and closes connections per request.
    db_pool_size: int = 20
    # API_KEY_CACHE_SECONDS: how long an API process trusts a key it looked up; a
    # revoked key stops working within this time. 0 looks every key up every time.
    api_key_cache_seconds: float = 5.0
    # JOB_MAX_ATTEMPTS: how many times a job may be claimed by a worker before it fails.
    job_max_attempts: int = 3
    # REPUBLISH_AFTER_SECONDS: a queued job not picked up for this long may have lost
    # its wake-up with the broker; the sweep wakes its model's workers again.
    republish_after_seconds: float = 60.0
    # JOB_LEASE_SECONDS: a running job's lease; the worker renews it while the job runs,
    # and a job whose lease ran out (its worker died) is queued again by the sweep.
    job_lease_seconds: float = 60.0
    # SWEEP_INTERVAL_SECONDS: how often beat runs the sweeps (leases, retries, deadlines).
    sweep_interval_seconds: float = 5.0
    # RETRY_BACKOFF_SECONDS / RETRY_BACKOFF_MAX_SECONDS: exponential backoff with full
    # jitter between attempts of a job that failed for a transient reason.
    retry_backoff_seconds: float = 2.0
    retry_backoff_max_seconds: float = 300.0
    # JOB_TIME_LIMIT_SECONDS: the longest a job may run; the worker process running it
    # is then killed and the job's lease brings it back (and its cap ends it).
    job_time_limit_seconds: float = 600.0
    # BROKER_VISIBILITY_TIMEOUT_SECONDS: Redis hands an unacknowledged message to another
    # worker after this long; keep it above JOB_TIME_LIMIT_SECONDS (a warning says so if
    # not; leases still keep a second worker from running the job).
    broker_visibility_timeout_seconds: float = 3600.0
    # BROKER_RESTORE_INTERVAL_SECONDS: how often workers put back messages whose
    # visibility timeout passed (kombu's default scan is about every 100 s).
    broker_restore_interval_seconds: float = 10.0
    # RETENTION_SECONDS: inputs and outputs of finished jobs are deleted after this long
    # (the job's metadata stays). 0 keeps them forever.
    retention_seconds: float = 7 * 24 * 3600.0
    # Retention of the logs each job leaves (deleted by the hourly purge, in batches;
    # 0 keeps them forever), each below.

    # JOB_EVENT_RETENTION_SECONDS: job events (event streams, the job's history).
    job_event_retention_seconds: float = 30 * 24 * 3600.0
    # WEBHOOK_PAYLOAD_RETENTION_SECONDS: the body a finished delivery sent (it holds the
    # job's outputs: the same default as RETENTION_SECONDS).
    webhook_payload_retention_seconds: float = 7 * 24 * 3600.0
    # WEBHOOK_LOG_RETENTION_SECONDS: finished deliveries and their attempts (a failed
    # delivery stays while its dead letter does).
    webhook_log_retention_seconds: float = 30 * 24 * 3600.0
    # DEAD_LETTER_RETENTION_SECONDS: dead letters, replayed or not.
    dead_letter_retention_seconds: float = 90 * 24 * 3600.0
    # AUDIT_RETENTION_SECONDS: audit rows (replays, purges).
    audit_retention_seconds: float = 365 * 24 * 3600.0
    # CONTROL_QUEUE: the Celery queue of beat's sweeps (leases, deadlines, due webhooks,
    # schedules, purges), served by the control worker, so a backlog of jobs never
    # delays them.
    control_queue: str = "control"
    # WEBHOOKS_QUEUE: the Celery queue of webhook deliveries, so slow receivers never
    # hold inference workers.
    webhooks_queue: str = "webhooks"
    # WEBHOOK_TIMEOUT_SECONDS: the whole budget of one attempt (connect, send, answer,
    # reading at most 4 KiB of the body), wall clock: a receiver that trickles is cut off.
    webhook_timeout_seconds: float = 15.0
    # WEBHOOK_RETRY_SCHEDULE: seconds before each attempt (comma list); its length is the
    # number of attempts. Jittered by up to 10%. Default: over about a day.
    webhook_retry_schedule: tuple[float, ...] = (
        0, 5, 300, 1800, 7200, 18000, 36000, 50400, 72000, 86400,
    )  # fmt: skip
    # WEBHOOK_ALLOW_PRIVATE_NETWORKS: allow webhook URLs on loopback and private ranges
    # (development and tests). Off by default: those are where SSRF does harm.
    webhook_allow_private_networks: bool = False
    # WEBHOOK_ALLOWED_NETWORKS: comma list of CIDRs that count as public for webhook URLs
    # (a known internal receiver; tests use a loopback address as the "public" one).
    webhook_allowed_networks: tuple[str, ...] = ()
    # WEBHOOK_PROXY_URL: send every delivery through this http:// egress proxy, which then
    # resolves and enforces the egress policy. Unset: connect to the checked address.
    # Proxy variables of the environment (HTTP_PROXY, .netrc) are never used.
    webhook_proxy_url: str = ""
    # WEBHOOK_MAX_PAYLOAD_BYTES: a larger job is sent with its outputs replaced by a link.
    webhook_max_payload_bytes: int = 256 * 1024
    # GUARDS_OFF: comma list of safety guards to switch off: claim, finish (the state and
    # attempt checks of those UPDATEs), lease (taking back jobs of dead workers, by the
    # sweep or by a redelivered message),
    # republish (sending lost or unsent messages again), cap (the attempt cap on retries),
    # retry (the task sending its message again when the database went away).
    # Only the fault suite sets it, to show what each guard prevents. Never in production.
    guards_off: frozenset[str] = frozenset()
    # SYNC_TIMEOUT_SECONDS: how long a sync inference call waits for its job before it
    # answers 504 with the job's id (the job goes on); a request may ask for less.
    sync_timeout_seconds: float = 30.0
    # MAX_WAIT_SECONDS: the cap on `Prefer: wait=N` and on a sync call's own timeout.
    max_wait_seconds: float = 60.0
    # ORT_PROVIDER: auto (CUDA when it works, else CPU), cuda or cpu.
    ort_provider: str = "auto"
    # ORT_INTRA_OP_THREADS: threads per ONNX Runtime session (0 = ORT's default).
    ort_intra_op_threads: int = 1
    # CUDA_DEVICES: comma list of GPU ids; worker process i runs its CUDA sessions on
    # device i mod len (one process per GPU). Empty: ORT's default device.
    cuda_devices: tuple[int, ...] = ()
    # SECRET_KEY: signs the status page's operator session cookie. Empty: a random key
    # made once and kept in VAR_DIR/secret-key, which every process on this machine
    # shares; set it (the same value) where API processes run on several machines.
    secret_key: str = field(default="", repr=False)
    # STATUS_CACHE_SECONDS: how long an API process reuses the status page's numbers
    # and its answer from the workers, so reloading the page costs the database and
    # the broker at most one round of queries (and one 1 s worker census) per period.
    status_cache_seconds: float = 5.0
    # FLOWER_URL: where the status page links to Flower; empty: no link (`make run` sets
    # it to its own Flower).
    flower_url: str = ""
    # FLOWER_BASIC_AUTH: user:password that `make run` starts Flower with. Empty: user
    # `admin` and a random password kept in VAR_DIR/flower-password.
    flower_basic_auth: str = field(default="", repr=False)
    # LOG_LEVEL: DEBUG, INFO, WARNING or ERROR, for every process.
    log_level: str = "INFO"
    # LOG_FORMAT: text (readable lines) or json (one JSON object a line, with job_id,
    # tenant, model and request_id where known), for every process.
    log_format: str = "text"
    # METRICS_TOKEN: when set, GET /metrics (and the workers' metrics endpoints) want
    # `Authorization: Bearer <token>`: their labels name tenants and models. Unset: open.
    metrics_token: str = ""
    # WORKER_METRICS_PORT: a Celery worker serves its processes' metrics (Prometheus
    # text) on this port, from its main process; 0 = none. `make run` gives its three
    # workers this port and the next two.
    worker_metrics_port: int = 0
    # WORKER_METRICS_HOST: the address a worker's metrics endpoint binds (0.0.0.0 for a
    # scraper on another machine; `make run`: HOST).
    worker_metrics_host: str = "127.0.0.1"

    @classmethod
    def from_env(cls) -> Settings:
        d = cls()
        return cls(
            database_url=_env_str("DATABASE_URL", d.database_url),
            redis_url=_env_str("REDIS_URL", d.redis_url),
            var_dir=Path(_env_str("VAR_DIR", str(d.var_dir))),
            model_repository=Path(_env_str("MODEL_REPOSITORY", str(d.model_repository))),
            max_request_bytes=_env_int("MAX_REQUEST_BYTES", d.max_request_bytes),
            max_upload_bytes=_env_int("MAX_UPLOAD_BYTES", d.max_upload_bytes),
            max_model_bytes=_env_int("MAX_MODEL_BYTES", d.max_model_bytes),
            model_state_cache_seconds=_env_float(
                "MODEL_STATE_CACHE_SECONDS", d.model_state_cache_seconds
            ),
            batch_chunk_rows=_env_int("BATCH_CHUNK_ROWS", d.batch_chunk_rows),
            max_queued_per_model=_env_int("MAX_QUEUED_PER_MODEL", d.max_queued_per_model),
            tenant_max_in_flight=_env_int("TENANT_MAX_IN_FLIGHT", d.tenant_max_in_flight),
            tenant_max_submits_per_second=_env_float(
                "TENANT_MAX_SUBMITS_PER_SECOND", d.tenant_max_submits_per_second
            ),
            tenant_max_batch_rows_per_day=_env_int(
                "TENANT_MAX_BATCH_ROWS_PER_DAY", d.tenant_max_batch_rows_per_day
            ),
            tenant_max_stored_bytes=_env_int("TENANT_MAX_STORED_BYTES", d.tenant_max_stored_bytes),
            tenant_max_priority=_env_int("TENANT_MAX_PRIORITY", d.tenant_max_priority),
            max_waits=_env_int("MAX_WAITS", d.max_waits),
            max_waits_per_tenant=_env_int("MAX_WAITS_PER_TENANT", d.max_waits_per_tenant),
            data_dir=Path(_env_str("DATA_DIR", _env_str("VAR_DIR", str(d.var_dir)) + "/data")),
            schedule_tick_seconds=_env_float("SCHEDULE_TICK_SECONDS", d.schedule_tick_seconds),
            jobs_queue=_env_str("JOBS_QUEUE", d.jobs_queue),
            default_model_queue=_env_str("DEFAULT_MODEL_QUEUE", d.default_model_queue),
            worker_queues=tuple(
                q.strip() for q in _env_str("WORKER_QUEUES", "").split(",") if q.strip()
            ),
            drain_seconds=_env_float("DRAIN_SECONDS", d.drain_seconds),
            drain_linger_ms=_env_float("DRAIN_LINGER_MS", d.drain_linger_ms),
            db_pool_size=_env_int("DB_POOL_SIZE", d.db_pool_size),
            api_key_cache_seconds=_env_float("API_KEY_CACHE_SECONDS", d.api_key_cache_seconds),
            job_max_attempts=_env_int("JOB_MAX_ATTEMPTS", d.job_max_attempts),
            republish_after_seconds=_env_float(
                "REPUBLISH_AFTER_SECONDS", d.republish_after_seconds
            ),
            job_lease_seconds=_env_float("JOB_LEASE_SECONDS", d.job_lease_seconds),
            sweep_interval_seconds=_env_float("SWEEP_INTERVAL_SECONDS", d.sweep_interval_seconds),
            retry_backoff_seconds=_env_float("RETRY_BACKOFF_SECONDS", d.retry_backoff_seconds),
            retry_backoff_max_seconds=_env_float(
                "RETRY_BACKOFF_MAX_SECONDS", d.retry_backoff_max_seconds
            ),
            job_time_limit_seconds=_env_float("JOB_TIME_LIMIT_SECONDS", d.job_time_limit_seconds),
            broker_visibility_timeout_seconds=_env_float(
                "BROKER_VISIBILITY_TIMEOUT_SECONDS", d.broker_visibility_timeout_seconds
            ),
            broker_restore_interval_seconds=_env_float(
                "BROKER_RESTORE_INTERVAL_SECONDS", d.broker_restore_interval_seconds
            ),
            retention_seconds=_env_float("RETENTION_SECONDS", d.retention_seconds),
            job_event_retention_seconds=_env_float(
                "JOB_EVENT_RETENTION_SECONDS", d.job_event_retention_seconds
            ),
            webhook_payload_retention_seconds=_env_float(
                "WEBHOOK_PAYLOAD_RETENTION_SECONDS", d.webhook_payload_retention_seconds
            ),
            webhook_log_retention_seconds=_env_float(
                "WEBHOOK_LOG_RETENTION_SECONDS", d.webhook_log_retention_seconds
            ),
            dead_letter_retention_seconds=_env_float(
                "DEAD_LETTER_RETENTION_SECONDS", d.dead_letter_retention_seconds
            ),
            audit_retention_seconds=_env_float(
                "AUDIT_RETENTION_SECONDS", d.audit_retention_seconds
            ),
            control_queue=_env_str("CONTROL_QUEUE", d.control_queue),
            webhooks_queue=_env_str("WEBHOOKS_QUEUE", d.webhooks_queue),
            webhook_timeout_seconds=_env_float(
                "WEBHOOK_TIMEOUT_SECONDS", d.webhook_timeout_seconds
            ),
            webhook_retry_schedule=tuple(
                float(x)
                for x in _env_str(
                    "WEBHOOK_RETRY_SCHEDULE", ",".join(f"{x:g}" for x in d.webhook_retry_schedule)
                ).split(",")
            ),
            webhook_allow_private_networks=_env_str(
                "WEBHOOK_ALLOW_PRIVATE_NETWORKS", "false"
            ).lower()
            in ("1", "true", "yes"),
            webhook_allowed_networks=tuple(
                n.strip() for n in _env_str("WEBHOOK_ALLOWED_NETWORKS", "").split(",") if n.strip()
            ),
            webhook_proxy_url=_env_str("WEBHOOK_PROXY_URL", d.webhook_proxy_url),
            webhook_max_payload_bytes=_env_int(
                "WEBHOOK_MAX_PAYLOAD_BYTES", d.webhook_max_payload_bytes
            ),
            guards_off=frozenset(
                g.strip() for g in _env_str("GUARDS_OFF", "").split(",") if g.strip()
            ),
            sync_timeout_seconds=_env_float("SYNC_TIMEOUT_SECONDS", d.sync_timeout_seconds),
            max_wait_seconds=_env_float("MAX_WAIT_SECONDS", d.max_wait_seconds),
            ort_provider=_env_str("ORT_PROVIDER", d.ort_provider).lower(),
            ort_intra_op_threads=_env_int("ORT_INTRA_OP_THREADS", d.ort_intra_op_threads),
            cuda_devices=tuple(
                int(x) for x in _env_str("CUDA_DEVICES", "").split(",") if x.strip()
            ),
            secret_key=_env_str("SECRET_KEY", d.secret_key),
            status_cache_seconds=_env_float("STATUS_CACHE_SECONDS", d.status_cache_seconds),
            flower_url=_env_str("FLOWER_URL", d.flower_url),
            flower_basic_auth=_env_str("FLOWER_BASIC_AUTH", d.flower_basic_auth),
            log_level=_env_str("LOG_LEVEL", d.log_level).upper(),
            log_format=_env_str("LOG_FORMAT", d.log_format).lower(),
            metrics_token=_env_str("METRICS_TOKEN", d.metrics_token),
            worker_metrics_port=_env_int("WORKER_METRICS_PORT", d.worker_metrics_port),
            worker_metrics_host=_env_str("WORKER_METRICS_HOST", d.worker_metrics_host),
        )

    def with_overrides(self, **changes: object) -> Settings:
        return replace(self, **changes)  # type: ignore[arg-type]

    @property
    def model_queue(self) -> str:
        """The queue of models whose card names none."""
        return self.default_model_queue or self.jobs_queue

    @property
    def inference_queues(self) -> tuple[str, ...]:
        """The queues an inference worker serves unless WORKER_QUEUES names them: the
        default model queue, and JOBS_QUEUE for batch splits."""
        return self.worker_queues or tuple(dict.fromkeys((self.model_queue, self.jobs_queue)))

    @property
    def broker_url(self) -> str:
        """The Redis URL in kombu's spelling: unix sockets are `redis+socket://`, and
        their database is `?virtual_host=N` (kombu ignores redis-py's `?db=N`)."""
        if self.redis_url.startswith("unix://"):
            path, _, query = self.redis_url[len("unix://") :].partition("?")
            params = [
                "virtual_host=" + p[len("db=") :] if p.startswith("db=") else p
                for p in query.split("&")
                if p
            ]
            return "redis+socket://" + path + ("?" + "&".join(params) if params else "")
        return self.redis_url
