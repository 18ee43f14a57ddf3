"""(n) soak: the service for a long while (20 minutes by default) at half the
rate it sustained, every door at once, a worker child SIGKILLed at every kill
interval (2 minutes by default): what a quick benchmark cannot show.

- Rate: half of (a)'s jobs/s from the same repeat, else from a run of (a) made
  here first (`--soak-rate` names one instead), shared among the doors as MIX
  says: async `POST /jobs`, sync `POST /v2/models/digits/infer`, gRPC
  `ModelInfer` and the stream door, each an open loop of Poisson arrivals with
  latency from the scheduled send time (no coordinated omission).
- Kills: one prefork child of the inference worker, chosen at random, in the
  middle of each interval (as the fault suite kills them); its jobs come back
  when their lease runs out.
- At the end, from the database: every job created during the soak must be final
  and every accepted async job too; every stream entry must have its result
  (0 lost). The RSS of every process of the service after warm-up and at the
  end of each window (flat: no growth of RSS_GROWTH_MB or more). The p50 / p99
  of each door per window (stable: the last window's p99 within P99_FACTOR of
  the first's); for async jobs also created-to-finished from their rows.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

import psutil

from bench import load, windows
from bench.completion import PostgresJobs, wait_until_done
from bench.contenders.base import HttpContender
from bench.cpu import RoleMeter, per_job_ms, rss_mb
from bench.stats import rounded
from bench.workloads import Bodies, Plan, async_jobs

logger = logging.getLogger(__name__)

# Each door's share of the rate (of those the contender has).
MIX = {"async": 0.4, "sync": 0.3, "grpc": 0.2, "stream": 0.1}
# Threads per HTTP or gRPC door: far above rate x latency at half load, so a call
# held by a killed worker child (a sync call's 504 comes after 30 s) delays no other.
DOOR_CLIENTS = 16
# After the load: the jobs of the last kill come back once their lease
# (JOB_LEASE_SECONDS, 60 s by default) runs out and the sweep (every 5 s) sees it.
DRAIN_S = 300.0
POOL = "worker children (largest)"  # replaced by kills: compared as one


def worker_children(listed: list[tuple[psutil.Process, str]]) -> list[psutil.Process]:
    """The prefork pool processes of the service's Celery inference worker: of the
    role `worker`, with a parent of that role (the control worker runs threads)."""
    workers = {proc.pid for proc, role in listed if role == "worker"}
    children = []
    for proc, role in listed:
        try:
            if role == "worker" and proc.ppid() in workers:
                children.append(proc)
        except psutil.Error:
            continue
    return children


def rss_snapshot(meter: RoleMeter) -> dict[str, float]:
    """MB of every process of the service by `role pid`; the worker children, which
    the kills replace, as one: the largest of them."""
    listed = meter.own_processes()
    pool = {proc.pid for proc in worker_children(listed)}
    out: dict[str, float] = {}
    for proc, role in listed:
        if (mb := rss_mb(proc)) is None:
            continue
        if proc.pid in pool:
            out[POOL] = max(out.get(POOL, 0.0), mb)
        else:
            out[f"{role} {proc.pid}"] = mb
    return out


class Events(threading.Thread):
    """Kills a worker child at each kill time and takes an RSS snapshot at each
    window's end, on the soak's clock (perf_counter from `start`)."""

    def __init__(self, meter: RoleMeter, start: float, seconds: float, plan: Plan) -> None:
        super().__init__(daemon=True)
        self.meter, self.start_at = meter, start
        todo = [(t, "kill") for t in windows.kill_times(seconds, plan.soak_kill_s)]
        count = windows.window_count(seconds, plan.soak_kill_s)
        ends = [min(seconds, (i + 1) * plan.soak_kill_s) for i in range(count)]
        self.todo = sorted(todo + [(t, "rss") for t in ends])
        self.kills: list[dict[str, Any]] = []
        self.rss: list[dict[str, float]] = []  # one snapshot per window end
        self.stopped = threading.Event()
        self.rng = random.Random(0)

    def run(self) -> None:
        for at, what in self.todo:
            if self.stopped.wait(max(0.0, self.start_at + at - time.perf_counter())):
                return
            if what == "rss":
                self.rss.append(rss_snapshot(self.meter))
                continue
            children = worker_children(self.meter.own_processes())
            if not children:
                self.kills.append({"at_s": rounded(at), "pid": None})
                continue
            victim = self.rng.choice(children)
            try:
                victim.kill()  # SIGKILL
                self.kills.append({"at_s": rounded(at), "pid": victim.pid})
            except psutil.Error as exc:
                self.kills.append({"at_s": rounded(at), "pid": victim.pid, "error": str(exc)})
            logger.info("soak: killed worker child %s at %.0f s", victim.pid, at)


def _doors(
    c: HttpContender, bodies: Bodies, rate: float, seconds: float, start: float
) -> dict[str, tuple[float, Callable[[], load.LoadResult]]]:
    """Each door the contender has: its rate and the open loop that drives it."""
    from bench import grpc_load
    from bench.stream import paced_entries

    assert c.endpoint is not None
    have: dict[str, Callable[[load.Schedule], load.LoadResult]] = {
        "async": partial(load.open_loop, c.endpoint, bodies.digits, clients=DOOR_CLIENTS)
    }
    if c.sync_endpoint is not None:
        have["sync"] = partial(load.open_loop, c.sync_endpoint, bodies.sync, clients=DOOR_CLIENTS)
    if c.grpc_endpoint is not None and bodies.grpc:
        have["grpc"] = partial(grpc_load.open_unary, c.grpc_endpoint, bodies.grpc,
                               clients=DOOR_CLIENTS)  # fmt: skip
    if c.stream is not None and bodies.stream:
        inputs = [fields for _, fields in bodies.stream]
        have["stream"] = partial(paced_entries, c.stream, inputs, timeout=DRAIN_S)
    share = sum(MIX[name] for name in have)
    doors: dict[str, tuple[float, Callable[[], load.LoadResult]]] = {}
    for seed, (name, drive) in enumerate(have.items()):
        door_rate = rate * MIX[name] / share
        schedule = load.Schedule.poisson(door_rate, seconds, seed=seed, start=start)
        doors[name] = (door_rate, partial(drive, schedule))
    return doors


def _warm(c: HttpContender, bodies: Bodies) -> None:
    """Unmeasured calls on each door first: sessions, pools and channels are made
    by the first calls, and must not count as growth."""
    from bench import grpc_load
    from bench.stream import stream_jobs

    calls = 8 * DOOR_CLIENTS
    if c.sync_endpoint is not None:
        load.closed_loop(c.sync_endpoint, bodies.sync, calls, DOOR_CLIENTS)
    if c.grpc_endpoint is not None and bodies.grpc:
        grpc_load.unary(c.grpc_endpoint, bodies.grpc, calls, DOOR_CLIENTS)
    if c.stream is not None:
        stream_jobs(c, bodies.stream[:calls], 60)


def soak(
    c: HttpContender, bodies: Bodies, plan: Plan, measured: dict[str, Any] | None
) -> dict[str, Any]:
    """The soak; `measured` is (a)'s row from the same repeat, if it ran."""
    assert c.endpoint is not None and isinstance(c.store, PostgresJobs)
    store = c.store
    capacity_from = "(a) in this repeat"
    if not plan.soak_rate and not (measured and measured.get("jobs_per_s")):
        measured = async_jobs(c, bodies, plan, plan.clients[0])
        capacity_from = f"(a) run first: {plan.jobs} jobs, {plan.clients[0]} clients"
    capacity = (measured or {}).get("jobs_per_s")
    rate = plan.soak_rate or (capacity or 0.0) / 2
    if rate <= 0:
        raise RuntimeError("soak: no rate (capacity not measured)")
    _warm(c, bodies)
    wait_until_done(store, 0, time.time(), DRAIN_S)
    seconds, window_s = plan.soak_s, plan.soak_kill_s
    count = windows.window_count(seconds, window_s)
    rss_start = rss_snapshot(c.meter)
    cpu0, cpu0_at = c.meter.sample(), time.perf_counter()
    start = time.perf_counter() + 1.0  # time for every door's threads to start
    epoch_start = start + (time.time() - time.perf_counter())
    doors = _doors(c, bodies, rate, seconds, start)
    logger.info("soak: %.0f jobs/s for %.0f s over %s", rate, seconds, ", ".join(doors))
    events = Events(c.meter, start, seconds, plan)
    events.start()
    with ThreadPoolExecutor(len(doors)) as pool:
        futures = {name: pool.submit(drive) for name, (_, drive) in doors.items()}
        results = {name: future.result() for name, future in futures.items()}
    events.join(timeout=window_s + 60)
    events.stopped.set()
    cpu1, cpu1_at = c.meter.sample(), time.perf_counter()
    progress, drained = wait_until_done(store, 0, epoch_start - 1, DRAIN_S)
    rss_end = events.rss[-1] if events.rss else rss_snapshot(c.meter)

    per_window = {
        name: windows.windows(r.sent_at, r.latencies_ms, r.unanswered_at, start, window_s, count)
        for name, r in results.items()
    }
    async_ids = results["async"].ids
    timings = store.timings(async_ids)
    per_window["async, created to finished"] = windows.windows(
        [created for created, _, _ in timings], [1000 * took for _, _, took in timings], [],
        epoch_start, window_s, count,
    )  # fmt: skip
    statuses = store.statuses(epoch_start - 0.5)  # the warm-up's jobs ended before
    not_final = sum(n for s, n in statuses.items() if s not in PostgresJobs.TERMINAL)
    async_not_final = len(async_ids) - store.terminal_among(async_ids)
    stream = results.get("stream")
    stream_unanswered = stream.sent - stream.errors - stream.accepted if stream else 0
    rss = windows.rss_rows(rss_start, rss_end)
    drifts = {name: windows.p99_drift(rows) for name, rows in per_window.items()}
    # jobs: answered HTTP and gRPC requests, and every entry appended to the stream
    accepted = sum(r.accepted for name, r in results.items() if name != "stream")
    accepted += stream.sent if stream else 0
    kill_min = window_s / 60
    return {
        "workload": "n",
        "variant": f"{seconds / 60:g} min, mixed doors, a worker child killed every "
        f"{kill_min:g} min",
        "seconds": rounded(seconds),
        "window_s": rounded(window_s),
        "rate_per_s": rounded(rate),
        "capacity_jobs_per_s": rounded(capacity) if not plan.soak_rate else None,
        "capacity_from": capacity_from if not plan.soak_rate else "--soak-rate given",
        # what a job of (a) cost, against the mix's own cost per job below
        "capacity_cpu_ms_per_job": (measured or {}).get("cpu_ms_per_job", {}).get("total"),
        "jobs": accepted,
        "jobs_per_s": rounded(accepted / seconds),
        "post_ms": results["async"].summary()["post_ms"],
        "doors": {
            name: {"rate_per_s": rounded(doors[name][0]), **r.summary()}
            for name, r in results.items()
        },
        "windows": per_window,
        "p99_drift": drifts,
        "p99_drift_worst": windows.worst_drift(drifts),
        "kills": events.kills,
        "statuses": statuses,
        "failed": statuses.get("failed", 0),
        "not_final": not_final,
        "async_not_final": async_not_final,
        "stream_unanswered": stream_unanswered,
        "lost": windows.lost(async_not_final, stream_unanswered, not_final),
        "drained": drained,
        "drain_s": rounded(max(0.0, (progress.last_finished or 0) - (epoch_start + seconds)), 1),
        "rss_mb": rss,
        "rss_by_window_mb": events.rss,
        "rss_growth_mb": windows.largest_growth(rss),
        "cpu_ms_per_job": per_job_ms(cpu0, cpu1, accepted),
        "cpu_busy": busy_share(cpu0, cpu1, cpu1_at - cpu0_at),
    }


def busy_share(before: dict[str, float], after: dict[str, float], seconds: float) -> float | None:
    """The share of the machine's cores that every role (the client and the shared
    servers too) kept busy: how near saturation the soak's rate really was."""
    cores = psutil.cpu_count() or 1
    used = sum(max(0.0, after[r] - before.get(r, 0.0)) for r in after)
    return rounded(used / (seconds * cores), 3) if seconds > 0 else None
