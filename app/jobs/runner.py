"""The one path that runs jobs. Every door (async jobs today; sync, batch and
beat later) reaches `execute`; a door only decides how the answer returns.

It takes a list of job ids from the start so that micro-batching can hand it
several jobs of one model: claim them in one UPDATE, run them, write every
outcome in one UPDATE. A bad row fails only its own job.
"""

from __future__ import annotations

import logging
import uuid
from collections import defaultdict
from dataclasses import dataclass

from sqlalchemy.orm import Session

from app.inference.repository import ModelRepository, UnknownModel
from app.inference.sessions import SessionPool
from app.inference.tensors import from_json, to_json
from app.jobs.transitions import ClaimedJob, Outcome, claim, finish

logger = logging.getLogger(__name__)


@dataclass
class Runtime:
    """What the execute path needs; built once per process."""

    repository: ModelRepository
    sessions: SessionPool
    max_attempts: int


def execute(session: Session, runtime: Runtime, job_ids: list[uuid.UUID]) -> list[Outcome]:
    claimed = claim(session, job_ids)
    if len(claimed) < len(job_ids):
        logger.info("skipped %d job(s) not queued any more", len(job_ids) - len(claimed))
    groups: dict[tuple[str, str], list[ClaimedJob]] = defaultdict(list)
    for job in claimed:
        groups[(job.model, job.model_version)].append(job)
    outcomes = [o for (m, v), jobs in groups.items() for o in _run_group(runtime, m, v, jobs)]
    written = finish(session, outcomes)
    for outcome in outcomes:
        if outcome.job_id not in written:
            logger.warning(
                "job %s: result of attempt %s not written (job moved on)",
                outcome.job_id,
                outcome.attempt,
            )
    return outcomes


def _run_group(runtime: Runtime, model: str, version: str, jobs: list[ClaimedJob]) -> list[Outcome]:
    try:
        card = runtime.repository.resolve(model, version)
    except UnknownModel as exc:
        return [_failed(job, "model_unavailable", str(exc)) for job in jobs]
    outcomes = []
    for job in jobs:
        if job.attempt > runtime.max_attempts:
            outcomes.append(
                _failed(job, "attempts_exhausted", f"gave up after {runtime.max_attempts} attempts")
            )
            continue
        try:
            outputs = runtime.sessions.run(card, from_json(card, job.inputs))
        # ONNX Runtime raises its own exception types for bad input or a broken graph;
        # either way this job's input cannot be run, so it fails, visibly, on its row.
        except Exception as exc:
            logger.warning("job %s failed in %s: %s", job.id, card.ref, exc)
            outcomes.append(_failed(job, "inference_error", f"{type(exc).__name__}: {exc}"))
            continue
        outcomes.append(Outcome(job.id, job.attempt, "succeeded", outputs=to_json(outputs)))
    return outcomes


def _failed(job: ClaimedJob, code: str, message: str) -> Outcome:
    return Outcome(job.id, job.attempt, "failed", error_code=code, error_message=message)
