"""The four workloads, run against any `HttpContender`.

(a) async digits: N single-row jobs from C closed-loop clients; jobs/s from the
    first submit to the last job's own `finished_at`.
(b) compute-bound: the same with a heavy model and many rows per job; rows/s.
(c) burst: clients submit as fast as they can for T seconds; what was accepted,
    refused, lost, and how long the backlog took to drain.
(d) open loop: Poisson arrivals at half the rate (a) sustained; POST latency.
(e) after idle: single jobs, each after the contender sat idle; how long the
    first job waits before it starts (the cost of waking a worker).
(f) sync: single-row KServe v2 infer calls from C closed-loop clients, each
    answered with its outputs (contenders with a sync door only); calls/s and
    call latency.
(g) batch: one .npy of N digits rows as one batch, results read back as .npy
    (contenders with a batch door only); rows/s against raw ORT, peak RSS
    (see bench/batch.py).
(h) gRPC unary: the calls of (f) as KServe v2 `ModelInfer` on the gRPC door, one
    at a time from each of C clients (contenders with a gRPC door only).
(i) gRPC stream: the same calls on C `ModelStreamInfer` streams, each keeping
    STREAM_WINDOW requests in flight; calls/s to the last answer.
(j) stream door: 2N one-row entries appended to a stream binding's input log by a
    producer, timed to the last result in its output log (contenders with a
    stream door only; see bench/stream.py).
(k) bulk submit: the jobs of (a) sent as `POST /jobs/bulk` bodies of 100 from a
    few clients, timed to the last job's `finished_at` (see bench/bulk.py).
(l) sync, inline: the calls of (f) on `digits-inline`, the same model with
    `"execution": "inline"` on its card (it runs in the API process, each call
    still leaving its job record).
(m) embeddings: async minilm jobs of 32 sentences each from a few clients;
    sentences/s against raw ORT running the same pipeline (tokenizer, graph,
    pooling) in one process (contenders that serve minilm only).
(n) soak: every door at once at half of (a)'s rate for 20 minutes, a worker
    child killed every 2 minutes; lost jobs, RSS per process, p99 per window
    (the service only, and only when asked: see bench/soak.py).

Every workload waits for the contender to drain before the next starts, and
samples CPU per role around itself.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from bench import load
from bench.completion import PostgresJobs, wait_until_done
from bench.contenders.base import HttpContender
from bench.cpu import per_job_ms
from bench.stats import rounded
from bench.stream import stream_jobs

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Plan:
    jobs: int  # (a)
    clients: tuple[int, ...]  # (a), one row each
    heavy_model: str | None  # (b), None when the model is not built
    heavy_rows: int
    heavy_jobs: int
    heavy_clients: int
    burst_s: float  # (c)
    burst_clients: int
    open_s: float  # (d)
    open_clients: int
    drain_timeout_s: float
    repeat: int
    raw_ort_s: float  # seconds per raw ORT measurement
    batch_rows: int = 0  # (g), 0: skipped
    bulk_jobs: int = 0  # (k), 0: skipped
    embed_jobs: int = 0  # (m), 0: skipped
    embed_clients: int = 4
    workloads: tuple[str, ...] = ()  # the workloads to run (letters); empty: all
    soak_s: float = 1200.0  # (n)
    soak_kill_s: float = 120.0  # (n): a worker child killed, and a window, this often
    soak_rate: float | None = None  # (n): jobs/s over every door; None: half of (a)'s

    def runs(self, workload: str) -> bool:
        if workload in ASKED_ONLY:
            return workload in self.workloads
        return not self.workloads or workload in self.workloads


# Workloads that run only when `--workload` names them: the soak takes 20 minutes.
ASKED_ONLY = ("n",)


@dataclass(frozen=True)
class Bodies:
    digits: Sequence[bytes]
    heavy: Sequence[bytes]
    sync: Sequence[bytes]  # KServe v2 infer requests, one digits row each
    stream: list[tuple[bytes, bytes]] = field(default_factory=list)  # (j): (id, inputs)
    grpc: Sequence[bytes] = ()  # (h), (i): the rows as serialized gRPC ModelInferRequests
    bulk: Sequence[bytes] = ()  # (k): POST /jobs/bulk bodies of one-row digits jobs
    embed: Sequence[bytes] = ()  # (m): minilm jobs of EMBED_ROWS sentences


def _measure_closed(
    c: HttpContender, bodies: Sequence[bytes], jobs: int, clients: int, timeout: float
) -> dict[str, Any]:
    assert c.endpoint is not None and c.store is not None
    before = c.store.progress(time.time())
    cpu0 = c.meter.sample()
    since = time.time() - 1
    result = load.closed_loop(c.endpoint, bodies, jobs, clients)
    progress, drained = wait_until_done(c.store, before.terminal + result.accepted, since, timeout)
    cpu1 = c.meter.sample()
    span = (progress.last_finished or result.last_answer) - result.first_send
    return {
        "jobs": result.accepted,
        "clients": clients,
        "jobs_per_s": rounded(result.accepted / span if span > 0 else None),
        "seconds": rounded(span, 2),
        # the same span from the first row's created_at (None where not recorded)
        "seconds_from_first_created": rounded(
            progress.last_finished - progress.first_created
            if progress.first_created and progress.last_finished
            else None,
            2,
        ),
        **result.summary(),
        "failed": progress.failed - before.failed,
        "max_queued_s": rounded(progress.max_queued_s, 3),
        "drained": drained,
        "cpu_ms_per_job": per_job_ms(cpu0, cpu1, result.accepted),
    }


def async_jobs(c: HttpContender, bodies: Bodies, plan: Plan, clients: int) -> dict[str, Any]:
    row = _measure_closed(c, bodies.digits, plan.jobs, clients, plan.drain_timeout_s)
    return {"workload": "a", "variant": f"{clients} clients", **row}


def compute_bound(c: HttpContender, bodies: Bodies, plan: Plan) -> dict[str, Any]:
    variant = f"{plan.heavy_model} x{plan.heavy_rows} rows"
    return _rows_of_jobs(c, "b", variant, bodies.heavy, plan.heavy_jobs, plan.heavy_clients,
                         plan.heavy_rows, plan.drain_timeout_s)  # fmt: skip


def embeddings(c: HttpContender, bodies: Bodies, plan: Plan) -> dict[str, Any]:
    from bench.peers.raw_ort import EMBED_MODEL, EMBED_ROWS

    variant = f"{EMBED_MODEL} x{EMBED_ROWS} sentences, {plan.embed_clients} clients"
    return _rows_of_jobs(c, "m", variant, bodies.embed, plan.embed_jobs, plan.embed_clients,
                         EMBED_ROWS, plan.drain_timeout_s)  # fmt: skip


def _rows_of_jobs(
    c: HttpContender, workload: str, variant: str, bodies: Sequence[bytes], jobs: int,
    clients: int, rows_per_job: int, timeout: float,
) -> dict[str, Any]:  # fmt: skip
    """A closed loop of jobs of many rows each; their rows/s besides jobs/s."""
    row = _measure_closed(c, bodies, jobs, clients, timeout)
    per_s = row["jobs_per_s"]
    rows_per_s = rounded(per_s * rows_per_job if per_s else None)
    return {"workload": workload, "variant": variant, **row, "rows_per_s": rows_per_s}


def burst(c: HttpContender, bodies: Bodies, plan: Plan) -> dict[str, Any]:
    assert c.endpoint is not None and c.store is not None
    before = c.store.progress(time.time())
    cpu0 = c.meter.sample()
    since = time.time() - 1
    result = load.burst(c.endpoint, bodies.digits, plan.burst_s, plan.burst_clients)
    burst_end = result.last_answer
    progress, drained = wait_until_done(
        c.store, before.terminal + result.accepted, since, plan.drain_timeout_s
    )
    cpu1 = c.meter.sample()
    finished = c.store.terminal_among(result.ids)
    last = progress.last_finished or burst_end
    return {
        "workload": "c",
        "variant": f"{plan.burst_s:g}s x {plan.burst_clients} clients",
        **result.summary(),
        "submit_per_s": rounded(result.sent / max(burst_end - result.first_send, 1e-9)),
        "jobs_per_s": rounded(result.accepted / max(last - result.first_send, 1e-9)),
        "lost": result.accepted - finished,
        "drain_s": rounded(max(0.0, last - burst_end), 2),
        "drained": drained,
        "failed": progress.failed - before.failed,
        "max_queued_s": rounded(progress.max_queued_s, 3),
        "cpu_ms_per_job": per_job_ms(cpu0, cpu1, result.accepted),
    }


def open_loop(c: HttpContender, bodies: Bodies, plan: Plan, rate: float) -> dict[str, Any]:
    assert c.endpoint is not None and c.store is not None
    before = c.store.progress(time.time())
    cpu0 = c.meter.sample()
    since = time.time() - 1
    schedule = load.Schedule.poisson(rate, plan.open_s)
    result = load.open_loop(c.endpoint, bodies.digits, schedule, plan.open_clients)
    progress, drained = wait_until_done(
        c.store, before.terminal + result.accepted, since, plan.drain_timeout_s
    )
    cpu1 = c.meter.sample()
    return {
        "workload": "d",
        "variant": f"{rate:.0f}/s for {plan.open_s:g}s",
        "rate_per_s": rounded(rate),
        **result.summary(),
        "failed": progress.failed - before.failed,
        "max_queued_s": rounded(progress.max_queued_s, 3),
        "drained": drained,
        "cpu_ms_per_job": per_job_ms(cpu0, cpu1, result.accepted),
    }


IDLE_PROBES, IDLE_S = 5, 1.5


def after_idle(c: HttpContender, bodies: Bodies, plan: Plan) -> dict[str, Any] | None:
    """One job at a time, each after IDLE_S of quiet (workers have stopped
    looking); its own started_at - created_at is the wake-up's cost."""
    assert c.endpoint is not None
    if not isinstance(c.store, PostgresJobs):
        return None  # BentoML's store keeps whole seconds
    queued, total, ids = [], [], []
    for i in range(IDLE_PROBES):
        time.sleep(IDLE_S)
        before = c.store.progress(time.time())
        result = load.closed_loop(c.endpoint, bodies.digits[i:], 1, 1)
        wait_until_done(c.store, before.terminal + result.accepted, time.time() - 1, 30)
        ids += result.ids
    for _, q, t in c.store.timings(ids):
        queued.append(q)
        total.append(t)
    return {
        "workload": "e",
        "variant": f"{IDLE_PROBES} jobs, each after {IDLE_S:g} s idle",
        "jobs": len(ids),
        "max_queued_s": rounded(max(queued, default=None), 4),
        "finished_ms": {
            "p50": rounded(statistics.median(total) * 1000 if total else None, 2),
            "max": rounded(max(total) * 1000 if total else None, 2),
        },
    }


