"""Raw ONNX Runtime in one process: the ceiling no job service can pass.

Rows per second for each intra-op thread count and batch size, on the model
file the service serves. The best of these is what "compute-bound jobs reach
85% of raw ORT" is measured against. Its sessions ask for the providers the
service's workers ask for (ORT_PROVIDER: CUDA where it starts, with `auto` or
`cuda`), so `ORT_PROVIDER=cuda make bench` compares the two on the GPU.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

THREADS = (1, 2)
BATCHES = (1, 8, 32, 128, 512)
MIN_CALLS = 3


def model_file(repository: Path, name: str) -> Path | None:
    """The newest version's model.onnx, or None if the model is not built."""
    versions = [p for p in (repository / name).glob("*/model.onnx") if p.parent.name.isdigit()]
    return max(versions, key=lambda p: int(p.parent.name)) if versions else None


def session(path: Path, threads: int) -> ort.InferenceSession:
    """A session of `threads` intra-op threads on the providers the service's
    workers would use; `.get_providers()[0]` says which one it got."""
    from app.platform.settings import Settings
    from app.runtime.sessions import SessionPool

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    wanted = SessionPool(Settings().ort_provider).wanted_providers()
    ort.set_default_logger_severity(4)  # CUDA listed but unable to start: CPU, silently
    try:
        return ort.InferenceSession(str(path), options, providers=wanted)
    finally:
        ort.set_default_logger_severity(2)


def rows_per_second(
    session: ort.InferenceSession, rows: np.ndarray, batch: int, seconds: float
) -> float:
    """Run `batch`-row calls for at least `seconds` and `MIN_CALLS` calls (after one
    warm-up call): a slow model's large batches take more than `seconds` each."""
    feed_name = session.get_inputs()[0].name
    reps = -(-batch // len(rows))
    data = np.ascontiguousarray(np.tile(rows, (reps, 1))[:batch], dtype=np.float32)
    session.run(None, {feed_name: data})
    calls, start = 0, time.perf_counter()
    while True:
        session.run(None, {feed_name: data})
        calls += 1
        elapsed = time.perf_counter() - start
        if elapsed >= seconds and calls >= MIN_CALLS:
            return calls * batch / elapsed


def measure(
    path: Path,
    rows: np.ndarray,
    seconds: float,
    threads: Sequence[int] = THREADS,
    batches: Sequence[int] = BATCHES,
) -> list[dict[str, Any]]:
    """One row per (threads, batch): rows/s and CPU seconds per 1000 rows."""
    results = []
    for n in threads:
        made = session(path, n)
        for batch in batches:
            cpu = time.process_time()
            wall = time.perf_counter()
            rate = rows_per_second(made, rows, batch, seconds)
            cpu_s, wall_s = time.process_time() - cpu, time.perf_counter() - wall
            results.append(
                {
                    "threads": n,
                    "batch": batch,
                    "rows_per_s": round(rate, 1),
                    "cpu_ms_per_1000_rows": round(1e6 * cpu_s / (rate * wall_s), 3),
                    "provider": made.get_providers()[0],
                }
            )
    return results
