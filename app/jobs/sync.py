"""The sync door's pieces: run one request now and answer with its outputs.

By default the request becomes an ordinary job, submitted like any other (with
the API's coalesced inserts), so the workers that own the GPU run it, in the
same micro-batches as async jobs of its model; the caller waits on the event
bus until the job finishes or its time is up. The job outlives a caller that
gave up: DeadlinePassed names it, and its result can be read at /jobs/<id>.

A card with `"execution": "inline"` (small CPU models) runs in the calling
process instead, through the same inference function; its record (a finished
job, without inputs) is written after it ran, before the caller is answered.
The data plane (`app.dataplane`) composes these.
"""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
from sqlalchemy import Engine, bindparam, text

from app.errors import DeadlinePassed, DomainError, InferenceFailed
from app.jobs.events import Subscription
from app.jobs.transitions import UUIDS
from app.models.cards import ModelCard
from app.platform.tables import TERMINAL_STATUSES
from app.runtime import engine
from app.runtime.sessions import SessionPool
from app.runtime.tensors import from_json, unpack

INLINE = "inline"


@dataclass(frozen=True)
class Answer:
    card: ModelCard
    outputs: dict[str, np.ndarray]
    job_id: uuid.UUID | None  # None when the model ran inline


class Outcome(Protocol):
    """What a caller's answer is made from: a `Job`, or a row of `_READ`."""

    id: uuid.UUID
    status: str
    error_code: str | None
    error_message: str | None
    output_data: bytes | None
    outputs: dict[str, Any] | None


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
    (`time.monotonic()`)."""

    card: ModelCard
    job_id: uuid.UUID | None
    timeout_s: float
    give_up_at: float
    done: Answer | None = None


Ended = Answer | DomainError


class Calls:
    """Many sync calls of one caller followed at once (a gRPC stream's, or the
    one call of a unary request): one subscription on the event bus for all
    their jobs, and one query per wake-up for those that finished. Reads only;
    it owns no transaction.

    `leave()` (from any thread: the caller went away) ends the current and every
    later `finished` at once; `left` says it happened."""

    def __init__(
        self, engine: Engine, subscription: Subscription, tenant_id: int, gather_s: float = 0.0
    ) -> None:
        self._engine, self._subscription, self.gather_s = engine, subscription, gather_s
        self._tenant_id = tenant_id
        self._calls: dict[uuid.UUID, Call] = {}
        self._lock = threading.Lock()  # one thread adds calls while another takes them back
        self.left = False

    def add(self, call: Call) -> None:
        assert call.done is None and call.job_id, "an inline call has its answer already"
        with self._lock:
            self._calls[call.job_id] = call
        self._subscription.add(call.job_id)

    def __len__(self) -> int:
        return len(self._calls)

    def jobs(self) -> list[uuid.UUID]:
        """The jobs of the calls not handed back yet."""
        with self._lock:
            return list(self._calls)

    def wake(self) -> None:
        """End the current `finished` now (another thread has news for its caller)."""
        self._subscription.poke()

    def leave(self) -> None:
        self.left = True
        self._subscription.poke()

    def finished(self, timeout_s: float) -> list[tuple[Call, Ended]]:
        """The calls that ended, each with its answer or error, waiting up to
        `timeout_s` for the first (less once the caller left); a call whose
        caller's time ran out ends with DeadlinePassed (its job goes on)."""
        now = time.monotonic()
        with self._lock:
            first_late = min((c.give_up_at for c in self._calls.values()), default=now + timeout_s)
        wait_s = 0.0 if self.left else max(0.0, min(timeout_s, first_late - now))
        changed = self._subscription.wait(wait_s)
        if changed and self.gather_s and not self.left:
            # A job's claim and its finish are two changes a few ms apart: gathered,
            # one read sees more jobs finished (a stream's; a unary call waits none).
            time.sleep(self.gather_s)
            changed |= self._subscription.wait(0)
        now = time.monotonic()
        with self._lock:
            late = {job_id for job_id, call in self._calls.items() if call.give_up_at <= now}
            calls = {
                job_id: self._calls[job_id] for job_id in (changed | late) & self._calls.keys()
            }
        ended: list[tuple[Call, Ended]] = []
        for job in self._read(calls, now) if calls else ():
            late.discard(job.id)
            ended.append((calls[job.id], _ended(calls[job.id], job)))  # unfinished: too late
        for job_id in late:  # gone from the table (purged): it cannot end any more
            ended.append((calls[job_id], late_error(job_id, None, calls[job_id].timeout_s)))
        with self._lock:
            for call, _ in ended:
                self._calls.pop(call.job_id, None)  # type: ignore[arg-type]
        self._subscription.discard([call.job_id for call, _ in ended if call.job_id])
        return ended

    def close(self) -> None:
        self._subscription.close()

    def _read(self, calls: dict[uuid.UUID, Call], now: float) -> list[Outcome]:
        """Of these calls' jobs, those that finished, and those whose caller's time
        ran out by `now` (whatever their status)."""
        with self._engine.connect() as conn:
            rows = conn.execute(_READ, {"ids": list(calls), "tenant": self._tenant_id}).all()
        return [
            row
            for row in rows
            if row.status in TERMINAL_STATUSES or calls[row.id].give_up_at <= now
        ]


def _ended(call: Call, job: Outcome) -> Ended:
    try:
        return answer(call.card, job, call.timeout_s)
    except DomainError as exc:
        return exc


def runs_inline(card: ModelCard) -> bool:
    return card.extra.get("execution") == INLINE


def run_inline(pool: SessionPool, card: ModelCard, arrays: dict[str, np.ndarray]) -> Answer:
    """Run checked inputs in this process; InferenceFailed when the model cannot."""
    try:
        pool.get(card)
    except Exception as exc:  # its file is missing, corrupt or unlike its card
        detail = f"model {card.ref} cannot serve: {type(exc).__name__}: {exc}"
        raise failed("model_invalid", detail) from None
    [result] = engine.infer(pool, card, [arrays])
    if isinstance(result, Exception):
        non_finite = isinstance(result, engine.NonFiniteOutput)
        code = "non_finite_output" if non_finite else "inference_error"
        raise failed(code, f"{type(result).__name__}: {result}")
    return Answer(card, result, None)


def answer(card: ModelCard, job: Outcome, timeout_s: float) -> Answer:
    """The finished job's outputs; DeadlinePassed while it is unfinished,
    InferenceFailed when it ended without outputs."""
    if job.status == "succeeded":
        return Answer(card, _outputs(card, job), job.id)
    raise _outcome_error(job, timeout_s)


def _outputs(card: ModelCard, job: Outcome) -> dict[str, np.ndarray]:
    """The finished job's outputs as arrays: unpacked as stored, or from JSON for
    rows written before outputs were packed."""
    if job.output_data is not None:
        arrays = unpack(job.output_data)
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
    if job.status in ("queued", "running"):
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


def failed(code: str, detail: str) -> InferenceFailed:
    """An inline call's failure (its record, once written, is named in `job_id`)."""
    return InferenceFailed(detail, error_code=code)
