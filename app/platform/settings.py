"""Every setting, declared once and read once from the environment.

Each field of `Settings` is the environment variable of its name in capitals, with
its type, default and description (the README's table is made from them:
`python manage.py settings`). `Settings.from_env()` is the only place that reads
`os.environ` for the service; everything else receives a `Settings`. Unset
`DATABASE_URL` / `REDIS_URL` mean "use the embedded PostgreSQL / Redis under
`VAR_DIR`" (see `app.platform.embedded`), which the launcher resolves to real URLs
before the processes start.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator, Field, ValidationError
from pydantic.fields import FieldInfo
from pydantic_core import ErrorDetails
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

ROOT = Path(__file__).resolve().parents[2]  # the checkout, two above app/platform/


def _words(value: object) -> object:
    """A comma list: items stripped, empty ones dropped ("gpu, cpu," is two)."""
    if isinstance(value, str):
        return [item.strip() for item in value.split(",") if item.strip()]
    return value


def _numbers(value: object) -> object:
    """A comma list of numbers, every item kept: "5,,300" is an error, not two."""
    return value.split(",") if isinstance(value, str) else value


def _switch(value: object) -> object:
    """On only for 1, true or yes (any case); any other word is off, never an error: a
    typo leaves private networks refused, the safe side."""
    return value.lower() in ("1", "true", "yes") if isinstance(value, str) else value


def _json_object(value: object) -> str:
    """A JSON object, kept as its text (a dict would make the settings unhashable):
    given as text (an environment variable) or as a mapping."""
    parsed = json.loads(value) if isinstance(value, str) and value.strip() else value or {}
    if not isinstance(parsed, dict):
        raise ValueError("expected a JSON object")
    return json.dumps(parsed, sort_keys=True)


def _log_prefix(value: str) -> str:
    """Letters, digits and `._:-` only: no glob character an ACL pattern would read."""
    if not re.fullmatch(r"[A-Za-z0-9._:-]{1,50}", value):
        raise ValueError("use 1 to 50 letters, digits, '.', '_', ':' or '-'")
    return value


Words = BeforeValidator(_words)
Lower = AfterValidator(str.lower)
Upper = AfterValidator(str.upper)


class SettingsError(ValueError):
    """An environment variable holds a value its setting cannot take."""


class _Environment(PydanticBaseSettingsSource):
    """Each field from the variable of its name in capitals (exactly that spelling);
    unset or empty means the field's default. Values stay strings for the fields'
    validators: no JSON decoding of lists, no .env files, no secrets directory."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return os.environ.get(field_name.upper()), field_name.upper(), False

    def __call__(self) -> dict[str, Any]:
        values = {}
        for name, field in self.settings_cls.model_fields.items():
            raw, _, _ = self.get_field_value(field, name)
            if raw not in (None, ""):
                values[name] = raw
        return values


