"""Running claimed jobs: the one function every door's jobs reach (async jobs,
sync calls, batch chunks, beat's runs), whatever decides how the answer returns.

`Runner.run` groups claimed jobs by model version, reads each one's inputs, runs
each group the one way a model runs on a micro-batch (`app.execution.runs`, one
ONNX Runtime call for many jobs where the model allows) and says what each
attempt came to; a bad row fails only its own job. While they run, the lease
keeper renews their leases, so only a worker that died loses them. Writing the
outcomes, and claiming, are the execution operations' units of work
(app.operations.execution); nothing here commits.
"""

from __future__ import annotations

import logging
import random
import traceback
import uuid
from collections import defaultdict
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import numpy as np
from sqlalchemy.orm import Session

from app.cards import ModelCard
from app.errors import UnknownModel
from app.execution import runs
from app.execution.leases import LeaseKeeper, Renew
from app.execution.traces import traced_run
from app.jobs.chunks import read_range, result_key
from app.jobs.claims import ClaimedJob
from app.jobs.guards import Guards
from app.jobs.steps import StepRow
from app.jobs.transitions import Outcome
from app.platform.filestore import FileStore
from app.platform.settings import Settings
from app.repository.registry import ModelRepository
from app.runtime.sessions import SessionPool
from app.runtime.tensors import (
    from_json,
    pack,
    parse_inputs,
    tensor_bytes,
    unpack,
    unpack_apart,
)
from app.statuses import TERMINAL, JobStatus
from app.sync.replies import Reply

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunSettings:
    """What running jobs needs of the settings: the lease (JOB_LEASE_SECONDS),
    renewed every third of it, the time limit (JOB_TIME_LIMIT_SECONDS), and the
    retry backoff (RETRY_BACKOFF_SECONDS, RETRY_BACKOFF_MAX_SECONDS)."""

    lease_s: float
    time_limit_s: float
    backoff_s: float
    backoff_max_s: float

    @classmethod
    def of(cls, settings: Settings) -> RunSettings:
        return cls(settings.job_lease_seconds, settings.job_time_limit_seconds,
                   settings.retry_backoff_seconds, settings.retry_backoff_max_seconds)  # fmt: skip


@dataclass
class Runner:
    """What runs claimed jobs; one per process (workers; the API for inline models)."""

    repository: ModelRepository
    sessions: SessionPool
    settings: RunSettings
    store: FileStore  # batch chunks' rows and results
    # Writes new leases for jobs still running (a unit of work of its own).
    renew: Renew  # (returns the ids still this worker's)
    # Called when jobs outrun JOB_TIME_LIMIT_SECONDS. Worker children kill themselves
    # there (a hard time limit); elsewhere (tests, the API) nothing is set.
    on_time_limit: Callable[[list[ClaimedJob]], None] | None = None
    # The safety guards this path keeps (all on; the fault suite turns some off).
    guards: Guards = field(default_factory=Guards)
    # Sends sync calls' answers to their callers' channels (app.sync.replies), after
    # the commit; None where nobody waits so (tests of the execute path alone).
    reply: Callable[[list[tuple[str, Reply]]], None] | None = None
    # Where pipeline jobs' finished steps are kept (app.jobs.steps); None: not kept.
    steps: StepStore | None = None
    leases: LeaseKeeper = field(init=False)

    def __post_init__(self) -> None:
        self.leases = LeaseKeeper(lambda jobs: self.renew(jobs))

    def card(self, model: str, version: str | None = None) -> ModelCard | None:
        try:
            return self.repository.resolve_rescanning(model, version)
        except UnknownModel:
            return None

    def run(self, session: Session, claimed: list[ClaimedJob]) -> list[Outcome]:
        """Run claimed jobs, grouped by model version, their leases renewed meanwhile;
        what each attempt came to, in the order of the groups. `session` reads the
        rows of chunks kept in PostgreSQL."""
        groups: dict[tuple[str, str], list[ClaimedJob]] = defaultdict(list)
        for job in claimed:
            groups[(job.model, job.model_version)].append(job)
        with self._leases_renewed(claimed):
            return [
                o for (m, v), jobs in groups.items() for o in _run_group(session, self, m, v, jobs)
            ]

    def answer(self, claimed: list[ClaimedJob], outcomes: list[Outcome], rows: list[Any]) -> None:
        """Send each finished sync call's answer to its caller's process (after the
        commit: the record is there first); a lost one is read from PostgreSQL by
        its caller instead, so a failure here is only logged."""
        channels = {job.id: job.reply_to for job in claimed if job.reply_to}
        if not channels or self.reply is None:
            return
        by_job = {outcome.job_id: outcome for outcome in outcomes}
        replies = [
            (channels[row.id], _answer(row, by_job[row.id]))
            for row in rows
            if row.id in channels and row.status in TERMINAL
        ]
        try:
            if replies:
                self.reply(replies)
        except Exception as exc:
            logger.warning("could not send %d answer(s) (%s); callers read them", len(replies), exc)

    def _leases_renewed(self, jobs: list[ClaimedJob]) -> AbstractContextManager[None]:
        """Renew the jobs' leases every third of their length while they run, and
        enforce the time limit (app.execution.leases)."""
        settings = self.settings
        return self.leases.holding(
            jobs, settings.lease_s / 3, settings.time_limit_s, self.on_time_limit
        )


