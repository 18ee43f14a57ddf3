"""Schedules: a cron expression in a time zone, a model, an input and where the
results go; every run is a batch (`batches.schedule_id`).

Beat sends `schedules.tick` every SCHEDULE_TICK_SECONDS; a worker runs
`fire_due`, which locks due schedules with SKIP LOCKED and, in one
transaction per schedule, moves `next_run_at` past now and creates the run's
batch (unique per schedule and tick). So two beats, or two workers taking
their ticks, never fire a run twice, and a schedule that missed ticks while
the service was down fires once, for the earliest, not once per tick.
"""

from __future__ import annotations

import logging
import os
import tempfile
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from app.batches import files, results
from app.batches import service as batches
from app.batches.tables import BATCH_TERMINAL_STATUSES, Batch
from app.errors import DomainError, InvalidRequest, UnknownModel
from app.platform.database import flush_unique
from app.platform.filestore import FileStore
from app.platform.orm import owned
from app.platform.settings import Settings
from app.repository.registry import ModelRepository
from app.schedules import paths
from app.schedules.tables import Schedule
from app.tenancy.tables import Tenant

logger = logging.getLogger(__name__)

TICK_TASK = "schedules.tick"
FIELDS = ("name", "cron", "timezone", "model", "version", "input", "output", "paused")


def next_tick(cron: str, timezone: str, after: datetime) -> datetime:
    """The first tick of `cron` in `timezone` strictly after `after` (in UTC)."""
    local = after.astimezone(ZoneInfo(timezone))
    tick: datetime = croniter(cron, local).get_next(datetime)
    return tick.astimezone(UTC)


def _check_cron(cron: str, timezone: str) -> None:
    if not croniter.is_valid(cron):
        raise InvalidRequest(
            f"cron {cron!r} is not a cron expression; use five fields (minute hour day month "
            "weekday), for example '0 3 * * *' for 03:00 every day, or six with seconds last",
            errors={"cron": ["a cron expression such as '0 3 * * *'"]},
        )
    try:
        ZoneInfo(timezone)
    except (ZoneInfoNotFoundError, ValueError):
        raise InvalidRequest(
            f"timezone {timezone!r} is not an IANA time zone (for example 'Europe/Paris', 'UTC')",
            errors={"timezone": ["an IANA time zone name"]},
        ) from None


def _now(session: Session) -> datetime:
    """PostgreSQL's time (its transaction's): ticks are stored and judged by it, so
    a process whose wall clock is off (an hour ahead) fires none early or late.
    Read without autoflush: pending changes are flushed where their errors are
    caught (a name another schedule has)."""
    with session.no_autoflush:
        now = session.scalar(select(func.now()))
    assert now is not None
    return now


def _tenant(session: Session, tenant_id: int) -> Tenant:
    tenant = session.get(Tenant, tenant_id)
    assert tenant is not None
    return tenant


def _root(session: Session, settings: Settings, tenant_id: int) -> Path:
    tenant = _tenant(session, tenant_id)
    return paths.tenant_root(settings.data_dir, tenant.id, tenant.name)


def create(
    session: Session,
    repository: ModelRepository,
    settings: Settings,
    tenant_id: int,
    spec: dict[str, Any],
) -> Schedule:
    """A schedule from `spec` (the API's fields); its first tick is the next one."""
    schedule = Schedule(id=uuid.uuid4(), tenant_id=tenant_id, paused=False)
    _apply(session, repository, settings, schedule, {"timezone": "UTC", **spec}, creating=True)
    session.add(schedule)
    _flush_unique(session, schedule)
    return schedule


def update_schedule(
    session: Session,
    repository: ModelRepository,
    settings: Settings,
    tenant_id: int,
    schedule_id: uuid.UUID,
    changes: dict[str, Any],
) -> Schedule:
    """Change some fields; a new cron, time zone or resume starts from the next tick."""
    schedule = get(session, tenant_id, schedule_id, lock=True)
    # Its checks query the database: a query's autoflush would write a name the
    # tenant already has before _flush_unique could refuse it (a 500, not a 422).
    with session.no_autoflush:
        _apply(session, repository, settings, schedule, changes, creating=False)
    schedule.updated_at = _now(session)
    _flush_unique(session, schedule)
    return schedule


