"""(p) Pipelines: what the machinery costs, and the map's micro-batching.

- digit-photo (code -> digits -> code, each step recorded) against digit-photo-code
  (the same three steps as one model.py), 16 clients on the async door: jobs/s
  and CPU per job summed over every process; the difference is the pipeline's
  recording and scheduling.
- ingest of a 200-chunk document (ingest-chunks' code, MiniLM mapped over the
  chunks) against raw ONNX Runtime embedding the same chunks in one batch
  (MiniLM's own tokenizer, graph and pooling, `pipeline.run`), at one thread and
  one client (a worker child's one thread) and at two (both cores).
"""

from __future__ import annotations

import base64
import io
import json
import time
from typing import Any

import numpy as np

from bench.stats import rounded

PHOTO_JOBS = 2000
INGEST_CHUNKS = 200
INGEST_JOBS = 8


def _pngs(count: int = 64) -> list[bytes]:
    from PIL import Image
    from sklearn.datasets import load_digits

    digits, out = load_digits(), []
    for row in digits.data[:count]:
        grey = (row.reshape(8, 8) / 16.0 * 255.0).astype(np.uint8)
        image = Image.fromarray(grey, mode="L").resize((32, 32), Image.Resampling.NEAREST)
        buffer = io.BytesIO()
        image.save(buffer, format="PNG")
        out.append(buffer.getvalue())
    return out


def document(chunks: int = INGEST_CHUNKS, words: int = 40) -> str:
    vocabulary = ["river", "stone", "light", "quiet", "north", "window", "garden",
                  "paper", "morning", "letter", "signal", "market", "winter"]  # fmt: skip
    return " ".join(f"{vocabulary[(i * 7) % len(vocabulary)]}{i % 13}"
                    for i in range(chunks * words))  # fmt: skip


def _bodies(model: str, inputs: list[dict[str, Any]]) -> list[bytes]:
    return [json.dumps({"model": model, "inputs": i}).encode() for i in inputs]


def raw_embeddings(repository: Any, text: str, threads: int, seconds: float = 3.0) -> float:
    """Chunks/s of raw ONNX Runtime (MiniLM's tokenizer, graph, pooling) on the
    document's chunks in one batch."""
    from app.platform.settings import Settings
    from app.repository.registry import ModelRepository
    from app.runtime import pipeline
    from app.runtime.sessions import SessionPool
    from app.runtime.tensors import parse_inputs

    repo = ModelRepository(repository)
    chunker = repo.resolve("ingest-chunks")
    from app.runtime.code import load_module

    texts, _ = load_module(chunker.code_path, "bench-chunks").chunks(text)
    card = repo.resolve("minilm")
    pool = SessionPool(Settings().ort_provider, threads)
    inputs = parse_inputs(card, {"text": texts})
    pipeline.run(pool, card, inputs)
    calls, started = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - started) < seconds or calls < 2:
        pipeline.run(pool, card, inputs)
        calls += 1
    return calls * len(texts) / elapsed


def pipelines(c: Any, plan: Any, measure: Any) -> list[dict[str, Any]]:
    """(p)'s rows for a contender with the bundled pipelines (the service)."""
    pngs = [{"image": [{"b64": base64.b64encode(p).decode()}]} for p in _pngs()]
    jobs = max(200, plan.jobs)
    rows = []
    for variant, model in (("digit-photo pipeline", "digit-photo"),
                           ("digit-photo-code, one model.py", "digit-photo-code")):  # fmt: skip
        bodies = _bodies(model, pngs)
        measure(c, bodies, 64, 16, plan.drain_timeout_s)  # warm: sessions, code, Pillow
        row = measure(c, bodies, jobs, 16, plan.drain_timeout_s)
        rows.append({"workload": "p", "variant": f"{variant}, 16 clients", **row})
    text = document()
    bodies = _bodies("ingest", [{"document": [text]}])
    measure(c, bodies, 2, 1, plan.drain_timeout_s)
    for clients, threads in ((1, 1), (2, 2)):
        row = measure(c, bodies, INGEST_JOBS, clients, plan.drain_timeout_s * 4)
        seconds = row["seconds"]  # (jobs_per_s is rounded to a tenth: too coarse here)
        raw = raw_embeddings(c.ctx.model_repository, text, threads)
        chunks_per_s = row["jobs"] * INGEST_CHUNKS / seconds if seconds else None
        rows.append({
            "workload": "p", "variant": f"ingest {INGEST_CHUNKS} chunks, {clients} client(s)",
            **row, "rows_per_s": rounded(chunks_per_s),
            "raw_rows_per_s": rounded(raw), "raw_threads": threads,
        })  # fmt: skip
    return rows