def _answer(row: Any, outcome: Outcome) -> Reply:
    """A finished job's answer: its status as written (cancelled, where asked while
    it ran), and its outputs only where it succeeded."""
    outputs = outcome.output_data if row.status == JobStatus.SUCCEEDED else None
    return Reply(row.id, row.status, row.error_code, outcome.error_message, outputs)


def backoff_delay(settings: RunSettings, attempt: int) -> float:
    """Exponential backoff with full jitter: spreads retries of a burst of failures."""
    cap = min(settings.backoff_max_s, settings.backoff_s * 2 ** (attempt - 1))
    return random.uniform(0, cap)


def _run_group(
    session: Session, runner: Runner, model: str, version: str, jobs: list[ClaimedJob]
) -> list[Outcome]:
    card = runs.resolve(runner.repository, model, version)
    if isinstance(card, runs.Failed):  # unloaded, or out of its version policy, since submit
        return [_failed(job, card) for job in jobs]
    outcomes: dict[uuid.UUID, Outcome] = {}
    runnable, requests = [], []
    for job in jobs:
        try:
            requests.append(_inputs(session, runner.store, card, job))
            runnable.append(job)
        except (KeyError, TypeError, ValueError) as exc:  # checked at submit; changed since?
            outcomes[job.id] = _failed(job, runs.Failed("invalid_input", exc))
        except OSError as exc:  # the file store did not answer: the chunk's rows are kept
            outcomes[job.id] = _store_error(runner, job, exc)
    with traced_run(card, [(job.traceparent, job.created_at) for job in runnable]) as traces:
        records = (
            JobRecords(runner.steps, runnable, resume=runner.guards.steps, traced=traces)
            if card.steps and runner.steps else None
        )  # fmt: skip
        ran_all = runs.run_card(runner.sessions, card, requests, runner.repository, records)
    for job, ran in zip(runnable, ran_all, strict=True):
        try:
            outcome = (
                _after_error(runner.settings, runner.guards, job, ran)
                if isinstance(ran, runs.Failed)
                else _succeeded(runner.store, job, ran.outputs)
            )
        except OSError as exc:  # its result part could not be written (a full disk)
            outcome = _store_error(runner, job, exc)
        # What the job cost: its rows' share of the call (one figure per job, summed
        # per tenant by GET /usage).
        share, compute_s = (ran.share, ran.compute_s) if isinstance(ran, runs.Ran) else (0.0, 0.0)
        outcomes[job.id] = replace(outcome, batch_share=share, compute_seconds=compute_s)
    return [outcomes[job.id] for job in jobs]


class StepStore(Protocol):
    def load(self, job_ids: list[uuid.UUID]) -> dict[uuid.UUID, dict[tuple[str, int], bytes]]: ...

    def write(self, rows: list[StepRow]) -> None: ...


@dataclass
class JobRecords:
    """A micro-batch of pipeline jobs' finished steps (app.execution.steps.Records):
    read once (a first attempt has none), written as each step finishes."""

    store: StepStore
    jobs: list[ClaimedJob]
    resume: bool = True  # (the `steps` guard: off, every step runs again)
    traced: list[str | None] | None = None  # each job's run span, its steps' spans under it

    def traces(self) -> list[str | None]:
        return self.traced or [None] * len(self.jobs)

    def recorded(self) -> list[dict[tuple[str, int], dict[str, np.ndarray]]]:
        if not self.resume or all(job.attempt <= 1 for job in self.jobs):
            return [{} for _ in self.jobs]
        found = self.store.load([job.id for job in self.jobs])
        return [{key: unpack(data) for key, data in found.get(job.id, {}).items()}
                for job in self.jobs]  # fmt: skip

    def record(self, rows: list[tuple[int, str, int, dict[str, np.ndarray]]]) -> None:
        jobs = self.jobs
        self.store.write([StepRow(jobs[i].id, step, element, jobs[i].attempt, pack(outputs))
                          for i, step, element, outputs in rows])  # fmt: skip


