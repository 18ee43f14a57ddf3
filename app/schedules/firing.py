"""Firing schedules and writing their runs' results.

Beat sends `schedules.tick` every SCHEDULE_TICK_SECONDS; a worker's schedule
operations then fire every due schedule, each in a unit of work of its own that
locks it with SKIP LOCKED, moves `next_run_at` past now and creates the run's
batch (unique per schedule and tick). So two beats, or two workers taking their
ticks, never fire a run twice. Ticks missed for at most SCHEDULE_CATCH_UP_SECONDS
(a restart, a failover) each fire, late, one after the other; of those missed
for longer only the earliest fires (a schedule down for a day fires once, not
once per tick). Finished
runs' results are written to the schedule's output folder, a batch a unit.
Nothing here commits.
"""

from __future__ import annotations

import logging
import os
import tempfile
import uuid
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from app.batches import files, progress, results
from app.batches.creation import attach_file, new_batch
from app.batches.tables import Batch
from app.errors import DomainError, InvalidRequest, UnknownModel
from app.platform.filestore import FileStore
from app.schedules import paths
from app.schedules.definitions import Rules, following, now_of, root_of, tenant_of
from app.schedules.tables import Schedule
from app.statuses import BATCH_TERMINAL, BatchStatus

logger = logging.getLogger(__name__)

TICK_TASK = "schedules.tick"


def take_due(session: Session) -> Schedule | None:
    """The next due, unpaused schedule, locked (SKIP LOCKED: another worker's ticks
    fire the others) until the transaction ends; None when none is due."""
    return session.scalar(
        select(Schedule)
        .where(Schedule.paused.is_(False), Schedule.next_run_at <= func.now())
        .order_by(Schedule.next_run_at)
        .limit(1)
        .with_for_update(skip_locked=True)
    )


def fire(session: Session, store: FileStore, rules: Rules, schedule: Schedule) -> Batch | None:
    """The run for the schedule's due tick, and the tick moved on: committed
    together, or neither. The caller sends a queued run's split once committed.
    None when that tick has its run already (its `next_run_at` was moved back):
    a tick never fires twice, and the schedule moves on all the same."""
    tick, now = schedule.next_run_at, now_of(session)
    schedule.next_run_at = following(schedule.cron, schedule.timezone, tick, now,
                                     rules.catch_up_s)  # fmt: skip
    ran = select(Batch.id).where(Batch.schedule_id == schedule.id, Batch.scheduled_for == tick)
    if session.scalar(ran) is not None:
        return None
    batch = _run(session, store, rules, schedule, tick, now)
    logger.info("schedule %s fired for %s: batch %s (%s)", schedule.name,
                batch.scheduled_for, batch.id, batch.status)  # fmt: skip
    return batch


def _run(
    session: Session, store: FileStore, rules: Rules, schedule: Schedule, tick: datetime,
    now: datetime,
) -> Batch:  # fmt: skip
    """The run for the schedule's tick `tick`, fired at `now`. A run whose input or
    model is unavailable is recorded as a failed batch saying why, so every tick
    leaves a trace."""
    schedule.last_run_at = now
    try:
        tenant = tenant_of(session, schedule.tenant_id).name
        card = rules.repository.resolve_rescanning(schedule.model, schedule.model_version, tenant)
        batch = new_batch(card, rules.chunking, schedule.tenant_id)
        file_id = schedule.input_file_id or _import(session, store, rules, schedule, tick)
        with session.begin_nested():  # a run that fails its check leaves the tick's move
            attach_file(session, store, batch, card, file_id)
    except (DomainError, UnknownModel, paths.InputUnavailable) as exc:
        detail = exc.detail if isinstance(exc, DomainError) else str(exc)
        batch = Batch(
            id=uuid.uuid4(), tenant_id=schedule.tenant_id, model=schedule.model,
            model_version=schedule.model_version or "", status=BatchStatus.FAILED, chunk_rows=1,
            split_rows=0, error_code="input_unavailable", error_message=detail[:2000],
            finished_at=now,
        )  # fmt: skip
    batch.schedule_id, batch.scheduled_for = schedule.id, tick
    batch.output_path = schedule.output_path
    session.add(batch)
    session.flush()
    return batch


