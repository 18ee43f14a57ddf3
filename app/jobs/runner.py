"""The one path that runs jobs. Every door (async jobs today; sync, batch and
beat later) reaches `execute`; a door only decides how the answer returns.

It takes a list of job ids from the start so that micro-batching can hand it
several jobs of one model: claim them in one UPDATE, run them, write every
outcome in one UPDATE. A bad row fails only its own job. While the jobs run, a
background thread renews their leases, so only a worker that died loses them.
"""

from __future__ import annotations

import logging
import random
import threading
import time
import traceback
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from sqlalchemy.orm import Session

from app.config import Settings
from app.inference.repository import ModelRepository, UnknownModel
from app.inference.sessions import SessionPool
from app.inference.tensors import from_json, to_json
from app.jobs.transitions import ClaimedJob, Outcome, claim, finish, renew_leases

logger = logging.getLogger(__name__)

# Errors worth another attempt: the device (GPU or host) ran out of memory, which
# ORT reports from its allocator ("Failed to allocate memory") or from CUDA.
_TRANSIENT_MARKERS = (
    "failed to allocate memory",
    "out of memory",
    "cudaerrormemoryallocation",
    "cuda failure",
)


@dataclass
class Runtime:
    """What the execute path needs; built once per process."""

    repository: ModelRepository
    sessions: SessionPool
    settings: Settings
    new_session: Callable[[], Session]
    # Called when jobs outrun JOB_TIME_LIMIT_SECONDS. Worker children kill themselves
    # there (a hard time limit); elsewhere (tests, the API) nothing is set.
    on_time_limit: Callable[[list[ClaimedJob]], None] | None = None


def execute(session: Session, runtime: Runtime, job_ids: list[uuid.UUID]) -> list[Outcome]:
    settings = runtime.settings
    claimed = claim(
        session,
        job_ids,
        settings.job_lease_seconds,
        guarded="claim" not in settings.guards_off,
        reclaim_expired="lease" not in settings.guards_off,
    )
    if len(claimed) < len(job_ids):
        logger.info("skipped %d job(s) not claimable now", len(job_ids) - len(claimed))
    if not claimed:
        return []
    groups: dict[tuple[str, str], list[ClaimedJob]] = defaultdict(list)
    for job in claimed:
        groups[(job.model, job.model_version)].append(job)
    with _leases_renewed(runtime, claimed):
        outcomes = [o for (m, v), jobs in groups.items() for o in _run_group(runtime, m, v, jobs)]
    written = finish(session, outcomes, guarded="finish" not in settings.guards_off)
    for outcome in outcomes:
        if outcome.job_id not in written:
            logger.warning(
                "job %s: outcome of attempt %s not written (the job moved on)",
                outcome.job_id,
                outcome.attempt,
            )
    return outcomes


def backoff_delay(settings: Settings, attempt: int) -> float:
    """Exponential backoff with full jitter: spreads retries of a burst of failures."""
    cap = min(
        settings.retry_backoff_max_seconds, settings.retry_backoff_seconds * 2 ** (attempt - 1)
    )
    return random.uniform(0, cap)


def _run_group(runtime: Runtime, model: str, version: str, jobs: list[ClaimedJob]) -> list[Outcome]:
    try:
        card = runtime.repository.resolve(model, version)
    except UnknownModel:
        runtime.repository.refresh()  # added since this worker started?
        try:
            card = runtime.repository.resolve(model, version)
        except UnknownModel as exc:
            return [_failed(job, "model_unavailable", exc) for job in jobs]
    outcomes = []
    for job in jobs:
        try:
            outputs = runtime.sessions.run(card, from_json(card, job.inputs))
        # ONNX Runtime raises its own exception types; whatever this input did, the
        # outcome is recorded on the job's row (retried or failed), never swallowed.
        except Exception as exc:
            outcomes.append(_after_error(runtime.settings, job, exc))
            continue
        outcomes.append(Outcome(job.id, job.attempt, "succeeded", outputs=to_json(outputs)))
    return outcomes


def _after_error(settings: Settings, job: ClaimedJob, exc: Exception) -> Outcome:
    transient = any(marker in str(exc).lower() for marker in _TRANSIENT_MARKERS)
    if not transient:
        logger.warning("job %s failed: %s", job.id, exc)
        return _failed(job, "inference_error", exc)
    if job.attempt >= job.max_attempts and "cap" not in settings.guards_off:
        logger.warning("job %s failed after %d attempts: %s", job.id, job.attempt, exc)
        return _failed(job, "retries_exhausted", exc)
    delay = backoff_delay(settings, job.attempt)
    logger.info("job %s: transient error, retry in %.1fs: %s", job.id, delay, exc)
    return Outcome(
        job.id,
        job.attempt,
        "retry",
        error_code="resource_exhausted",
        error_message=f"{type(exc).__name__}: {exc}",
        error_class=type(exc).__name__,
        traceback="".join(traceback.format_exception(exc)),
        delay_s=delay,
    )


def _failed(job: ClaimedJob, code: str, exc: Exception) -> Outcome:
    return Outcome(
        job.id,
        job.attempt,
        "failed",
        error_code=code,
        error_message=f"{type(exc).__name__}: {exc}",
        error_class=type(exc).__name__,
        traceback="".join(traceback.format_exception(exc)),
    )


@contextmanager
def _leases_renewed(runtime: Runtime, jobs: list[ClaimedJob]) -> Iterator[None]:
    """Renew the leases every third of their length until the block ends, and
    enforce the time limit.

    Short jobs end before the first renewal, so they cost no extra write.
    """
    interval = runtime.settings.job_lease_seconds / 3
    limit = runtime.settings.job_time_limit_seconds
    started = time.monotonic()
    stop = threading.Event()

    def renew() -> None:
        while not stop.wait(min(interval, max(0.0, limit - (time.monotonic() - started)))):
            if runtime.on_time_limit and time.monotonic() - started >= limit:
                logger.error(
                    "job(s) %s exceeded the time limit of %gs", [str(j.id) for j in jobs], limit
                )
                runtime.on_time_limit(jobs)
                return
            try:
                with runtime.new_session() as session:
                    renew_leases(session, jobs, runtime.settings.job_lease_seconds)
            except Exception:  # the next renewal tries again; the lease is the backstop
                logger.exception("could not renew leases")

    thread = threading.Thread(target=renew, name="lease-renewal", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