def _apply(
    session: Session,
    repository: ModelRepository,
    settings: Settings,
    schedule: Schedule,
    spec: dict[str, Any],
    *,
    creating: bool,
) -> None:
    if "name" in spec:
        schedule.name = spec["name"]
    if "model" in spec or "version" in spec:
        model = spec.get("model", schedule.model)
        version = spec.get("version", None if "model" in spec else schedule.model_version)
        tenant = _tenant(session, schedule.tenant_id).name
        card = repository.resolve(model, version, tenant)  # UnknownModel: 404 (or not theirs)
        batches.new_batch(card, settings, schedule.tenant_id)  # 422 without a batch dimension
        schedule.model, schedule.model_version = card.name, version
    root = _root(session, settings, schedule.tenant_id)
    if "input" in spec:
        source = spec["input"]
        if (source.get("file_id") is None) == (source.get("path") is None):
            raise InvalidRequest("input: give either file_id (an upload) or path (in your "
                                 "data area)", errors={"input": ["file_id or path"]})  # fmt: skip
        if source.get("file_id") is not None:
            schedule.input_file_id = files.get(session, schedule.tenant_id, source["file_id"]).id
            schedule.input_path = None
        else:
            paths.inside(root, source["path"], "input_path")
            schedule.input_file_id, schedule.input_path = None, source["path"]
    if "output" in spec:
        output = spec["output"]
        if output is not None:
            paths.inside(root, output, "output_path")
        schedule.output_path = output
    timing = {"cron", "timezone", "paused"} & set(spec)
    schedule.cron = spec.get("cron", schedule.cron)
    schedule.timezone = spec.get("timezone", schedule.timezone)
    _check_cron(schedule.cron, schedule.timezone)
    if "paused" in spec:
        schedule.paused = bool(spec["paused"])
    if creating or timing:
        schedule.next_run_at = next_tick(schedule.cron, schedule.timezone, _now(session))


def _flush_unique(session: Session, schedule: Schedule) -> None:
    """Write the schedule now: a name the tenant already has is an InvalidRequest."""
    flush_unique(session, lambda: InvalidRequest(
        f"you already have a schedule named {schedule.name!r}",
        errors={"name": ["unique among your schedules"]},
    ))  # fmt: skip


def get(
    session: Session, tenant_id: int, schedule_id: uuid.UUID, *, lock: bool = False
) -> Schedule:
    return owned(session, Schedule, tenant_id, schedule_id, "schedule", lock=lock)


def list_schedules(session: Session, tenant_id: int) -> list[Schedule]:
    query = select(Schedule).where(Schedule.tenant_id == tenant_id).order_by(Schedule.name)
    return list(session.scalars(query))


def delete(session: Session, tenant_id: int, schedule_id: uuid.UUID) -> None:
    """Its runs stay, as batches, without their link to it."""
    session.delete(get(session, tenant_id, schedule_id))
    session.flush()


def runs(session: Session, tenant_id: int, schedule_id: uuid.UUID, limit: int) -> list[Batch]:
    get(session, tenant_id, schedule_id)
    query = (
        select(Batch)
        .where(Batch.schedule_id == schedule_id)
        .order_by(Batch.scheduled_for.desc())
        .limit(limit)
    )
    return list(session.scalars(query))


def fire_due(
    session: Session,
    store: FileStore,
    repository: ModelRepository,
    settings: Settings,
    start_split: Callable[[uuid.UUID], bool],
    limit: int = 50,
) -> list[uuid.UUID]:
    """Fire every due, unpaused schedule once; returns the runs' batch ids."""
    fired: list[uuid.UUID] = []
    for _ in range(limit):
        due = session.scalar(
            select(Schedule)
            .where(Schedule.paused.is_(False), Schedule.next_run_at <= func.now())
            .order_by(Schedule.next_run_at)
            .limit(1)
            .with_for_update(skip_locked=True)
        )
        if due is None:
            session.commit()
            break
        batch = _run(session, store, repository, settings, due)
        session.commit()  # the tick moved on and its batch exists, together, or neither
        fired.append(batch.id)
        if batch.status == "queued" and not start_split(batch.id):
            logger.warning("schedule run %s: split not sent; the sweep sends it", batch.id)
        logger.info("schedule %s fired for %s: batch %s (%s)", due.name,
                    batch.scheduled_for, batch.id, batch.status)  # fmt: skip
    return fired