class Settings(BaseSettings):
    """Service settings: each field is the environment variable of its name in capitals."""

    model_config = SettingsConfigDict(frozen=True)

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
    file_store_options: Annotated[str, BeforeValidator(_json_object)] = Field(
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
    max_model_bytes: int = Field(
        default=2 * 1024 * 1024 * 1024,
        description="The largest model.onnx PUT /v2/repository/models/... accepts (streamed "
        "to a file in MODEL_REPOSITORY, never held in memory).",
    )
    model_state_cache_seconds: float = Field(
        default=2.0,
        description="How often a process checks the shared model states (PostgreSQL) for a "
        "load, unload or new model; such changes reach every API and worker process within "
        "this time.",
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
    job_max_attempts: int = Field(
        default=3, description="How many times a job may be claimed by a worker before it fails."
    )
    republish_after_seconds: float = Field(
        default=60.0,
        description="A queued job not picked up for this long may have lost its wake-up with "
        "the broker; the sweep wakes its model's workers again.",
    )
    job_lease_seconds: float = Field(
        default=60.0,
        description="A running job's lease; the worker renews it while the job runs, and a "
        "job whose lease ran out (its worker died) is queued again by the sweep.",
    )
    sweep_interval_seconds: float = Field(
        default=5.0, description="How often beat runs the sweeps (leases, retries, deadlines)."
    )
    retry_backoff_seconds: float = Field(
        default=2.0,
        description="Backoff before the first retry of a job that failed for a transient "
        "reason, doubled for each attempt after; each wait is drawn between 0 and it "
        "(exponential backoff with full jitter).",
    )
    retry_backoff_max_seconds: float = Field(
        default=300.0, description="The cap on RETRY_BACKOFF_SECONDS' doubling."
    )
    job_time_limit_seconds: float = Field(
        default=600.0,
        description="The longest a job may run; the worker process running it is then killed "
        "and the job's lease brings it back (and its cap ends it).",
    )
    broker_visibility_timeout_seconds: float = Field(
        default=3600.0,
        description="Redis hands an unacknowledged message to another worker after this "
        "long; keep it above JOB_TIME_LIMIT_SECONDS (a warning says so if not; leases still "
        "keep a second worker from running the job).",
    )
    broker_restore_interval_seconds: float = Field(
        default=10.0,
        description="How often workers put back messages whose visibility timeout passed "
        "(kombu's default scan is about every 100 s).",
    )
    retention_seconds: float = Field(
        default=7 * 24 * 3600.0,
        description="Inputs and outputs of finished jobs are deleted after this long (the "
        "job's metadata stays). 0 keeps them forever.",
    )
    job_event_retention_seconds: float = Field(
        default=30 * 24 * 3600.0,
        description="How long the hourly purge keeps job events (event streams, the job's "
        "history); 0 keeps them forever.",
    )
    webhook_payload_retention_seconds: float = Field(
        default=7 * 24 * 3600.0,
        description="How long the hourly purge keeps the body a finished delivery sent (it "
        "holds the job's outputs: the same default as RETENTION_SECONDS); 0 keeps it forever.",
    )
    webhook_log_retention_seconds: float = Field(
        default=30 * 24 * 3600.0,
        description="How long the hourly purge keeps finished deliveries and their attempts "
        "(a failed delivery stays while its dead letter does); 0 keeps them forever.",
    )
    dead_letter_retention_seconds: float = Field(
        default=90 * 24 * 3600.0,
        description="How long the hourly purge keeps dead letters, replayed or not; 0 keeps "
        "them forever.",
    )
    audit_retention_seconds: float = Field(
        default=365 * 24 * 3600.0,
        description="How long the hourly purge keeps audit rows (replays, purges); 0 keeps "
        "them forever.",
    )
    control_queue: str = Field(
        default="control",
        description="The Celery queue of beat's sweeps (leases, deadlines, due webhooks, "
        "schedules, purges), served by the control worker, so a backlog of jobs never delays "
        "them.",
    )
    webhooks_queue: str = Field(
        default="webhooks",
        description="The Celery queue of webhook deliveries, so slow receivers never hold "
        "inference workers.",
    )
    webhook_timeout_seconds: float = Field(
        default=15.0,
        description="The whole budget of one attempt (connect, send, answer, reading at most "
        "4 KiB of the body), wall clock: a receiver that trickles is cut off.",
    )
    webhook_retry_schedule: Annotated[tuple[float, ...], BeforeValidator(_numbers)] = Field(
        default=(0, 5, 300, 1800, 7200, 18000, 36000, 50400, 72000, 86400),
        description="Seconds before each attempt (comma list); its length is the number of "
        "attempts. Jittered by up to 10%. Default: over about a day.",
    )
    webhook_disable_after_seconds: float = Field(
        default=5 * 24 * 3600.0,
        description="A tenant's webhook URL whose deliveries have all failed for this long "
        "(from its first failure, no success since) is disabled: its pending deliveries stop "
        "and new ones are not sent, each kept as `disabled` in the log. Redelivering one of "
        "them re-enables the URL. Judged at each failed attempt. 0 never disables.",
    )
    webhook_allow_private_networks: Annotated[bool, BeforeValidator(_switch)] = Field(
        default=False,
        description="Allow webhook URLs on loopback and private ranges (development and "
        "tests) when 1, true or yes; any other value is off. Off by default: those are where "
        "SSRF does harm.",
    )
    webhook_allowed_networks: Annotated[tuple[str, ...], Words] = Field(
        default=(),
        description="Comma list of CIDRs that count as public for webhook URLs (a known "
        'internal receiver; tests use a loopback address as the "public" one).',
    )
    webhook_proxy_url: str = Field(
        default="",
        description="Send every delivery through this http:// egress proxy, which then "
        "resolves and enforces the egress policy. Unset: connect to the checked address. "
        "Proxy variables of the environment (HTTP_PROXY, .netrc) are never used.",
    )
    webhook_max_payload_bytes: int = Field(
        default=256 * 1024,
        description="A larger job is sent with its outputs replaced by a link.",
    )
    sync_timeout_seconds: float = Field(
        default=30.0,
        description="How long a sync inference call waits for its job before it answers 504 "
        "with the job's id (the job goes on); a request may ask for less.",
    )
    max_wait_seconds: float = Field(
        default=60.0, description="The cap on `Prefer: wait=N` and on a sync call's own timeout."
    )
    grpc_host: str = Field(
        default="127.0.0.1",
        description="The address the gRPC door (KServe v2 / Triton's GRPCInferenceService) "
        "binds: loopback by default, like the API; 0.0.0.0 to serve other machines.",
    )
    grpc_port: int = Field(
        default=8001, description="The gRPC door's port (Triton's default); 0 = no gRPC door."
    )
    grpc_threads: int = Field(
        default=64,
        description="Threads of the gRPC server: a unary inference call or an open stream "
        "holds one while it waits. Keep GRPC_MAX_WAITS below it, so health and metadata "
        "calls always find one.",
    )
    grpc_max_waits: int = Field(
        default=48,
        description="Unary inference calls and open streams the gRPC door's process lets "
        "wait at once (its MAX_WAITS: one process, where the API has two).",
    )
    grpc_max_waits_per_tenant: int = Field(
        default=24, description="One tenant's share of GRPC_MAX_WAITS."
    )
    grpc_max_message_bytes: int = Field(
        default=64 * 1024 * 1024,
        description="The largest gRPC message the door takes or sends (grpcio's default is "
        "4 MiB); a larger request answers RESOURCE_EXHAUSTED. Clients need the same limit "
        "for large outputs.",
    )
    grpc_stream_max_in_flight: int = Field(
        default=256,
        description="Requests of one ModelStreamInfer stream under way at once; beyond it "
        "the server stops reading the stream until answers go out (flow control, not "
        "refusal).",
    )
    grpc_stream_max_in_flight_bytes: int = Field(
        default=64 * 1024 * 1024,
        description="Bytes of a stream's requests read and not yet started (their tensors "
        "then live in PostgreSQL); beyond it the stream is read no further until they are "
        "(one request larger than this still passes, alone).",
    )
    grpc_max_streams_per_tenant: int = Field(
        default=16,
        description="ModelStreamInfer streams one tenant may hold open on the gRPC door's "
        "process (each also holds one of its GRPC_MAX_WAITS_PER_TENANT); beyond it "
        "RESOURCE_EXHAUSTED.",
    )
    grpc_metrics_port: int = Field(
        default=0,
        description="The gRPC door serves its metrics (Prometheus text) on this port; 0 = "
        "none. `make run` gives it WORKER_METRICS_PORT + 3 when that is set.",
    )
    ort_provider: Annotated[str, Lower] = Field(
        default="auto", description="`auto` (CUDA when it works, else CPU), `cuda` or `cpu`."
    )
    ort_intra_op_threads: int = Field(
        default=1, description="Threads per ONNX Runtime session (0 = ORT's default)."
    )
    cuda_devices: Annotated[tuple[int, ...], Words] = Field(
        default=(),
        description="Comma list of GPU ids; worker process i runs its CUDA sessions on device "
        "i mod len (one process per GPU). Empty: ORT's default device.",
    )
    secret_key: str = Field(
        default="",
        repr=False,
        description="Signs the status page's operator session cookie. Empty: a random key "
        "made once and kept in VAR_DIR/secret-key, which every process on this machine "
        "shares; set it (the same value) where API processes run on several machines.",
    )
    status_cache_seconds: float = Field(
        default=5.0,
        description="How long an API process reuses the status page's numbers and its "
        "answer from the workers, so reloading the page costs the database and the broker at "
        "most one round of queries (and one 1 s worker census) per period.",
    )
    flower_url: str = Field(
        default="",
        description="Where the status page links to Flower; empty: no link (`make run` sets "
        "it to its own Flower).",
    )
    flower_basic_auth: str = Field(
        default="",
        repr=False,
        description="`user:password` that `make run` starts Flower with. Empty: user `admin` "
        "and a random password kept in VAR_DIR/flower-password.",
    )
    log_level: Annotated[str, Upper] = Field(
        default="INFO", description="DEBUG, INFO, WARNING or ERROR, for every process."
    )
    log_format: Annotated[str, Lower] = Field(
        default="text",
        description="`text` (readable lines) or `json` (one JSON object a line, with job_id, "
        "tenant, model and request_id where known), for every process.",
    )
    metrics_token: str = Field(
        default="",
        description="When set, GET /metrics (and the workers' metrics endpoints) want "
        "`Authorization: Bearer <token>`: their labels name tenants and models. Unset: open.",
    )
    worker_metrics_port: int = Field(
        default=0,
        description="A Celery worker serves its processes' metrics (Prometheus text) on this "
        "port, from its main process; 0 = none. `make run` gives its three workers this port "
        "and the next two.",
    )
    worker_metrics_host: str = Field(
        default="127.0.0.1",
        description="The address a worker's metrics endpoint binds (0.0.0.0 for a scraper on "
        "another machine; `make run`: HOST).",
    )

    streams_redis_url: str = Field(
        default="",
        description="The Redis whose streams the stream door reads and writes (tenants' "
        "producers and readers connect to it, each with an ACL user of its own); empty = "
        "REDIS_URL.",
    )
    streams_prefix: Annotated[str, AfterValidator(_log_prefix)] = Field(
        default="streams",
        description="Every log of the stream door is named `<prefix>:<tenant>:<name>`, so an "
        "ACL rule `~<prefix>:<tenant>:*` gives a tenant its own logs only.",
    )
    streams_group: str = Field(
        default="inference-jobs",
        description="The consumer group the stream door reads each input log with.",
    )
    streams_read_count: int = Field(
        default=256,
        description="Entries the stream consumer reads from a log at once; each read becomes "
        "one transaction and one multi-row INSERT of jobs.",
    )
    streams_claim_idle_seconds: float = Field(
        default=30.0,
        description="An input entry delivered this long ago and still unacknowledged (its "
        "consumer died) is claimed by a live consumer (XAUTOCLAIM).",
    )
    streams_refresh_seconds: float = Field(
        default=5.0,
        description="How often a stream consumer reads the bindings again: a new, changed, "
        "paused or deleted binding takes effect within this time.",
    )
    streams_dedupe_seconds: float = Field(
        default=7 * 24 * 3600.0,
        description="How long the mark of a result appended to an output log is kept, so a "
        "consumer that died between appending and recording it does not append it again "
        "when it restarts within this time.",
    )
    streams_metrics_port: int = Field(
        default=0,
        description="The stream consumer serves its own metrics (Prometheus text: submits, "
        "entries, results) on this port; 0 = none. Lag is in the API's /metrics.",
    )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Keyword arguments only: `Settings(...)` never reads the environment (tests
        build theirs so, whatever the shell holds); `from_env` does."""
        return (init_settings,)

    @classmethod
    def from_env(cls) -> Settings:
        """The service's settings; a variable that holds a wrong value stops the start,
        named with what was expected."""
        values = _Environment(cls)()
        if "var_dir" in values:  # DATA_DIR's default follows VAR_DIR
            values.setdefault("data_dir", str(Path(values["var_dir"]) / "data"))
        try:
            return cls(**values)
        except ValidationError as error:
            problems = "\n".join(_problem(e) for e in error.errors())
            raise SettingsError(f"invalid settings in the environment:\n{problems}") from None

    def with_overrides(self, **changes: Any) -> Settings:
        """A copy with these fields changed, checked as any construction is."""
        return type(self)(**{**dict(self), **changes})

    @property
    def logs_url(self) -> str:
        """The Redis of the stream door's logs: STREAMS_REDIS_URL, else REDIS_URL."""
        return self.streams_redis_url or self.redis_url

    @property
    def store_url(self) -> str:
        """FILE_STORE_URL, else the directory VAR_DIR/files."""
        return self.file_store_url or str(self.var_dir / "files")

    @property
    def store_options(self) -> dict[str, Any]:
        """FILE_STORE_OPTIONS as the mapping fsspec takes."""
        options: dict[str, Any] = json.loads(self.file_store_options)
        return options

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


def _problem(error: ErrorDetails) -> str:
    """One line per wrong value: the variable, what it holds, what was expected."""
    field, *item = error["loc"]
    name = str(field).upper()
    where = f" (item {int(item[0]) + 1}: {error['input']!r})" if item else ""
    return f"  {name}={os.environ.get(name)!r}{where}: {error['msg']}"
