"""(g) batch: N digits rows uploaded as one .npy, run as one batch, results read
back as .npy; rows/s from `POST /batches` to the last byte of the results,
against raw ONNX Runtime on the same rows in this process. The peak RSS of
every process of the contender (API, workers, the other doors, beat, Flower,
the launcher; not the shared PostgreSQL and Redis) is sampled throughout: each
must stay under 500 MB whatever N is (files and results are streamed, never held).
"""

from __future__ import annotations

import http.client
import io
import json
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import requests

from bench.contenders.base import HttpContender
from bench.cpu import rss_mb
from bench.stats import rounded

CHUNK_ROWS = 4096  # raw ORT is called on this many rows at a time (the reference of (g))


def rows(n: int) -> np.ndarray:
    from sklearn.datasets import load_digits

    digits = np.asarray(load_digits().data, dtype=np.float32)
    return np.resize(digits, (n, 64))


class PeakRss:
    """The largest RSS any one process of each role reached, sampled every 0.1 s."""

    def __init__(self, contender: HttpContender) -> None:
        self.meter = contender.meter
        self.peak: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        # The list of processes is taken again each second (a worker child may be
        # replaced); reading their RSS ten times a second is cheap, listing is not.
        listed_at, processes = -1.0, []
        while not self._stop.wait(0.1):
            if time.monotonic() - listed_at >= 1.0:
                listed_at = time.monotonic()
                processes = self.meter.own_processes()
            for proc, role in processes:
                if (mb := rss_mb(proc)) is not None:
                    self.peak[role] = max(self.peak.get(role, 0.0), mb)


def raw_ort(model_file: Path, pixels: np.ndarray, threads: int) -> float:
    """Rows/s of ORT on these rows in chunks of CHUNK_ROWS, `threads` intra-op threads."""
    from bench.peers.raw_ort import session as raw_session

    session = raw_session(model_file, threads)
    session.run(None, {"pixels": pixels[:CHUNK_ROWS]})
    started = time.perf_counter()
    for start in range(0, len(pixels), CHUNK_ROWS):
        session.run(None, {"pixels": pixels[start : start + CHUNK_ROWS]})
    return len(pixels) / (time.perf_counter() - started)


POLL_S = 0.02  # a coarser poll would add up to its period to a run of a few tenths of a second


def _poll_until_finished(
    port: int, path: str, auth: dict[str, str], timeout: float
) -> dict[str, Any]:
    """GET the batch every POLL_S over one keep-alive connection (about 0.2 ms of
    client CPU each) until it is no longer queued or running, or `timeout` passed."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    deadline = time.monotonic() + timeout
    try:
        while True:
            conn.request("GET", path, headers=auth)
            batch: dict[str, Any] = json.loads(conn.getresponse().read())
            if batch["status"] not in ("queued", "running") or time.monotonic() >= deadline:
                return batch
            time.sleep(POLL_S)
    finally:
        conn.close()


def batch_rows(c: HttpContender, n: int, model_file: Path, timeout: float) -> dict[str, Any] | None:
    if c.batch_port is None or c.endpoint is None:
        return None
    base = f"http://127.0.0.1:{c.batch_port}"
    auth = c.endpoint.headers
    pixels = rows(n)
    buffer = io.BytesIO()
    np.save(buffer, pixels)
    upload_started = time.perf_counter()
    uploaded = requests.post(
        f"{base}/files?filename=rows.npy", data=buffer.getvalue(), headers=auth, timeout=600
    )
    uploaded.raise_for_status()
    upload_s = time.perf_counter() - upload_started
    cpu0 = c.meter.sample()
    with PeakRss(c) as rss:
        started = time.perf_counter()
        body = {"model": "digits", "file_id": uploaded.json()["id"]}
        answer = requests.post(f"{base}/batches", json=body, headers=auth, timeout=60)
        answer.raise_for_status()
        batch_id = answer.json()["id"]
        batch_url = f"{base}/batches/{batch_id}"
        batch = _poll_until_finished(c.batch_port, f"/batches/{batch_id}", auth, timeout)
        finished = time.perf_counter()
        received = 0
        with requests.get(f"{batch_url}/results", headers={**auth, "Accept": "application/x-npy"},
                          stream=True, timeout=600) as results:  # fmt: skip
            results.raise_for_status()
            for part in results.iter_content(1 << 20):
                received += len(part)
        seconds = time.perf_counter() - started
    cpu1 = c.meter.sample()
    raw = {threads: raw_ort(model_file, pixels, threads) for threads in (1, 2)}
    per_s = n / seconds
    return {
        "workload": "g",
        "variant": f"digits, {n} rows from one .npy",
        "rows": n,
        "status": batch["status"],
        "rows_done": batch.get("rows_done"),
        "upload_s": rounded(upload_s, 2),
        "seconds": rounded(seconds, 2),
        "run_s": rounded(finished - started, 2),
        "results_bytes": received,
        "rows_per_s": rounded(per_s),
        "raw_ort_rows_per_s": {str(t): rounded(v) for t, v in raw.items()},
        "share_of_raw_ort": rounded(per_s / max(raw.values()), 3),
        "peak_rss_mb": {role: rounded(mb) for role, mb in sorted(rss.peak.items())},
        "cpu_ms_per_1000_rows": {
            role: rounded((cpu1.get(role, 0.0) - cpu0.get(role, 0.0)) * 1e6 / n, 2)
            for role in sorted(cpu1)
        },
    }
