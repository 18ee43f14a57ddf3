"""Schedules: a cron expression in a time zone, a model, an input and where the
results go; every run is a batch (`batches.schedule_id`). Their definitions and
checks; nothing here commits (the schedule operations own the transaction)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from app.batches import files
from app.batches.creation import Chunking, new_batch
from app.batches.tables import Batch
from app.errors import InvalidRequest
from app.platform.database import flush_unique
from app.platform.orm import owned
from app.repository.registry import ModelRepository
from app.schedules import paths
from app.schedules.tables import Schedule
from app.tenancy.tables import Tenant

FIELDS = ("name", "cron", "timezone", "model", "version", "input", "output", "paused")


@dataclass(frozen=True)
class Rules:
    """What a schedule is checked and run with: the model repository, the tenants'
    data areas (DATA_DIR), how its runs' batches are cut, and the largest input a
    run may copy from the data area (MAX_UPLOAD_BYTES)."""

    repository: ModelRepository
    data_dir: Path
    chunking: Chunking
    max_upload_bytes: int
    catch_up_s: float = 300.0


def following(
    cron: str, timezone: str, tick: datetime, now: datetime, catch_up_s: float
) -> datetime:
    """The tick to fire after `tick`: the next one, even if due already (missed for
    at most `catch_up_s`, it fires late), but none missed for longer."""
    after = next_tick(cron, timezone, tick)
    if (now - after).total_seconds() > catch_up_s:
        after = next_tick(cron, timezone, max(tick, now - timedelta(seconds=catch_up_s)))
    return after


def next_tick(cron: str, timezone: str, after: datetime) -> datetime:
    """The first tick of `cron` in `timezone` strictly after `after` (in UTC)."""
    local = after.astimezone(ZoneInfo(timezone))
    tick: datetime = croniter(cron, local).get_next(datetime)
    return tick.astimezone(UTC)


def check_cron(cron: str, timezone: str) -> None:
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


def now_of(session: Session) -> datetime:
    """PostgreSQL's time (its transaction's): ticks are stored and judged by it, so
    a process whose wall clock is off (an hour ahead) fires none early or late.
    Read without autoflush: pending changes are flushed where their errors are
    caught (a name another schedule has)."""
    with session.no_autoflush:
        now = session.scalar(select(func.now()))
    assert now is not None
    return now


def tenant_of(session: Session, tenant_id: int) -> Tenant:
    tenant = session.get(Tenant, tenant_id)
    assert tenant is not None
    return tenant


def root_of(session: Session, data_dir: Path, tenant_id: int) -> Path:
    """The tenant's data area (under DATA_DIR)."""
    tenant = tenant_of(session, tenant_id)
    return paths.tenant_root(data_dir, tenant.id, tenant.name)


def create(session: Session, rules: Rules, tenant_id: int, spec: dict[str, Any]) -> Schedule:
    """A schedule from `spec` (the API's fields); its first tick is the next one."""
    schedule = Schedule(id=uuid.uuid4(), tenant_id=tenant_id, paused=False)
    _apply(session, rules, schedule, {"timezone": "UTC", **spec}, creating=True)
    session.add(schedule)
    _flush_unique(session, schedule)
    return schedule


def update_schedule(
    session: Session, rules: Rules, tenant_id: int, schedule_id: uuid.UUID, changes: dict[str, Any]
) -> Schedule:
    """Change some fields; a new cron, time zone or resume starts from the next tick."""
    schedule = get(session, tenant_id, schedule_id, lock=True)
    # Its checks query the database: a query's autoflush would write a name the
    # tenant already has before _flush_unique could refuse it (a 500, not a 422).
    with session.no_autoflush:
        _apply(session, rules, schedule, changes, creating=False)
    schedule.updated_at = now_of(session)
    _flush_unique(session, schedule)
    return schedule


def _apply(
    session: Session, rules: Rules, schedule: Schedule, spec: dict[str, Any], *, creating: bool
) -> None:
    if "name" in spec:
        schedule.name = spec["name"]
    if "model" in spec or "version" in spec:
        model = spec.get("model", schedule.model)
        version = spec.get("version", None if "model" in spec else schedule.model_version)
        tenant = tenant_of(session, schedule.tenant_id).name
        card = rules.repository.resolve(model, version, tenant)  # UnknownModel (or not theirs)
        new_batch(card, rules.chunking, schedule.tenant_id)  # 422 without a batch dimension
        schedule.model, schedule.model_version = card.name, version
    root = root_of(session, rules.data_dir, schedule.tenant_id)
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
    check_cron(schedule.cron, schedule.timezone)
    if "paused" in spec:
        schedule.paused = bool(spec["paused"])
    if creating or timing:
        schedule.next_run_at = next_tick(schedule.cron, schedule.timezone, now_of(session))


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


def named(session: Session, tenant_id: int, name: str) -> Schedule | None:
    query = select(Schedule).where(Schedule.tenant_id == tenant_id, Schedule.name == name)
    return session.scalar(query)


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


def reader_of(session: Session, file_id: uuid.UUID) -> str | None:
    """The name of a schedule whose input is this file, if one is."""
    return session.scalar(select(Schedule.name).where(Schedule.input_file_id == file_id))
