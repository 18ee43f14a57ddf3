"""Dead letters: failed jobs and undeliverable webhooks a person lists, replays
(same job id; same webhook-id) or purges. A replay is one unit of work; its
models are woken once it committed."""

from __future__ import annotations

import uuid

from app.jobs import dead_letters
from app.jobs.dead_letters import Filters, Replayed
from app.jobs.tables import DeadLetter
from app.operations.submission import Submitter
from app.platform.database import Database, transactional
from app.tenancy.keys import TenantRef
from app.webhooks import log

__all__ = ["DeadLetter", "DeadLetterOperations", "Filters"]


class DeadLetterOperations:
    def __init__(self, database: Database, submitter: Submitter) -> None:
        self.database, self._submitter = database, submitter

    def list_letters(
        self, tenant: TenantRef, filters: Filters, limit: int, before: int | None
    ) -> tuple[list[DeadLetter], int | None]:
        """The tenant's dead letters, newest first, and the next page's cursor."""
        return dead_letters.list_letters(self.database.session(), tenant.id, filters, limit, before)

    def get(self, tenant: TenantRef | None, letter_id: int) -> DeadLetter:
        """A tenant's dead letter; with no tenant (an operator), any tenant's."""
        return dead_letters.get(self.database.session(), tenant.id if tenant else None, letter_id)

    @transactional
    def replay(self, tenant: TenantRef, letter_id: int, actor: str) -> uuid.UUID:
        """Put the letter's job back in the queue, same id; Conflict if it cannot be."""
        replayed = dead_letters.replay(self.database.session(), tenant.id, letter_id, actor)
        self._requeued(replayed)
        return replayed.ids[0]

    @transactional
    def replay_matching(
        self, tenant: TenantRef, filters: Filters, limit: int, actor: str
    ) -> list[uuid.UUID]:
        """Replay every unreplayed letter that matches, oldest first, up to `limit`."""
        session = self.database.session()
        replayed = dead_letters.replay_matching(session, tenant.id, filters, limit, actor)
        self._requeued(replayed)
        return replayed.ids

    @transactional
    def purge(self, tenant: TenantRef, letter_id: int, actor: str) -> None:
        """Delete a letter (audited); its job stays as it ended."""
        dead_letters.purge(self.database.session(), tenant.id, letter_id, actor)

    def _requeued(self, replayed: Replayed) -> None:
        """Send the replay's webhooks again; once it committed, wake its models
        (those that do not wake: the sweep)."""
        if replayed.deliveries:
            log.redeliver(self.database.session(), replayed.deliveries)
        for model, job_ids in replayed.woken.items():
            self._submitter.wake_once_committed(model, job_ids)