def _import(
    session: Session, store: FileStore, rules: Rules, schedule: Schedule, tick: datetime
) -> uuid.UUID:
    """The run's input copied from the data area into the file store, in the
    run's transaction: the batch then reads it like any upload."""
    assert schedule.input_path is not None
    root = root_of(session, rules.data_dir, schedule.tenant_id)
    fmt, found = paths.input_files(root, schedule.input_path)
    name = f"{schedule.name}-{tick:%Y%m%dT%H%M%SZ}.{fmt}"
    with session.begin_nested():
        file = files.store_parts(session, store, schedule.tenant_id, name, fmt,
                                 paths.read(fmt, found), rules.max_upload_bytes)  # fmt: skip
    return file.id


def take_finished(session: Session) -> Batch | None:
    """The next finished run whose results are still to be written, locked (SKIP
    LOCKED) until the transaction ends; None when none is left."""
    return session.scalar(
        select(Batch)
        .where(Batch.output_path.is_not(None), Batch.exported_at.is_(None),
               Batch.status.in_(BATCH_TERMINAL))
        .order_by(Batch.finished_at)
        .limit(1)
        .with_for_update(skip_locked=True)
    )  # fmt: skip


def export(
    session: Session, store: FileStore, rules: Rules, sessions: sessionmaker[Session], batch: Batch
) -> None:
    """Write a finished run's results into its schedule's output folder: `.npy` when
    every row succeeded, else `.jsonl` (with each failed row's error), to a
    temporary name renamed when whole, so a reader never sees half a file; then
    mark it written (a failure to write is noted on the batch, and not tried again).
    `sessions` reads the chunks' results apart from the batch's transaction."""
    try:
        written = _export(session, store, rules, sessions, batch)
        logger.info("batch %s: results written to %s", batch.id, written)
    except (DomainError, UnknownModel, OSError) as exc:
        logger.warning("could not write results of batch %s: %s", batch.id, exc)
        note = f"{batch.error_message or ''} results not written: {exc}".strip()
        batch.error_message = note[:2000]
    batch.exported_at = now_of(session)
    session.flush()


def _export(
    session: Session, store: FileStore, rules: Rules, sessions: sessionmaker[Session], batch: Batch
) -> Path:
    assert batch.output_path is not None
    root = root_of(session, rules.data_dir, batch.tenant_id)
    folder = paths.inside(root, batch.output_path, "output_path")
    folder.mkdir(parents=True, exist_ok=True)
    paths.inside(root, batch.output_path, "output_path")  # no symlink swapped in meanwhile
    schedule = session.get(Schedule, batch.schedule_id) if batch.schedule_id else None
    when = batch.scheduled_for or batch.created_at
    stem = f"{schedule.name if schedule else 'batch'}-{when:%Y%m%dT%H%M%SZ}"
    card = rules.repository.resolve_rescanning(batch.model, batch.model_version)
    counted = progress.progress(session, batch)
    chunks = results.chunks(sessions, store, batch.id)
    body: Iterator[bytes]
    try:
        if batch.status != BatchStatus.SUCCEEDED or counted.rows_failed:
            raise InvalidRequest("not every row has outputs")
        names = results.numeric_outputs(card, None)
        body, target = results.npy(names, counted.rows_done, chunks), folder / f"{stem}.npy"
    except InvalidRequest:  # rows without outputs, or outputs that are not numbers
        body, target = results.jsonl(card, chunks), folder / f"{stem}.jsonl"
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{stem}.", suffix=".part")
    try:
        with os.fdopen(fd, "wb") as out:
            for part in body:
                out.write(part)
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target
