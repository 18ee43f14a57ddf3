"""Generation calls that follow their job: the OpenAI-compatible door's operations.

A call is a job like any other (submitted through the one submit path, run by
the workers' decode loop, recorded and billed); what this adds is following it:
its text as the worker makes it (app.generation.pieces), then its end. A call
whose client went away is cancelled, which frees its decode slot within a step.
"""

from __future__ import annotations

import queue
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

from sqlalchemy.orm import undefer

from app.cards import ModelCard
from app.errors import DomainError
from app.generation.openai_objects import (
    BadField,
    CompletionShape,
    completion_request,
    error_object,
    json_outputs,
    streaming,
)
from app.generation.pieces import Followed, follow
from app.jobs.representation import stored_outputs
from app.jobs.tables import Job
from app.operations.jobs import JobOperations
from app.operations.requests import JobRequest
from app.operations.submission import Submitter
from app.platform.database import Database
from app.repository.registry import ModelRepository
from app.statuses import TERMINAL
from app.tenancy.keys import TenantRef

__all__ = [
    "BadField", "CompletionShape", "Completions", "completion_request", "error_object", "streaming",
]  # fmt: skip


class Completions:
    def __init__(
        self,
        database: Database,
        jobs: JobOperations,
        submitter: Submitter,
        repository: ModelRepository,
        redis: Callable[[], Any],
        timeout_s: float,
    ) -> None:
        self.database, self._jobs, self._submitter = database, jobs, submitter
        self._repository, self._redis, self.timeout_s = repository, redis, timeout_s

    def models(self, tenant: TenantRef) -> list[ModelCard]:
        """The generative models the tenant may use (newest version of each)."""
        cards = [self._repository.resolve(name, None, tenant.name)
                 for name in self._repository.names(tenant.name)]  # fmt: skip
        return [card for card in cards if card.generation is not None]

    def card(self, tenant: TenantRef, model: str) -> ModelCard:
        return self._submitter.card(tenant, model, None)

    def start(self, tenant: TenantRef, card: ModelCard, request: JobRequest) -> Job:
        """The job of a request whose card the door resolved (and found generative)."""
        job = self._jobs.submit(tenant, request, card)
        self.database.end_reads()  # a follower holds no connection while it waits
        return job

    def start_many(
        self, tenant: TenantRef, card: ModelCard, request: JobRequest, n: int
    ) -> list[Job]:
        """`n` choices of one request: as many jobs, submitted together (so one decode
        loop takes them together and prefills their prompt once: the others copy its
        cache rows); a seed is moved on by each, so each choice differs and a seed
        repeats them all. `card`: the request's, resolved once by the door."""
        assert card.generation is not None
        if n > card.generation.max_choices:
            raise BadField("n", f"at most {card.generation.max_choices} for {card.name}")
        parameters = dict(request.parameters or {})
        seed = parameters.get("seed")
        requests = [
            replace(request, parameters={**parameters, "seed": seed + i})
            if isinstance(seed, int) and not isinstance(seed, bool) else request
            for i in range(n)
        ]  # fmt: skip
        cards = self._submitter.cards(tenant).known(request.model, None, card)
        made = self._jobs.submit_many(tenant, requests, cards=cards)
        self.database.end_reads()
        jobs = [job for job in made if isinstance(job, Job)]
        if len(jobs) < n:
            self._jobs.cancel_many(tenant, [job.id for job in jobs])
            raise next(error for error in made if isinstance(error, DomainError))
        return jobs

    def follow_many(
        self, tenant: TenantRef, job_ids: list[uuid.UUID]
    ) -> Iterator[tuple[int, Followed]]:
        """Several jobs' text as it comes, each piece with its job's place in
        `job_ids`, until every one has ended (a thread follows each)."""
        if len(job_ids) == 1:
            yield from ((0, followed) for followed in self.follow(tenant, job_ids[0]))
            return
        came: queue.Queue[tuple[int, Followed | BaseException]] = queue.Queue()

        def follow_one(index: int, job_id: uuid.UUID) -> None:
            try:
                for followed in self.follow(tenant, job_id):
                    came.put((index, followed))
            except BaseException as exc:  # passed to the caller's thread
                came.put((index, exc))

        for index, job_id in enumerate(job_ids):
            threading.Thread(target=follow_one, args=(index, job_id), daemon=True,
                             name=f"follow-{job_id}").start()  # fmt: skip
        left = len(job_ids)
        while left:
            index, item = came.get()
            if isinstance(item, BaseException):
                raise item
            left -= item.final is not None
            yield index, item

    def follow(self, tenant: TenantRef, job_id: uuid.UUID) -> Iterator[Followed]:
        """The job's text as it comes, then its end (`Followed.final`)."""
        return follow(self._redis(), job_id, lambda: self._ended(tenant, job_id), self.timeout_s)

    def cancel(self, tenant: TenantRef, job_id: uuid.UUID) -> None:
        """The caller went away: stop the generation (its slot is free within a step)."""
        self._jobs.cancel_many(tenant, [job_id])

    def cancel_many(self, tenant: TenantRef, job_ids: list[uuid.UUID]) -> None:
        self._jobs.cancel_many(tenant, job_ids)

    def _ended(self, tenant: TenantRef, job_id: uuid.UUID) -> dict[str, Any] | None:
        """The final message's fields from the record, once the job has ended."""
        with self.database.sessionmaker() as session:
            job = session.get(Job, job_id, options=[undefer(Job.output_data)])
            if job is None or job.tenant_id != tenant.id or job.status not in TERMINAL:
                return None
            outputs = stored_outputs(job) or {}
        usage = {k: outputs[k] for k in ("prompt_tokens", "completion_tokens", "total_tokens")
                 if k in outputs}  # fmt: skip
        final = {"final": True, "status": job.status, "output": outputs.get("text", ""),
                 "finish_reason": outputs.get("finish_reason"), "usage": usage,
                 "error": job.error_message}  # fmt: skip
        return {**final, **json_outputs(outputs)}
