"""Schedules: a tenant's cron runs of a model over a file or a data folder (each
run a batch), and beat's tick that fires the due ones and writes finished runs'
results. Each change is a unit of work; the tick fires a schedule a unit, and
writes a run's results a unit."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable

from app.batches.tables import Batch
from app.operations.requests import ScheduleFields
from app.platform.database import Database, transactional
from app.platform.filestore import FileStore
from app.schedules import definitions, firing
from app.schedules.definitions import Rules
from app.schedules.firing import TICK_TASK
from app.schedules.representation import ScheduleSchema
from app.schedules.tables import Schedule
from app.statuses import BatchStatus
from app.tenancy.keys import TenantRef

__all__ = ["TICK_TASK", "Schedule", "ScheduleOperations", "ScheduleSchema"]

logger = logging.getLogger(__name__)

FIRE_LIMIT = 50  # schedules fired a tick at most; the next tick fires the rest
EXPORT_LIMIT = 20  # runs' results written a tick at most


class ScheduleOperations:
    def __init__(self, database: Database, store: FileStore, rules: Rules) -> None:
        self.database, self._store, self._rules = database, store, rules

    @transactional
    def create(self, tenant: TenantRef, fields: ScheduleFields) -> Schedule:
        """A cron schedule of batch runs; its first tick is the next one."""
        return definitions.create(self.database.session(), self._rules, tenant.id, dict(fields))

    @transactional
    def update(
        self, tenant: TenantRef, schedule_id: uuid.UUID, changes: ScheduleFields
    ) -> Schedule:
        """Only the fields given change; a new cron, time zone or resume starts from
        the next tick."""
        return definitions.update_schedule(
            self.database.session(), self._rules, tenant.id, schedule_id, dict(changes)
        )

    @transactional
    def delete(self, tenant: TenantRef, schedule_id: uuid.UUID) -> None:
        """Its runs stay, as batches."""
        definitions.delete(self.database.session(), tenant.id, schedule_id)

    def get(self, tenant: TenantRef, schedule_id: uuid.UUID) -> Schedule:
        return definitions.get(self.database.session(), tenant.id, schedule_id)

    def list_schedules(self, tenant: TenantRef) -> list[Schedule]:
        return definitions.list_schedules(self.database.session(), tenant.id)

    def named(self, tenant: TenantRef, name: str) -> Schedule | None:
        """The tenant's schedule called `name` (the CLI names schedules)."""
        return definitions.named(self.database.session(), tenant.id, name)

    def runs(self, tenant: TenantRef, schedule_id: uuid.UUID, limit: int) -> list[Batch]:
        """Its runs, newest tick first: each a batch."""
        return definitions.runs(self.database.session(), tenant.id, schedule_id, limit)

    # -- beat's tick ---------------------------------------------------------------

    def fire_due(self, start_split: Callable[[uuid.UUID], bool]) -> list[uuid.UUID]:
        """Fire every due, unpaused schedule once (up to FIRE_LIMIT), each in its own
        unit of work; a run that reads a file is sent to be split once committed.
        Returns the runs' batch ids."""
        fired: list[uuid.UUID] = []
        for _ in range(FIRE_LIMIT):
            took, batch = self._fire_next()
            if not took:
                break
            if batch is None:  # that tick had its run already
                continue
            fired.append(batch.id)
            if batch.status == BatchStatus.QUEUED and not start_split(batch.id):
                logger.warning("schedule run %s: split not sent; the sweep sends it", batch.id)
        return fired

    @transactional
    def _fire_next(self) -> tuple[bool, Batch | None]:
        """Whether a due schedule was taken, and the run it fired (None: none)."""
        session = self.database.session()
        due = firing.take_due(session)
        if due is None:
            return False, None
        return True, firing.fire(session, self._store, self._rules, due)

    def export_finished(self) -> int:
        """Write finished runs' results into their schedules' output folders (up to
        EXPORT_LIMIT), a run a unit of work; how many were done."""
        done = 0
        while done < EXPORT_LIMIT and self._export_next():
            done += 1
        return done

    @transactional
    def _export_next(self) -> bool:
        session = self.database.session()
        batch = firing.take_finished(session)
        if batch is None:
            return False
        firing.export(session, self._store, self._rules, self.database.sessionmaker, batch)
        return True
