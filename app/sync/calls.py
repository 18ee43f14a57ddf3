"""A caller's sync calls followed to their answers, and what each answer becomes.

A worker-run model's call travels the sync lane (app.sync.lane): the workers
that own the GPU run it in a micro-batch and answer over this process's reply
channel, its record written behind. A generative model's call (and every call
with SYNC_LANE off) is an ordinary job, submitted like any other, and outlives a
caller that gave up: DeadlinePassed names it, and its result can be read at
/jobs/<id>. An inline model's call is answered before it is followed. The call
operations (`app.operations.calls`) compose these; `app.sync.lane.route` says
which way a call goes.
"""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
from sqlalchemy import Engine, bindparam, text

from app.cards import ModelCard
from app.errors import DeadlinePassed, DomainError, InferenceFailed, Unavailable, UnknownModel
from app.jobs.transitions import UUIDS
from app.runtime.tensors import from_json, unpack
from app.statuses import OPEN, TERMINAL, JobStatus
from app.sync.lane import LOST
from app.sync.replies import Follower

MODEL_UNAVAILABLE = "model_unavailable"  # a call's model stopped serving before it ran
# A generative model's output: its text, by KServe's name (Triton's vLLM backend's).
TEXT_OUTPUT = "text_output"


@dataclass(frozen=True)
class Answer:
    card: ModelCard
    outputs: dict[str, np.ndarray]
    job_id: uuid.UUID | None  # None when the model ran inline


class Outcome(Protocol):
    """What a caller's answer is made from: a `Job`, a row of `_READ`, or a `Reply`."""

    @property
    def id(self) -> uuid.UUID: ...
    @property
    def status(self) -> str: ...
    @property
    def error_code(self) -> str | None: ...
    @property
    def error_message(self) -> str | None: ...
    @property
    def output_data(self) -> bytes | None: ...
    @property
    def outputs(self) -> dict[str, Any] | None: ...


# A followed call's job as its answer needs it: a Core statement (the ORM's query
# building and row loading were most of a unary gRPC call's Python time).
_READ = text(
    """
    SELECT id, status, error_code, error_message, output_data, outputs FROM jobs
    WHERE id = ANY(:ids) AND tenant_id = :tenant
    """
).bindparams(bindparam("ids", type_=UUIDS))


@dataclass(frozen=True)
class Call:
    """A sync call under way: its model, its job (None when the model ran inline:
    then `done` holds the answer), how long its caller waits, and until when
    (`time.monotonic()`). A call on the sync lane has no job row yet: `lane_entry`
    is what was pushed (its record will bear `job_id`)."""

    card: ModelCard
    job_id: uuid.UUID | None
    timeout_s: float
    give_up_at: float
    done: Answer | None = None
    lane_entry: bytes | None = None
    lane_queue: str | None = None  # the queue whose lane it was pushed onto


class LaneWatch(Protocol):
    """What following lane calls needs of the lane (app.operations.calls.LaneCalls)."""

    def recover(self) -> None:
        """Settle the calls of workers that died (now and then, not every time)."""

    def withdraw(self, call: Call) -> bool:
        """Take a call no worker took yet back from its lane (False: one took it)."""


Ended = Answer | DomainError


class Calls:
    """Many sync calls of one caller followed at once (a gRPC stream's, or the
    one call of a unary request). Their answers come over Redis, straight from
    the workers (app.sync.replies); a call not answered so within CHECK_S, or
    whose caller's time ran out, is read from PostgreSQL (one query for all that
    are due). Reads only; it owns no transaction.

    `leave()` (from any thread: the caller went away) ends the current and every
    later `finished` at once; `left` says it happened."""

    def __init__(
        self,
        engine: Engine,
        follower: Follower,
        tenant_id: int,
        gather_s: float = 0.0,
        lane: LaneWatch | None = None,
    ) -> None:
        self._engine, self._follower, self.gather_s = engine, follower, gather_s
        self._tenant_id, self._lane = tenant_id, lane
        self._calls: dict[uuid.UUID, Call] = {}
        self._lock = threading.Lock()  # one thread adds calls while another takes them back
        self.left = False

    def add(self, call: Call) -> None:
        assert call.done is None and call.job_id, "an inline call has its answer already"
        with self._lock:
            self._calls[call.job_id] = call
        self._follower.add(call.job_id)

    def __len__(self) -> int:
        return len(self._calls)

    def pending(self) -> list[Call]:
        """The calls not handed back yet."""
        with self._lock:
            return list(self._calls.values())

    def wake(self) -> None:
        """End the current `finished` now (another thread has news for its caller)."""
        self._follower.poke()

    def leave(self) -> None:
        self.left = True
        self._follower.poke()

    def finished(self, timeout_s: float) -> list[tuple[Call, Ended]]:
        """The calls that ended, each with its answer or error, waiting up to
        `timeout_s` for the first (less once the caller left); a call whose
        caller's time ran out ends with DeadlinePassed (its job goes on)."""
        now = time.monotonic()
        with self._lock:
            first_late = min((c.give_up_at for c in self._calls.values()), default=now + timeout_s)
        wait_s = 0.0 if self.left else max(0.0, min(timeout_s, first_late - now))
        heard, due = self._follower.wait(wait_s)
        if heard and self.gather_s and not self.left:
            # Answers of one micro-batch come a moment apart: gathered, a stream's
            # caller is handed more of them at once (a unary call waits none).
            time.sleep(self.gather_s)
            more, due_too = self._follower.wait(0)
            heard |= more
            due |= due_too
        now = time.monotonic()
        with self._lock:
            late = {job_id for job_id, call in self._calls.items() if call.give_up_at <= now}
            answered = {job_id: reply for job_id, reply in heard.items() if job_id in self._calls}
            to_read = {
                job_id: self._calls[job_id]
                for job_id in (due | late) & self._calls.keys()
                if job_id not in answered
            }
        ended = [
            (self._calls[job_id], _ended(self._calls[job_id], r)) for job_id, r in answered.items()
        ]
        late -= answered.keys()
        on_lane = {job_id for job_id, call in to_read.items() if call.lane_entry is not None}
        if on_lane:  # no row to read: settle dead workers' calls; give up on late ones
            for job_id in on_lane:
                del to_read[job_id]
            assert self._lane is not None
            self._lane.recover()
            for job_id in on_lane & late:
                call = self._calls[job_id]
                ended.append((call, lane_late_error(call, self._lane.withdraw(call))))
            late -= on_lane
        for job in self._read(to_read, now) if to_read else ():
            late.discard(job.id)
            ended.append((to_read[job.id], _ended(to_read[job.id], job)))  # unfinished: too late
        for job_id in late:  # gone from the table (purged): it cannot end any more
            ended.append((to_read[job_id], late_error(job_id, None, to_read[job_id].timeout_s)))
        with self._lock:
            for call, _ in ended:
                self._calls.pop(call.job_id, None)  # type: ignore[arg-type]
        self._follower.discard([call.job_id for call, _ in ended if call.job_id])
        return ended

    def close(self) -> None:
        self._follower.close()

    def _read(self, calls: dict[uuid.UUID, Call], now: float) -> list[Outcome]:
        """Of these calls' jobs, those that finished, and those whose caller's time
        ran out by `now` (whatever their status)."""
        with self._engine.connect() as conn:
            rows = conn.execute(_READ, {"ids": list(calls), "tenant": self._tenant_id}).all()
        return [row for row in rows if row.status in TERMINAL or calls[row.id].give_up_at <= now]


