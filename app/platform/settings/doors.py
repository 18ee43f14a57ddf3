"""The settings of the doors and the processes: gRPC, ONNX Runtime, the status page,
Flower, logs, metrics and the stream door."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, Field

from app.platform.settings.jobs import JobSettings
from app.platform.settings.values import (
    Lower,
    Upper,
    Words,
    log_prefix,
)


class DoorSettings(JobSettings):
    """The settings of the doors and the processes: gRPC, ONNX Runtime, the status page,"""

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
    max_loaded_models: int = Field(
        default=0,
        ge=0,
        description="ONNX Runtime sessions a process keeps at most (0: no bound); loading "
        "one more closes the least recently used, unless a model's card sets "
        "`keep_alive_seconds` and it was used within them. Sessions of versions unloaded or "
        "removed are closed whatever this says.",
    )
    generation_slots: int = Field(
        default=16,
        description="Sequences a worker process decodes together for a generative model (its "
        "continuous batch); more wait in the queue. Each slot's key/value cache grows with its "
        "tokens (46 KB a token for smollm2).",
    )
    generation_threads: int = Field(
        default=0,
        description="Threads of a generative model's ONNX Runtime session (0 = ORT's default, "
        "every core): one decode loop per worker machine and model uses them all.",
    )
    generation_prefill_tokens: int = Field(
        default=256,
        description="Prompt tokens a decode step prefills at most; a longer prompt goes in "
        "pieces over several steps, so the others' next tokens wait at most one piece.",
    )
    generation_prefill_rows: int = Field(
        default=0,
        ge=0,
        description="Fresh prompts one prefill call takes together, right-padded to the "
        "longest (within GENERATION_PREFILL_TOKENS). 0: all the slots under the CUDA provider, "
        "where a call of several rows costs little more than one; 1 on the CPU, where it "
        "saves nothing and every first token waits for the whole call.",
    )
    generation_prefix_cache_mb: int = Field(
        default=256,
        ge=0,
        description="Memory a decode loop keeps the key/value cache rows of recent prompts in "
        "(per tenant, least recently used dropped; 0 = none): a prompt that starts with a kept "
        "one's tokens (a shared system prompt or instruction) prefills only the rest.",
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
    streams_prefix: Annotated[str, AfterValidator(log_prefix)] = Field(
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
