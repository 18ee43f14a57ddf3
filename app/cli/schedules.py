"""`python manage.py schedules ...`: the same services as /schedules, for operators."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import click
from sqlalchemy import select
from sqlalchemy.orm import Session

from app.errors import DomainError, UnknownModel
from app.platform.settings import Settings
from app.repository.registry import ModelRepository
from app.schedules.tables import Schedule
from app.tenancy.tables import Tenant


@click.group("schedules")
def schedules() -> None:
    """Batch schedules (cron runs of a model over a file or a data folder)."""


@contextmanager
def _context(tenant: str) -> Iterator[tuple[Session, Settings, ModelRepository, int]]:
    from app.container import Container

    container = Container.from_env()
    settings = container.settings
    try:
        with container.unit_of_work() as session:
            found = session.scalar(select(Tenant.id).where(Tenant.name == tenant))
            if found is None:
                raise click.ClickException(f"no tenant named {tenant!r}")
            yield session, settings, ModelRepository(settings.model_repository), found
            session.commit()  # the command is the unit of work: all of it, or none
    except (DomainError, UnknownModel) as exc:
        raise click.ClickException(getattr(exc, "detail", str(exc))) from None
    finally:
        container.close()


def _show(schedule: Schedule) -> None:
    from app.schedules.representation import ScheduleSchema

    click.echo(json.dumps(ScheduleSchema().dump(schedule)))


def _by_name(session: Session, tenant_id: int, name: str) -> uuid.UUID:
    found = session.scalar(
        select(Schedule.id).where(Schedule.tenant_id == tenant_id, Schedule.name == name)
    )
    if found is None:
        raise click.ClickException(f"no schedule named {name!r}")
    return found


TENANT = click.option("--tenant", required=True, help="The tenant that owns the schedules")


@schedules.command("list")
@TENANT
def list_command(tenant: str) -> None:
    """One JSON line per schedule."""
    from app.schedules import service

    with _context(tenant) as (session, _settings, _models, tenant_id):
        for schedule in service.list_schedules(session, tenant_id):
            _show(schedule)


@schedules.command("add")
@TENANT
@click.option("--name", required=True)
@click.option("--cron", required=True, help="e.g. '0 3 * * *' (03:00 every day)")
@click.option("--timezone", default="UTC", show_default=True, help="IANA time zone")
@click.option("--model", required=True)
@click.option("--version", default=None, help="Default: the newest")
@click.option("--file-id", type=click.UUID, help="Input: an uploaded file")
@click.option("--input-path", help="Input: a file or folder in the tenant's data area")
@click.option("--output-path", help="Folder of the data area the results are written to")
@click.option("--paused", is_flag=True)
def add_command(tenant: str, **options: Any) -> None:
    """Add a schedule; prints it as JSON."""
    from app.schedules import service

    spec = {k: v for k, v in options.items() if k not in ("file_id", "input_path", "output_path")}
    spec["input"] = {"file_id": options["file_id"], "path": options["input_path"]}
    spec["output"] = options["output_path"]
    with _context(tenant) as (session, settings, models, tenant_id):
        _show(service.create(session, models, settings, tenant_id, spec))


def _set_paused(tenant: str, name: str, paused: bool) -> None:
    from app.schedules import service

    with _context(tenant) as (session, settings, models, tenant_id):
        schedule_id = _by_name(session, tenant_id, name)
        changes = {"paused": paused}
        _show(service.update_schedule(session, models, settings, tenant_id, schedule_id, changes))


@schedules.command("pause")
@TENANT
@click.argument("name")
def pause_command(tenant: str, name: str) -> None:
    """Stop firing NAME until resumed."""
    _set_paused(tenant, name, True)


@schedules.command("resume")
@TENANT
@click.argument("name")
def resume_command(tenant: str, name: str) -> None:
    """Fire NAME again, from its next tick (missed ticks are not run)."""
    _set_paused(tenant, name, False)


@schedules.command("delete")
@TENANT
@click.argument("name")
def delete_command(tenant: str, name: str) -> None:
    """Delete NAME; its runs stay as batches."""
    from app.schedules import service

    with _context(tenant) as (session, _settings, _models, tenant_id):
        service.delete(session, tenant_id, _by_name(session, tenant_id, name))
    click.echo(json.dumps({"deleted": name}))


@schedules.command("runs")
@TENANT
@click.argument("name")
@click.option("--limit", default=20, show_default=True)
def runs_command(tenant: str, name: str, limit: int) -> None:
    """NAME's runs, newest first, one JSON line each (the batch's status and rows)."""
    from app.schedules import service

    with _context(tenant) as (session, _settings, _models, tenant_id):
        for batch in service.runs(session, tenant_id, _by_name(session, tenant_id, name), limit):
            click.echo(json.dumps({
                "batch_id": str(batch.id), "scheduled_for": batch.scheduled_for.isoformat()
                if batch.scheduled_for else None, "status": batch.status, "rows": batch.rows,
                "error": batch.error_message,
            }))  # fmt: skip
