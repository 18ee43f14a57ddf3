"""(k) bulk submit: one-row digits jobs sent as `POST /jobs/bulk` bodies of
BULK_SIZE jobs each from a few closed-loop clients, timed from the first submit
to the last job's own `finished_at`, as (a) is: what a producer gains by sending
its jobs in hundreds instead of one request each.

The route may be missing (a contender without it, or a service older than it):
one probe with an empty list comes first, and a 404 or 405 makes the row say
so instead of failing the run.
"""

from __future__ import annotations

import http.client
import time
from typing import Any

from bench import load
from bench.completion import wait_until_done
from bench.contenders.base import HttpContender
from bench.cpu import per_job_ms
from bench.stats import rounded

BULK_SIZE = 100
BULK_CLIENTS = 4  # x BULK_SIZE: 400 jobs in flight, the queue never runs dry
MISSING = (404, 405)


def probe(endpoint: load.Endpoint) -> int:
    """The status of a bulk of no jobs (nothing is submitted)."""
    conn = http.client.HTTPConnection(endpoint.host, endpoint.port, timeout=30)
    try:
        headers = {"Content-Type": "application/json", **endpoint.headers}
        conn.request("POST", endpoint.path, b'{"jobs":[]}', headers)
        answer = conn.getresponse()
        answer.read()
        return answer.status
    finally:
        conn.close()


def bulk_jobs(
    c: HttpContender, bodies: list[bytes], jobs: int, timeout: float
) -> dict[str, Any] | None:
    """The row of (k), None where the contender has no bulk endpoint at all."""
    endpoint = c.bulk_endpoint
    if endpoint is None or c.store is None or not bodies:
        return None
    variant = f"{BULK_CLIENTS} clients x bulks of {BULK_SIZE}, {endpoint.path}"
    status = probe(endpoint)
    if status in MISSING:
        return {"workload": "k", "variant": variant, "jobs_per_s": None,
                "missing": "route missing", "answered": status}  # fmt: skip
    calls = max(1, jobs // BULK_SIZE)
    before = c.store.progress(time.time())
    cpu0 = c.meter.sample()
    since = time.time() - 1
    result = load.closed_loop(endpoint, bodies, calls, BULK_CLIENTS)
    progress, drained = wait_until_done(c.store, before.terminal + result.accepted, since, timeout)
    cpu1 = c.meter.sample()
    span = (progress.last_finished or result.last_answer) - result.first_send
    return {
        "workload": "k",
        "variant": variant,
        "jobs": result.accepted,
        "jobs_per_s": rounded(result.accepted / span if span > 0 else None),
        "submit_jobs_per_s": rounded(
            result.accepted / max(result.last_answer - result.first_send, 1e-9)
        ),
        "seconds": rounded(span, 2),
        **result.summary(),  # post_ms: per bulk of BULK_SIZE jobs
        "failed": progress.failed - before.failed,
        "max_queued_s": rounded(progress.max_queued_s, 3),
        "drained": drained,
        "cpu_ms_per_job": per_job_ms(cpu0, cpu1, result.accepted),
    }
