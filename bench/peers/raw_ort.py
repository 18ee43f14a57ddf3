"""Raw ONNX Runtime in one process: the ceiling no job service can pass.

Rows per second for each intra-op thread count and batch size, on the model
file the service serves. The best of these is what "compute-bound jobs reach
85% of raw ORT" is measured against.
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
        options = ort.SessionOptions()
        options.intra_op_num_threads = n
        options.inter_op_num_threads = 1
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        for batch in batches:
            cpu = time.process_time()
            wall = time.perf_counter()
            rate = rows_per_second(session, rows, batch, seconds)
            cpu_s, wall_s = time.process_time() - cpu, time.perf_counter() - wall
            results.append(
                {
                    "threads": n,
                    "batch": batch,
                    "rows_per_s": round(rate, 1),
                    "cpu_ms_per_1000_rows": round(1e6 * cpu_s / (rate * wall_s), 3),
                }
            )
    return results
