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
# (m): the embedding model, the sentences a job of it carries, and the calls its
# raw measurement makes (the service's own tokenizer, graph and pooling in one
# process: what a worker runs, without a job around it).
EMBED_MODEL = "minilm"
EMBED_ROWS = 32
EMBED_BATCHES = (8, 32, 128)
SENTENCES = (
    "A man is eating food.",
    "A man is riding a white horse on an enclosed ground.",
    "The new movie is awesome and the audience loved every minute of it.",
    "Two children are playing in the sand near the water on a sunny afternoon.",
    "The quarterly report shows revenue grew while costs stayed flat.",
    "Please restart the worker after the model file has been replaced.",
    "A woman is slicing tomatoes in a small kitchen.",
    "The train to the airport leaves every fifteen minutes from platform two.",
)


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


def measure_pipeline(
    repository: Path,
    model: str,
    seconds: float,
    threads: Sequence[int] = THREADS,
    batches: Sequence[int] = EMBED_BATCHES,
) -> list[dict[str, Any]]:
    """`measure` for a model whose card has a pipeline (minilm: tokenizer, graph,
    pooling), run as the service's workers run it, on SENTENCES."""
    from app.platform.settings import Settings
    from app.repository.registry import ModelRepository
    from app.runtime import pipeline
    from app.runtime.sessions import SessionPool
    from app.runtime.tensors import parse_inputs

    card = ModelRepository(repository).resolve(model)
    results = []
    for n in threads:
        pool = SessionPool(Settings().ort_provider, n)
        for batch in batches:
            texts = [SENTENCES[i % len(SENTENCES)] for i in range(batch)]
            inputs = parse_inputs(card, {card.inputs[0].name: texts})
            pipeline.run(pool, card, inputs)  # the session, made on first use
            cpu, wall, calls = time.process_time(), time.perf_counter(), 0
            while (elapsed := time.perf_counter() - wall) < seconds or calls < MIN_CALLS:
                pipeline.run(pool, card, inputs)
                calls += 1
            rate = calls * batch / elapsed
            results.append(
                {
                    "threads": n,
                    "batch": batch,
                    "rows_per_s": round(rate, 1),
                    "cpu_ms_per_1000_rows": round(
                        1e6 * (time.process_time() - cpu) / (rate * elapsed), 3
                    ),
                    "provider": pool.providers()[card.ref],
                }
            )
    return results


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
