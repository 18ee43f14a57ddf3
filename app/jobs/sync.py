"""The sync door's pieces: run one request now and answer with its outputs.

By default the request becomes an ordinary job, submitted like any other (with
the API's coalesced inserts), so the workers that own the GPU run it, in the
same micro-batches as async jobs of its model; the caller waits on the event
bus until the job finishes or its time is up. The job outlives a caller that
gave up: DeadlinePassed names it, and its result can be read at /jobs/<id>.

A card with `"execution": "inline"` (small CPU models) runs in the calling
process instead, through the same inference function, and leaves no job row.
The data plane (`app.dataplane`) composes these.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

import numpy as np

from app.errors import DeadlinePassed, DomainError, InferenceFailed
from app.models.cards import ModelCard
from app.platform.tables import Job
from app.runtime import engine
from app.runtime.sessions import SessionPool
from app.runtime.tensors import from_json, unpack

INLINE = "inline"


@dataclass(frozen=True)
class Answer:
    card: ModelCard
    outputs: dict[str, np.ndarray]
    job_id: uuid.UUID | None  # None when the model ran inline


def runs_inline(card: ModelCard) -> bool:
    return card.extra.get("execution") == INLINE


def run_inline(pool: SessionPool, card: ModelCard, arrays: dict[str, np.ndarray]) -> Answer:
    """Run checked inputs in this process; InferenceFailed when the model cannot."""
    try:
        pool.get(card)
    except Exception as exc:  # its file is missing, corrupt or unlike its card
        detail = f"model {card.ref} cannot serve: {type(exc).__name__}: {exc}"
        raise failed("model_invalid", detail, None) from None
    [result] = engine.infer(pool, card, [arrays])
    if isinstance(result, Exception):
        non_finite = isinstance(result, engine.NonFiniteOutput)
        code = "non_finite_output" if non_finite else "inference_error"
        raise failed(code, f"{type(result).__name__}: {result}", None)
    return Answer(card, result, None)


def answer(card: ModelCard, job: Job, timeout_s: float) -> Answer:
    """The finished job's outputs; DeadlinePassed while it is unfinished,
    InferenceFailed when it ended without outputs."""
    if job.status == "succeeded":
        return Answer(card, _outputs(card, job), job.id)
    raise _outcome_error(job, timeout_s)


def _outputs(card: ModelCard, job: Job) -> dict[str, np.ndarray]:
    """The finished job's outputs as arrays: unpacked as stored, or from JSON for
    rows written before outputs were packed."""
    if job.output_data is not None:
        arrays = unpack(job.output_data)
        return {spec.name: arrays[spec.name] for spec in card.outputs}
    return from_json(card.outputs, job.outputs or {})


def _outcome_error(job: Job, timeout_s: float) -> DomainError:
    if job.status in ("queued", "running"):
        return DeadlinePassed(
            f"job {job.id} did not finish within {timeout_s:g} s; it is {job.status} and "
            f"goes on: GET /jobs/{job.id} (with ?wait=30) for its result",
            job_id=str(job.id),
            job_status=job.status,
        )
    return ended_without_outputs(job.id, job.status, job.error_code, job.error_message)


def ended_without_outputs(
    job_id: uuid.UUID, status: str, error_code: str | None, error_message: str | None
) -> InferenceFailed:
    """The error of a job that ended `status` without outputs (what a sync call
    answers, and what the stream door's output entry says)."""
    detail = f"job {job_id} ended {status}"
    if error_code:
        detail += f" ({error_code}: {error_message})"
    extra: dict[str, Any] = {"error_code": error_code or status, "job_id": str(job_id),
                             "job_status": status}  # fmt: skip
    return InferenceFailed(detail, **extra)


def failed(code: str, detail: str, job: Job | None) -> InferenceFailed:
    extra: dict[str, Any] = {"error_code": code}
    if job is not None:
        extra |= {"job_id": str(job.id), "job_status": job.status}
    return InferenceFailed(detail, **extra)