def sync_calls(
    c: HttpContender, bodies: Bodies, plan: Plan, inline: bool = False
) -> dict[str, Any] | None:
    """(f), or (l) on the contender's inline model."""
    endpoint = c.inline_endpoint if inline else c.sync_endpoint
    if endpoint is None:
        return None
    clients = plan.clients[0]
    if inline:  # its session is made by the first calls of each API process
        load.closed_loop(endpoint, bodies.sync, 8 * clients, clients)
    cpu0 = c.meter.sample()
    result = load.closed_loop(endpoint, bodies.sync, plan.jobs, clients)
    cpu1 = c.meter.sample()
    span = result.last_answer - result.first_send
    # One client alone: the latency a lone caller sees, nothing queued before it.
    alone = load.closed_loop(endpoint, bodies.sync, max(ONE_CLIENT_CALLS, plan.jobs // 4), 1)
    return {
        "workload": "l" if inline else "f",
        "variant": f"{clients} clients, {endpoint.path}",
        "jobs": result.accepted,
        "jobs_per_s": rounded(result.accepted / span if span > 0 else None),
        **result.summary(),
        "one_client_ms": alone.summary()["post_ms"],
        "cpu_ms_per_job": per_job_ms(cpu0, cpu1, result.accepted),
    }


ONE_CLIENT_CALLS = 500


STREAM_WINDOW = 16  # requests in flight on each gRPC stream in (i)


def grpc_calls(c: HttpContender, bodies: Bodies, plan: Plan, streaming: bool) -> dict[str, Any]:
    """(h) or (i): the sync calls of (f) over the gRPC door; each a job, as in (f)."""
    from bench import grpc_load

    assert c.grpc_endpoint is not None
    clients = plan.clients[0]
    cpu0 = c.meter.sample()
    if streaming:
        result = grpc_load.stream(c.grpc_endpoint, bodies.grpc, plan.jobs, clients, STREAM_WINDOW)
        variant = f"{clients} streams x {STREAM_WINDOW} in flight, ModelStreamInfer"
    else:
        result = grpc_load.unary(c.grpc_endpoint, bodies.grpc, plan.jobs, clients)
        variant = f"{clients} clients, ModelInfer"
    cpu1 = c.meter.sample()
    span = result.last_answer - result.first_send
    return {
        "workload": "i" if streaming else "h",
        "variant": variant,
        "jobs": result.accepted,
        "jobs_per_s": rounded(result.accepted / span if span > 0 else None),
        **result.summary(),
        "cpu_ms_per_job": per_job_ms(cpu0, cpu1, result.accepted),
    }


Record = Callable[[dict[str, Any]], dict[str, Any]]


def _recorder(c: HttpContender, repeat: int, rows: list[dict[str, Any]]) -> Record:
    def record(row: dict[str, Any]) -> dict[str, Any]:
        row = {"contender": c.name, "repeat": repeat, **row}
        logger.info("%s", _brief(row))
        rows.append(row)
        return row

    return record


def run_all(
    c: HttpContender, bodies: Bodies, plan: Plan, repeat: int, rows: list[dict[str, Any]]
) -> None:
    """Every workload of the plan the contender has a door for, each row appended to
    `rows`: (a) for each client count, (b) if the heavy model is built, (c), then
    (d) at half of (a)'s rate with the fewest clients, and so on."""
    assert c.endpoint is not None and c.store is not None
    record = _recorder(c, repeat, rows)
    # Each repeat starts the contender afresh; its first requests pay for imports,
    # pools and sessions, so they are not measured.
    warm = load.closed_loop(c.endpoint, bodies.digits, 8 * plan.clients[0], plan.clients[0])
    wait_until_done(c.store, 0, time.time(), plan.drain_timeout_s)
    logger.info("%s warmed up with %d jobs", c.name, warm.accepted)
    first_a: dict[str, Any] | None = None  # (a) with the fewest clients
    for clients in plan.clients if plan.runs("a") else ():
        row = record(async_jobs(c, bodies, plan, clients))
        first_a = first_a or row
    first_rate = first_a["jobs_per_s"] if first_a else None
    if plan.heavy_model and c.runs_heavy_model and plan.runs("b"):
        record(compute_bound(c, bodies, plan))
    if plan.embed_jobs and c.runs_embedding_model and bodies.embed and plan.runs("m"):
        record(embeddings(c, bodies, plan))
    if plan.runs("c"):
        record(burst(c, bodies, plan))
    if first_rate and plan.runs("d"):
        record(open_loop(c, bodies, plan, first_rate / 2))
    idle = after_idle(c, bodies, plan) if plan.runs("e") else None
    if idle:
        record(idle)
    sync = sync_calls(c, bodies, plan) if plan.runs("f") else None
    if sync:
        record(sync)
    inline = sync_calls(c, bodies, plan, inline=True) if plan.runs("l") else None
    if inline:
        record(inline)
    if c.grpc_endpoint is not None and bodies.grpc:
        if plan.runs("h"):
            record(grpc_calls(c, bodies, plan, streaming=False))
        if plan.runs("i"):
            record(grpc_calls(c, bodies, plan, streaming=True))
    stream = stream_jobs(c, bodies.stream, plan.drain_timeout_s) if plan.runs("j") else None
    if stream:
        record(stream)
    if plan.bulk_jobs and plan.runs("k"):
        from bench.bulk import bulk_jobs

        bulk = bulk_jobs(c, list(bodies.bulk), plan.bulk_jobs, plan.drain_timeout_s)
        if bulk:
            record(bulk)
    if plan.batch_rows and plan.runs("g"):
        from bench.batch import batch_rows
        from bench.peers.raw_ort import model_file

        digits = model_file(c.ctx.model_repository, "digits")
        assert digits is not None
        batch = batch_rows(c, plan.batch_rows, digits, plan.drain_timeout_s * 4)
        if batch:
            record(batch)
    if plan.runs("p") and getattr(c, "serves_pipelines", False):
        from bench.pipelines import pipelines

        for row in pipelines(c, plan, _measure_closed):
            record(row)
    if plan.runs("o") and repeat == 0:
        from bench.added import added_model

        added = added_model(c)
        if added:
            record(added)
    if c.soaks and plan.runs("n") and repeat == 0:  # once, however many repeats
        from bench.soak import soak

        record(soak(c, bodies, plan, first_a))


def run_sync(
    c: HttpContender, bodies: Bodies, plan: Plan, repeat: int, rows: list[dict[str, Any]]
) -> None:
    """(f) alone, for a contender that is only a sync endpoint: warmed up with
    unmeasured calls (sessions are made on first use), then measured as the
    service's (f) is."""
    assert c.sync_endpoint is not None
    warm = load.closed_loop(c.sync_endpoint, bodies.sync, 8 * plan.clients[0], plan.clients[0])
    logger.info("%s warmed up with %d calls", c.name, warm.accepted)
    sync = sync_calls(c, bodies, plan)
    if sync:
        _recorder(c, repeat, rows)(sync)


def _brief(row: dict[str, Any]) -> str:
    keys = ("jobs_per_s", "rows_per_s", "post_ms", "lost", "drain_s", "refused", "errors",
            "missing", "rss_growth_mb", "p99_drift_worst")  # fmt: skip
    shown = {k: row[k] for k in keys if k in row}
    return f"{row['contender']} ({row['workload']}) {row['variant']}: {shown}"