def _run(
    session: Session,
    store: FileStore,
    repository: ModelRepository,
    settings: Settings,
    schedule: Schedule,
) -> Batch:
    """The run for the schedule's due tick, and the tick moved past now (missed
    ticks are not run again). A run whose input or model is unavailable is
    recorded as a failed batch saying why, so every tick leaves a trace."""
    tick = schedule.next_run_at
    now = _now(session)
    schedule.next_run_at = next_tick(schedule.cron, schedule.timezone, max(now, tick))
    schedule.last_run_at = now
    try:
        tenant = _tenant(session, schedule.tenant_id).name
        card = repository.resolve_rescanning(schedule.model, schedule.model_version, tenant)
        batch = batches.new_batch(card, settings, schedule.tenant_id)
        file_id = schedule.input_file_id or _import(session, store, settings, schedule, tick)
        with session.begin_nested():  # a run that fails its check leaves the tick's move
            batches.attach_file(session, store, batch, card, file_id)
    except (DomainError, UnknownModel, paths.InputUnavailable) as exc:
        detail = exc.detail if isinstance(exc, DomainError) else str(exc)
        batch = Batch(
            id=uuid.uuid4(), tenant_id=schedule.tenant_id, model=schedule.model,
            model_version=schedule.model_version or "", status="failed", chunk_rows=1,
            split_rows=0, error_code="input_unavailable", error_message=detail[:2000],
            finished_at=now,
        )  # fmt: skip
    batch.schedule_id, batch.scheduled_for = schedule.id, tick
    batch.output_path = schedule.output_path
    session.add(batch)
    session.flush()
    return batch


def _import(
    session: Session, store: FileStore, settings: Settings, schedule: Schedule, tick: datetime
) -> uuid.UUID:
    """The run's input copied from the data area into the file store, in the
    run's transaction: the batch then reads it like any upload."""
    assert schedule.input_path is not None
    root = _root(session, settings, schedule.tenant_id)
    fmt, found = paths.input_files(root, schedule.input_path)
    name = f"{schedule.name}-{tick:%Y%m%dT%H%M%SZ}.{fmt}"
    with session.begin_nested():
        file = files.store_parts(session, store, schedule.tenant_id, name, fmt,
                                 paths.read(fmt, found), settings.max_upload_bytes)  # fmt: skip
    return file.id


def export_finished(
    session: Session,
    store: FileStore,
    repository: ModelRepository,
    settings: Settings,
    sessions: sessionmaker[Session],
    limit: int = 20,
) -> int:
    """Write finished runs' results into their schedule's output folder: `.npy`
    when every row succeeded, else `.jsonl` (with each failed row's error).
    Written to a temporary name and renamed, so a reader never sees half a file."""
    done = 0
    for _ in range(limit):
        batch = session.scalar(
            select(Batch)
            .where(Batch.output_path.is_not(None), Batch.exported_at.is_(None),
                   Batch.status.in_(BATCH_TERMINAL_STATUSES))
            .order_by(Batch.finished_at)
            .limit(1)
            .with_for_update(skip_locked=True)
        )  # fmt: skip
        if batch is None:
            break
        try:
            written = _export(session, store, repository, settings, sessions, batch)
            logger.info("batch %s: results written to %s", batch.id, written)
        except (DomainError, UnknownModel, OSError) as exc:
            logger.warning("could not write results of batch %s: %s", batch.id, exc)
            note = f"{batch.error_message or ''} results not written: {exc}".strip()
            batch.error_message = note[:2000]
        batch.exported_at = _now(session)
        session.commit()
        done += 1
    session.commit()
    return done


def _export(
    session: Session,
    store: FileStore,
    repository: ModelRepository,
    settings: Settings,
    sessions: sessionmaker[Session],
    batch: Batch,
) -> Path:
    assert batch.output_path is not None
    root = _root(session, settings, batch.tenant_id)
    folder = paths.inside(root, batch.output_path, "output_path")
    folder.mkdir(parents=True, exist_ok=True)
    paths.inside(root, batch.output_path, "output_path")  # no symlink swapped in meanwhile
    schedule = session.get(Schedule, batch.schedule_id) if batch.schedule_id else None
    when = batch.scheduled_for or batch.created_at
    stem = f"{schedule.name if schedule else 'batch'}-{when:%Y%m%dT%H%M%SZ}"
    card = repository.resolve_rescanning(batch.model, batch.model_version)
    counted = batches.progress(session, batch)
    chunks = results.chunks(sessions, store, batch.id)
    body: Iterator[bytes]
    try:
        if batch.status != "succeeded" or counted.rows_failed:
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
