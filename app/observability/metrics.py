"""Prometheus metrics: what each process counts, and how a scrape reads them.

Counters and histograms are counted where things happen, in whichever process
that is: submits in the API, finished jobs and ONNX Runtime calls in the
inference worker's pool children, webhook attempts in the webhook worker,
sweep actions in the control worker. In multi-process mode
(PROMETHEUS_MULTIPROC_DIR, see app.observability.metrics_dir) each process writes to mmap
files of its own, and a scrape adds up every process of its tree: the API's
`/metrics` its API processes', a worker's endpoint (WORKER_METRICS_PORT) its
pool children's. Scrape both: no number is in both.

The queue gauges are read from PostgreSQL when the API is scraped
(`QueueCollector`), so they are right wherever the workers run; only the API
serves them, so they are never counted twice.
"""

from __future__ import annotations

import hmac
import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector
from sqlalchemy import Engine, Row, TextClause, text
from sqlalchemy.exc import SQLAlchemyError

from app.observability import metrics_dir

logger = logging.getLogger(__name__)

CONTENT_TYPE = CONTENT_TYPE_LATEST
_SECONDS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
_WAIT = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)
_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096)

# API
JOBS_SUBMITTED = Counter(
    "inference_jobs_submitted",
    "Jobs accepted by the jobs, sync and stream doors",
    ["model", "tenant"],
)
# gRPC door
GRPC_REQUESTS = Counter(
    "inference_grpc_requests",
    "gRPC calls by method and status code (a stream counts once, when it ends)",
    ["method", "code"],
)
GRPC_SECONDS = Histogram(
    "inference_grpc_seconds", "Time from a gRPC call's start to its status", ["method"],
    buckets=_WAIT,
)  # fmt: skip
GRPC_STREAM_REQUESTS = Counter(
    "inference_grpc_stream_requests",
    "Requests on ModelStreamInfer streams, by the code of their answer",
    ["code"],
)
# Inference worker
JOBS_FINISHED = Counter(
    "inference_jobs_finished",
    "Jobs whose outcome a worker wrote (succeeded, failed, cancelled while running)",
    ["model", "tenant", "status"],
)
DEAD_LETTERS = Counter(
    "inference_dead_letters",
    "Dead letters written: failed jobs (by workers), undeliverable webhooks",
    ["model", "kind"],
)
JOB_QUEUED_SECONDS = Histogram(
    "inference_job_queued_seconds", "started_at - created_at of finished jobs", ["model"],
    buckets=_WAIT,
)  # fmt: skip
JOB_RUNNING_SECONDS = Histogram(
    "inference_job_running_seconds", "finished_at - started_at of finished jobs", ["model"],
    buckets=_SECONDS,
)  # fmt: skip
CLAIM_JOBS = Histogram(
    "inference_claim_jobs", "Jobs a worker claimed and ran together", ["model"], buckets=_SIZES
)
ORT_SECONDS = Histogram(
    "inference_ort_call_seconds",
    "One inference call (ONNX Runtime with the card's pipeline) on a micro-batch",
    ["model"], buckets=_SECONDS,
)  # fmt: skip
ORT_ROWS = Histogram(
    "inference_ort_call_rows", "Rows in one inference call (micro-batch size)", ["model"],
    buckets=_SIZES,
)  # fmt: skip
# Decode loops (a generative model's jobs; the waiting ones are in inference_queue_depth)
GENERATION_TOKENS = Counter(
    "inference_generation_tokens",
    "Tokens the decode loops took: prompt (prefilled) and completion (generated); rate() "
    "of it is tokens/s", ["model", "kind"],
)  # fmt: skip
GENERATION_FIRST_TOKEN_SECONDS = Histogram(
    "inference_generation_first_token_seconds",
    "Time to first token: from a generation's submit to its first token", ["model"],
    buckets=_WAIT,
)  # fmt: skip
GENERATION_SLOTS = Gauge(
    "inference_generation_slots", "Decode slots of running loops, by state: busy, free, "
    "and paused (generations waiting for a slot back)", ["model", "state"],
    multiprocess_mode="livesum",
)  # fmt: skip
GENERATION_PAUSES = Counter(
    "inference_generation_pauses",
    "Generations paused to give their slot to a tenant waiting without one",
    ["model"],
)
GENERATION_PREFIX_LOOKUPS = Counter(
    "inference_generation_prefix_lookups",
    "Prompts looked up in the decode loops' prefix caches, by result: hit (the rows of a "
    "kept prefix copied) or miss", ["model", "result"],
)  # fmt: skip
GENERATION_PREFIX_TOKENS_SAVED = Counter(
    "inference_generation_prefix_tokens_saved",
    "Prompt tokens not prefilled because a kept prefix held their rows", ["model"],
)  # fmt: skip
# Webhook worker
WEBHOOK_ATTEMPTS = Counter(
    "inference_webhook_attempts",
    "Webhook attempts by the delivery's state after it: delivered, retry, failed, disabled",
    ["outcome"],
)
WEBHOOK_FAILURES = Counter(
    "inference_webhook_failures",
    "Webhook attempts that did not deliver, by reason (http_4xx, http_5xx, network, ...)",
    ["reason"],
)
# Control worker
SWEEPS = Counter(
    "inference_sweeps", "Periodic sweeps run (beat's tasks), whether or not they found work",
    ["task"],
)  # fmt: skip
SWEEPS_FENCED = Counter(
    "inference_sweeps_fenced",
    "Sweeps refused by the control lease's fence: sent in a term that ended before they ran",
    ["task"],
)  # fmt: skip
SWEEP_JOBS = Counter(
    "inference_sweep_jobs",
    "Jobs the sweep moved: requeued_after_lost_worker, expired, woken_for",
    ["action"],
)
# Stream consumer (its own endpoint: STREAMS_METRICS_PORT; lag is in the API's gauges)
STREAM_ENTRIES = Counter(
    "inference_stream_entries",
    "Input entries the stream door handled: accepted (a new job), redelivered (its job "
    "existed), dead_lettered, deferred (a full queue or quota: read again later)",
    ["tenant", "outcome"],
)
STREAM_RESULTS = Counter(
    "inference_stream_results", "Output entries appended by the stream door, by the job's status",
    ["status"],
)  # fmt: skip


