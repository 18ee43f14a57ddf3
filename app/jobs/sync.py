"""The sync door: run one request now and answer with its outputs.

By default the request becomes an ordinary job, submitted like any other (with
the API's coalesced inserts), so the workers that own the GPU run it, in the
same micro-batches as async jobs of its model; the caller waits on the event
bus until the job finishes or its time is up. The job outlives a caller that
gave up: a 504 names it, and its result can be read at /jobs/<id>.

A card with `"execution": "inline"` (small CPU models) runs in the calling
process instead, through the same inference function, and leaves no job row.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from sqlalchemy.orm import Session

from app.errors import DomainError
from app.jobs import quotas, service
from app.jobs.events import EventBus
from app.jobs.inserts import JobInserter
from app.models.registry import ModelCard, ModelRepository
from app.platform.tables import Job
from app.runtime import engine
from app.runtime.sessions import SessionPool
from app.runtime.tensors import from_json, unpack

INLINE = "inline"
# Failures the request's own inputs caused: the client's to fix (422).
_CLIENT_ERRORS = {"invalid_input", "inference_error", "non_finite_output"}


class DeadlinePassed(DomainError):
    """The job did not finish in time; it goes on, and its id says where to look."""

    problem_type = "sync-timeout"


class InferenceFailed(DomainError):
    """The job ended without outputs; `error_code` says why."""

    problem_type = "inference-failed"


@dataclass(frozen=True)
class Answer:
    card: ModelCard
    outputs: dict[str, np.ndarray]
    job_id: uuid.UUID | None  # None when the model ran inline


def infer(
    session: Session,
    repository: ModelRepository,
    tenant_id: int,
    model: str,
    version: str | None,
    inputs: Any,
    *,
    timeout_s: float,
    bus: EventBus,
    inserter: JobInserter | None,
    sessions: Callable[[], SessionPool],
    max_attempts: int = 3,
    tenant: str | None = None,
) -> Answer:
    """Outputs for `inputs` (as a job accepts them), within `timeout_s`.

    Raises InputsDoNotFit before anything runs, InferenceFailed when the model
    failed the request, DeadlinePassed when the job is still unfinished.
    """
    card = repository.resolve(model, version, tenant)
    if card.extra.get("execution") == INLINE:
        arrays = service.check_inputs(card, inputs)
        if limits := quotas.current():  # its submits count, though it makes no job
            limits.admit_jobs(session, tenant_id, 0)
        pool = sessions()
        try:
            pool.get(card)
        except Exception as exc:  # its file is missing, corrupt or unlike its card
            detail = f"model {card.ref} cannot serve: {type(exc).__name__}: {exc}"
            raise _failed("model_invalid", detail, None) from None
        [result] = engine.infer(pool, card, [arrays])
        if isinstance(result, Exception):
            non_finite = isinstance(result, engine.NonFiniteOutput)
            code = "non_finite_output" if non_finite else "inference_error"
            raise _failed(code, f"{type(result).__name__}: {result}", None)
        return Answer(card, result, None)
    job = service.submit(
        session, repository, tenant_id, card.name, card.version, inputs,
        max_attempts=max_attempts, inserter=inserter, tenant=tenant,
        priority=quotas.SYNC_PRIORITY,  # a caller waits: ahead of every async job
    )  # fmt: skip
    job = service.wait_until_finished(session, bus, tenant_id, job.id, timeout_s)
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
    location = f"/jobs/{job.id}"
    if job.status in ("queued", "running"):
        return DeadlinePassed(
            f"job {job.id} did not finish within {timeout_s:g} s; it is {job.status} and "
            f"goes on: GET {location} (with ?wait=30) for its result",
            status=504,
            headers={"Location": location},
            job_id=str(job.id),
            job_status=job.status,
        )
    detail = f"job {job.id} ended {job.status}"
    if job.error_code:
        detail += f" ({job.error_code}: {job.error_message})"
    return _failed(job.error_code or job.status, detail, job)


def _failed(code: str, detail: str, job: Job | None) -> InferenceFailed:
    if code in _CLIENT_ERRORS:
        status = 422
    elif code in ("cancelled", "expired", "deadline_exceeded"):
        status = 409
    else:
        status = 500
    extra: dict[str, Any] = {"error_code": code}
    headers = None
    if job is not None:
        extra |= {"job_id": str(job.id), "job_status": job.status}
        headers = {"Location": f"/jobs/{job.id}"}
    return InferenceFailed(detail, status=status, headers=headers, **extra)
