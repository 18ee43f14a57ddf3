"""Durable responses (OpenAI's /v1/responses): a generation job with a record beside
its request, so it lives in PostgreSQL as every job does. A restart of every
process loses nothing; a worker's death is a retry that goes on from the tokens
recorded; a stream dropped is resumed from the record (`replay`).

A response that follows another (`previous_response_id`) is given that one's
conversation: its messages (less its instructions) and its answer.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

from sqlalchemy.orm import undefer

from app.errors import NotFound
from app.generation.fields import BadField
from app.generation.pieces import Followed
from app.generation.requests import stored_request
from app.generation.responses import (
    ResponseAsk,
    ResponseEvents,
    Shown,
    input_items,
    job_id_of,
    messages,
    read_create,
    response_id,
    response_object,
)
from app.jobs import outputs, transitions
from app.jobs.representation import stored_outputs
from app.jobs.staging import Webhook, stored_record
from app.jobs.tables import Job
from app.operations.completions import Completions
from app.operations.jobs import JobOperations
from app.operations.requests import JobRequest, Wait
from app.platform.database import Database, transactional
from app.statuses import TERMINAL, JobStatus
from app.tenancy.keys import TenantRef

__all__ = [
    "BadField", "Followed", "ResponseEvents", "Responses", "job_id_of", "read_create",
    "response_object",
]  # fmt: skip

REPLAY_EVERY_S = 0.1  # how often a resumed stream reads the record
SETTLE_S = 10.0  # how long cancel and delete wait for a running generation to stop


class Responses:
    def __init__(self, database: Database, jobs: JobOperations, completions: Completions) -> None:
        self.database, self._jobs, self._completions = database, jobs, completions

    def create(self, tenant: TenantRef, ask: ResponseAsk) -> Job:
        card = self._completions.card(tenant, ask.model)
        if card.generation is None:
            raise BadField("model", f"{ask.model} does not generate text (GET /v1/models)")
        history = self._history(tenant, ask.previous) if ask.previous else []
        webhook = None
        if ask.webhook is not None:
            webhook = Webhook(ask.webhook["url"], tuple(ask.webhook.get("events") or (
                "job.succeeded", "job.failed", "job.cancelled", "job.expired")))  # fmt: skip
        request = JobRequest(ask.model, {"messages": messages(ask, history)},
                             parameters=ask.parameters or None, webhook=webhook,
                             record=ask.record())  # fmt: skip
        return self._completions.start(tenant, card, request)

    def _history(self, tenant: TenantRef, job_id: uuid.UUID) -> list[dict[str, str]]:
        """The conversation a response that follows `job_id` goes on from."""
        job, record = self._read(tenant, job_id)
        if job is None or record is None:
            raise BadField("previous_response_id", f"no response {response_id(job_id)} of yours")
        if job.status not in TERMINAL:
            raise BadField("previous_response_id", f"{response_id(job_id)} is still "
                           f"{job.status}; follow it once it has completed")  # fmt: skip
        request = stored_request(bytes(job.input_data or b""))
        turns = [{"role": role, "content": content} for role, content in request.messages or ()]
        if record.get("instructions"):
            turns = turns[1:]  # (its instructions were its own)
        answer = (stored_outputs(job) or {}).get("text") or ""
        return [*turns, {"role": "assistant", "content": answer}]

    def shown(self, tenant: TenantRef, job_id: uuid.UUID) -> Shown:
        """The response as it stands; NotFound for none of the tenant's."""
        job, record = self._read(tenant, job_id)
        if job is None or record is None:
            raise NotFound(f"no response {response_id(job_id)}")
        found = stored_outputs(job) or {}
        if job.status == JobStatus.RUNNING and job.output_data is None:
            with self.database.sessionmaker() as session:
                found = {"text": outputs.text_so_far(session, job.id) or ""}
        counts = ("prompt_tokens", "completion_tokens", "total_tokens")
        usage: dict[str, int] = {k: int(found[k]) for k in counts if k in found}
        return Shown(
            job.id, job.model, job.status, job.created_at.timestamp(), record,
            str(found.get("text") or ""), found.get("finish_reason"), usage or None,
            job.error_message, job.finished_at.timestamp() if job.finished_at else None,
        )  # fmt: skip

    def input_items(self, tenant: TenantRef, job_id: uuid.UUID) -> list[dict[str, Any]]:
        return input_items(job_id, self.shown(tenant, job_id).record)

    def follow(self, tenant: TenantRef, job_id: uuid.UUID) -> Iterator[Followed]:
        """A response's text as the worker makes it (for the stream that created it)."""
        return self._completions.follow(tenant, job_id)

    def replay(self, tenant: TenantRef, job_id: uuid.UUID) -> Iterator[Followed]:
        """A response's text from its record, as it is recorded, then its end (a
        stream resumed: nothing of the live pieces is needed). It holds one of the
        tenant's waits while it reads (TooManyWaits past the tenant's limit), as a
        job's event stream does: each reads the record every REPLAY_EVERY_S."""
        release = self._jobs.follow(tenant, job_id, -1)  # (now: a refusal is a 429)
        return _released(self._replayed(tenant, job_id), release)

    def _replayed(self, tenant: TenantRef, job_id: uuid.UUID) -> Iterator[Followed]:
        sent, deadline = "", time.monotonic() + self._completions.timeout_s
        while time.monotonic() < deadline:
            shown = self.shown(tenant, job_id)
            new = ""
            if shown.text.startswith(sent):
                new, sent = shown.text[len(sent) :], shown.text
            if shown.status in TERMINAL:
                yield Followed(new, {"final": True, "status": shown.status})
                return
            if new:
                yield Followed(new)
            self.database.end_reads()
            time.sleep(REPLAY_EVERY_S)
        raise TimeoutError(f"response {response_id(job_id)} did not finish in time")

    def cancel(self, tenant: TenantRef, job_id: uuid.UUID) -> Shown:
        """Stop a background response; it ends `cancelled` with the text made so far."""
        shown = self.shown(tenant, job_id)
        if not shown.record.get("background"):
            raise BadField("response_id", "only a response created with background: true "
                           "can be cancelled")  # fmt: skip
        if shown.status not in TERMINAL:
            self._jobs.cancel_many(tenant, [job_id])
            self._jobs.wait(tenant, job_id, Wait(SETTLE_S, "finished"))
            self.database.end_reads()
        return self.shown(tenant, job_id)

    def delete(self, tenant: TenantRef, job_id: uuid.UUID) -> None:
        """Forget a response: an unfinished one is stopped first; its input, output
        and recorded text are erased (the job's row stays, for the usage counts)."""
        shown = self.shown(tenant, job_id)
        if shown.status not in TERMINAL:
            self._jobs.cancel_many(tenant, [job_id])
            self._jobs.wait(tenant, job_id, Wait(SETTLE_S, "finished"))
            self.database.end_reads()
        self._erase(tenant, job_id)

    @transactional
    def _erase(self, tenant: TenantRef, job_id: uuid.UUID) -> None:
        transitions.erase(self.database.session(), tenant.id, job_id)

    def _read(
        self, tenant: TenantRef, job_id: uuid.UUID
    ) -> tuple[Job | None, dict[str, Any] | None]:
        with self.database.sessionmaker() as session:
            job = session.get(Job, job_id, options=[undefer(Job.input_data),
                                                    undefer(Job.output_data)])  # fmt: skip
            if job is None or job.tenant_id != tenant.id or job.purged_at is not None:
                return None, None
            session.expunge(job)
        return job, stored_record(job.input_data)


def _released(
    followed: Iterator[Followed], release: Callable[[], None] | None
) -> Iterator[Followed]:
    """The text followed, the tenant's wait given back when it ends (or is dropped)."""
    try:
        yield from followed
    finally:
        if release is not None:
            release()