def _ended(call: Call, job: Outcome) -> Ended:
    try:
        return answer(call.card, job, call.timeout_s)
    except DomainError as exc:
        return exc


def answer(card: ModelCard, job: Outcome, timeout_s: float) -> Answer:
    """The finished job's outputs; DeadlinePassed while it is unfinished,
    InferenceFailed when it ended without outputs, Unavailable when its worker
    died before answering (a lane call it may not run again)."""
    if job.status == JobStatus.SUCCEEDED:
        return Answer(card, _outputs(card, job), job.id)
    if job.status == LOST:
        raise Unavailable(
            f"the worker running call {job.id} stopped before answering it, and model "
            f"{card.ref} is not idempotent (its card), so it was not run again; nothing "
            "was recorded: send it again",
            retry_after=1, job_id=str(job.id), error_code=job.error_code,
        )  # fmt: skip
    if job.status == JobStatus.FAILED and job.error_code == MODEL_UNAVAILABLE:
        # The model went (unloaded, removed) while the call waited: as for a call
        # made now, 404 naming it, not a server error.
        gone = UnknownModel(card.name, card.version, [],
                            f"it stopped serving while call {job.id} waited")  # fmt: skip
        gone.extra.update(job_id=str(job.id), error_code=MODEL_UNAVAILABLE)
        raise gone
    raise _outcome_error(job, timeout_s)


def lane_late_error(call: Call, withdrawn: bool) -> DeadlinePassed:
    """A lane call not answered in time: withdrawn unrun, or taken by a worker
    (then it may have run: its record would be at /jobs/<id>)."""
    if withdrawn:
        detail = (f"call {call.job_id} was not answered within {call.timeout_s:g} s: no worker "
                  f"of model {call.card.ref} took it in time, and it was withdrawn unrun; "
                  "nothing was recorded")  # fmt: skip
    else:
        detail = (
            f"call {call.job_id} was not answered within {call.timeout_s:g} s; a worker "
            f"had taken it: if it ran, its record is at GET /jobs/{call.job_id}"
        )
    return DeadlinePassed(detail, job_id=str(call.job_id), taken=not withdrawn)


def _outputs(card: ModelCard, job: Outcome) -> dict[str, np.ndarray]:
    """The finished job's outputs as arrays: unpacked as stored, or from JSON for
    rows written before outputs were packed."""
    if job.output_data is not None:
        arrays = unpack(job.output_data)
        if card.generation is not None:
            return {TEXT_OUTPUT: np.array([arrays["text"][()]], dtype=object)}
        return {spec.name: arrays[spec.name] for spec in card.outputs}
    return from_json(card.outputs, job.outputs or {})


def late_error(job_id: uuid.UUID, status: str | None, timeout_s: float) -> DeadlinePassed:
    """The job of a call whose caller stopped waiting (its status, where read); it
    goes on."""
    now = f"it is {status} and goes on" if status else "it goes on"
    extra: dict[str, Any] = {"job_status": status} if status else {}
    return DeadlinePassed(
        f"job {job_id} did not finish within {timeout_s:g} s; {now}: GET /jobs/{job_id} "
        "(with ?wait=30) for its result",
        job_id=str(job_id),
        **extra,
    )


def _outcome_error(job: Outcome, timeout_s: float) -> DomainError:
    if job.status in OPEN:
        return late_error(job.id, job.status, timeout_s)
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
