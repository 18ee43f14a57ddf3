"""The textbook's Celery app and its one task: load the row, mark it running and
commit, run ONNX Runtime, write the outputs and commit again."""

from __future__ import annotations

import os
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
from celery import Celery
from celery.signals import worker_process_init

from bench.peers.textbook.db import Job, Session, engine

QUEUE = "bench-textbook"
MODELS = Path(os.environ.get("MODEL_REPOSITORY", "models"))

celery = Celery("textbook", broker=os.environ.get("TEXTBOOK_BROKER_URL", "memory://"))
celery.conf.update(
    task_acks_late=True,
    worker_prefetch_multiplier=1,
    task_serializer="json",
    accept_content=["json"],
    task_ignore_result=True,
    task_default_queue=QUEUE,
    broker_connection_retry_on_startup=True,
)

_sessions: dict[str, ort.InferenceSession] = {}


def _session(model: str) -> ort.InferenceSession:
    """One session per model per worker process, one intra-op thread."""
    if model not in _sessions:
        versions = sorted((MODELS / model).glob("*/model.onnx"), key=lambda p: int(p.parent.name))
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        _sessions[model] = ort.InferenceSession(
            str(versions[-1]), options, providers=["CPUExecutionProvider"]
        )
    return _sessions[model]


@worker_process_init.connect
def _after_fork(**_: Any) -> None:
    """Connections and sessions are made in each worker child, never inherited."""
    engine.dispose(close=False)
    _sessions.clear()
    for model_dir in MODELS.iterdir():
        if any(model_dir.glob("*/model.onnx")):
            _session(model_dir.name)


def _infer(model: str, inputs: dict[str, Any]) -> dict[str, Any]:
    session = _session(model)
    feeds = {name: np.asarray(value, dtype=np.float32) for name, value in inputs.items()}
    names = [o.name for o in session.get_outputs()]
    return {n: v.tolist() for n, v in zip(names, session.run(names, feeds), strict=True)}


@celery.task(name="textbook.run_job")
def run_job(job_id: str) -> None:
    with Session() as db:
        job = db.get(Job, uuid.UUID(job_id))
        if job is None:
            return
        job.status, job.started_at = "running", datetime.now(UTC)
        db.commit()
        try:
            job.outputs, job.status = _infer(job.model, job.inputs), "succeeded"
        except Exception as exc:  # the job records its failure; the task itself succeeds
            job.error, job.status = str(exc), "failed"
        job.finished_at = datetime.now(UTC)
        db.commit()