def _succeeded(store: FileStore, job: ClaimedJob, outputs: dict[str, np.ndarray]) -> Outcome:
    """Outputs are stored packed in their declared datatypes (float32 stays 4 bytes
    a value); they become JSON only when a client reads them. A batch chunk's go to
    the file store, under a key of its own that a retry overwrites whole; its row
    only records their size, when its finish is written."""
    data = pack(outputs)
    if job.batch_id is None or job.batch_index is None:
        return Outcome(job.id, job.attempt, JobStatus.SUCCEEDED, output_data=data)
    size = store.write(result_key(job.batch_id, job.batch_index), data)
    return Outcome(job.id, job.attempt, JobStatus.SUCCEEDED, output_bytes=size)


def _inputs(
    session: Session, store: FileStore, card: ModelCard, job: ClaimedJob
) -> dict[str, np.ndarray]:
    if job.input_data is not None and (job.input_key or job.input_file_id) is not None:
        return _rows_in_file(session, store, card, job)
    if job.input_key is not None:  # its own inputs, checked when its batch was cut
        arrays = unpack(store.read(job.input_key))
        return {spec.name: arrays[spec.name] for spec in card.inputs}
    if job.input_data is not None:
        arrays = unpack(job.input_data)
        return {spec.name: arrays[spec.name] for spec in card.inputs}
    return from_json(card.inputs, job.inputs or {})


def _rows_in_file(
    session: Session, store: FileStore, card: ModelCard, job: ClaimedJob
) -> dict[str, np.ndarray]:
    """A chunk whose rows were left in place in its .npy upload: its header
    (the packed form's, naming shape and datatype) plus the file's byte range,
    from the store (or PostgreSQL, for a file uploaded before the store). They
    were not looked at when the batch was cut, so they are checked here like
    any job's inputs: a bad row fails its own chunk (invalid_input)."""
    header = bytes(job.input_data or b"")  # psycopg2 hands bytea over as a memoryview
    size, offset = tensor_bytes(header), job.input_offset or 0
    if job.input_key is not None:
        data = store.read(job.input_key, offset, size)
    else:
        assert job.input_file_id is not None
        data = read_range(session, job.input_file_id, offset, size)
    return parse_inputs(card, unpack_apart(header, data))


def _after_error(
    settings: RunSettings, guards: Guards, job: ClaimedJob, failed: runs.Failed
) -> Outcome:
    if not failed.transient:
        logger.warning("job %s failed: %s", job.id, failed.detail)
        return _failed(job, failed)
    return _retry(settings, guards, job, failed.error, "resource_exhausted")


def _store_error(runner: Runner, job: ClaimedJob, exc: OSError) -> Outcome:
    """The file store failed this chunk (unreachable, full, its object gone): tried
    again later like any transient error, then dead-lettered; never a half-written
    part taken as done (a part is written whole or not at all)."""
    logger.warning("job %s: the file store failed: %s", job.id, exc)
    return _retry(runner.settings, runner.guards, job, exc, "store_unavailable")


def _retry(
    settings: RunSettings, guards: Guards, job: ClaimedJob, exc: Exception, code: str
) -> Outcome:
    if job.attempt >= job.max_attempts and guards.cap:
        logger.warning("job %s failed after %d attempts: %s", job.id, job.attempt, exc)
        return _failed(job, runs.Failed("retries_exhausted", exc))
    delay = backoff_delay(settings, job.attempt)
    logger.info("job %s: transient error, retry in %.1fs: %s", job.id, delay, exc)
    return Outcome(
        job.id,
        job.attempt,
        "retry",
        error_code=code,
        error_message=f"{type(exc).__name__}: {exc}",
        error_class=type(exc).__name__,
        traceback="".join(traceback.format_exception(exc)),
        delay_s=delay,
    )


def _failed(job: ClaimedJob, failed: runs.Failed) -> Outcome:
    exc = failed.error
    return Outcome(
        job.id,
        job.attempt,
        JobStatus.FAILED,
        error_code=failed.code,
        error_message=failed.detail,
        error_class=type(exc).__name__,
        traceback="".join(traceback.format_exception(exc)),
    )