def registry() -> CollectorRegistry:
    """This process tree's metrics: every process's files in multi-process mode,
    else this process's own."""
    if metrics_dir.current() is None:
        return REGISTRY
    collected = CollectorRegistry(auto_describe=False)
    MultiProcessCollector(collected)
    return collected


def exposition(*extra: Collector) -> bytes:
    """Prometheus text of this process tree, then of `extra` collectors."""
    text_ = generate_latest(registry())
    if extra:
        more = CollectorRegistry(auto_describe=False)
        for collector in extra:
            more.register(collector)
        text_ += generate_latest(more)
    return text_


def authorized(header: str | None, token: str) -> bool:
    """No token set: open. Else `Authorization: Bearer <token>`, compared in
    constant time."""
    if not token:
        return True
    scheme, _, given = (header or "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(given.strip(), token)


# Each model with queued jobs from a skip scan of ix_jobs_claim (one probe per model),
# then its count and oldest from an index-only scan of its own entries.
_QUEUED = text(
    """
    WITH RECURSIVE models AS (
        (SELECT model FROM jobs WHERE status = 'queued' ORDER BY model LIMIT 1)
        UNION ALL
        SELECT (SELECT j.model FROM jobs j WHERE j.status = 'queued' AND j.model > m.model
                ORDER BY j.model LIMIT 1)
        FROM models m WHERE m.model IS NOT NULL
    )
    SELECT m.model, q.jobs, extract(epoch FROM now() - q.oldest) AS oldest_s
    FROM models m CROSS JOIN LATERAL (
        SELECT count(*) AS jobs, min(created_at) AS oldest FROM jobs
        WHERE jobs.model = m.model AND jobs.status = 'queued'
    ) AS q
    WHERE m.model IS NOT NULL
    """
)
_RUNNING = text("SELECT model, count(*) AS jobs FROM jobs WHERE status = 'running' GROUP BY model")


def read_at_scrape(
    engine: Engine, what: str, *statements: TextClause, **params: Any
) -> list[Sequence[Row[Any]]] | None:
    """Each statement's rows, read for a scrape: under a 5 s statement timeout, JIT
    off (it would compile the plan on every scrape: more than it runs), nothing
    kept; None (and a warning naming `what`) when PostgreSQL did not answer."""
    try:
        with engine.connect() as conn:  # closed unfinished: the SET LOCALs end with it
            conn.execute(text("SET LOCAL statement_timeout = 5000; SET LOCAL jit = off"))
            rows = [conn.execute(statement, params).all() for statement in statements]
    except SQLAlchemyError as exc:
        logger.warning("metrics: %s not read: %s", what, type(exc).__name__)
        return None
    return rows


class QueueCollector(Collector):
    """Queue depth, oldest queued job and running jobs per model, read from
    PostgreSQL at scrape time: right whichever process or machine the workers are
    on. Both statements read partial indexes only (ix_jobs_claim, index-only: about
    13 ms for 60,000 queued jobs; ix_jobs_lease for running jobs), so they cost
    what is queued and running, which MAX_QUEUED_PER_MODEL bounds; a statement
    timeout bounds them anyway. Models of the repository with nothing queued read 0."""

    def __init__(self, engine: Engine, models: Callable[[], Iterable[str]]) -> None:
        self.engine, self.models = engine, models

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily(
            "inference_database_up", "1 if the queue gauges could be read from PostgreSQL"
        )
        read = read_at_scrape(self.engine, "queue gauges", _QUEUED, _RUNNING)
        if read is None:
            up.add_metric([], 0)
            yield up
            return
        queued, running = read
        up.add_metric([], 1)
        yield up
        known = set(self.models())
        depth = GaugeMetricFamily(
            "inference_queue_depth", "Queued jobs per model (due or waiting)", labels=["model"]
        )
        oldest = GaugeMetricFamily(
            "inference_queue_oldest_age_seconds",
            "Age of the oldest queued job per model (0: none queued)", labels=["model"],
        )  # fmt: skip
        busy = GaugeMetricFamily(
            "inference_jobs_running", "Running jobs per model", labels=["model"]
        )
        seen = {row.model: row for row in queued}
        for model in sorted(known | set(seen)):
            row = seen.get(model)
            depth.add_metric([model], row.jobs if row else 0)
            oldest.add_metric([model], max(0.0, float(row.oldest_s)) if row else 0.0)
        counts = {row.model: row.jobs for row in running}
        for model in sorted(known | set(counts)):
            busy.add_metric([model], counts.get(model, 0))
        yield from (depth, oldest, busy)


class _Handler(BaseHTTPRequestHandler):
    token = ""

    def do_GET(self) -> None:
        if self.path.split("?")[0] not in ("/", "/metrics"):
            self._answer(404, b"not found: try /metrics\n", "text/plain")
        elif not authorized(self.headers.get("Authorization"), self.token):
            self._answer(401, b"send Authorization: Bearer <METRICS_TOKEN>\n", "text/plain")
        else:
            self._answer(200, exposition(), CONTENT_TYPE)

    def _answer(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        """Scrapes are not worth a line each."""


def serve(host: str, port: int, token: str) -> ThreadingHTTPServer:
    """Serve this process tree's metrics on a daemon thread (a worker's main
    process: its pool children's files included)."""
    handler = type("MetricsHandler", (_Handler,), {"token": token})
    server = ThreadingHTTPServer((host, port), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
    return server
