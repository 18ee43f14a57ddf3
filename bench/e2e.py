"""End-to-end throughput of the async door against a running service.

C client threads submit N single-row digits jobs over HTTP, then every job is
followed to its terminal state. Figures come from the client (POST latency)
and from the job rows (created_at -> finished_at), so they include the broker,
the worker and both database writes.
"""

from __future__ import annotations

import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Any

import requests
from sklearn.datasets import load_digits


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run(base: str, api_key: str, jobs: int, clients: int) -> dict[str, Any]:
    rows = load_digits().data.tolist()
    headers = {"Authorization": f"Bearer {api_key}"}
    local = threading.local()

    def session() -> requests.Session:
        if not hasattr(local, "s"):
            local.s = requests.Session()
            local.s.headers.update(headers)
        s: requests.Session = local.s
        return s

    def submit(i: int) -> tuple[str, float]:
        body = {"model": "digits", "inputs": {"pixels": [rows[i % len(rows)]]}}
        started = time.perf_counter()
        response = session().post(f"{base}/jobs", json=body, timeout=30)
        elapsed = time.perf_counter() - started
        response.raise_for_status()
        return response.json()["id"], elapsed

    wall_start = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        submitted = list(pool.map(submit, range(jobs)))
    submit_wall = time.perf_counter() - wall_start

    def follow(job_id: str) -> dict[str, Any]:
        while True:
            job: dict[str, Any] = session().get(f"{base}/jobs/{job_id}", timeout=30).json()
            if job["status"] not in ("queued", "running"):
                return job
            time.sleep(0.05)

    with ThreadPoolExecutor(clients) as pool:
        done = list(pool.map(follow, [job_id for job_id, _ in submitted]))
    created = [datetime.fromisoformat(j["created_at"]) for j in done]
    finished = [datetime.fromisoformat(j["finished_at"]) for j in done if j["finished_at"]]
    span = (max(finished) - min(created)).total_seconds()
    post_ms = [elapsed * 1000 for _, elapsed in submitted]
    e2e_ms = [
        (datetime.fromisoformat(j["finished_at"]) - datetime.fromisoformat(j["created_at"]))
        .total_seconds() * 1000
        for j in done if j["finished_at"]
    ]  # fmt: skip
    return {
        "jobs": jobs,
        "clients": clients,
        "succeeded": sum(j["status"] == "succeeded" for j in done),
        "jobs_per_s": round(jobs / span, 1),
        "submit_per_s": round(jobs / submit_wall, 1),
        "post_ms": {"p50": round(statistics.median(post_ms), 1),
                    "p99": round(_percentile(post_ms, 0.99), 1)},
        "submit_to_finish_ms": {"p50": round(statistics.median(e2e_ms), 1),
                                "p99": round(_percentile(e2e_ms, 0.99), 1)},
    }  # fmt: skip
