"""`python manage.py schedules ...`: the same services as /schedules, for operators."""

from __future__ import annotations

import json
import uuid
from typing import Any, cast

import click

from app.cli.context import for_tenant
from app.container import Container
from app.operations import ScheduleFields, TenantRef
from app.operations.schedules import Schedule, ScheduleSchema


@click.group("schedules")
def schedules() -> None:
    """Batch schedules (cron runs of a model over a file or a data folder)."""


def _show(schedule: Schedule) -> None:
    click.echo(json.dumps(ScheduleSchema().dump(schedule)))


def _by_name(container: Container, tenant: TenantRef, name: str) -> uuid.UUID:
    found = container.schedules.named(tenant, name)
    if found is None:
        raise click.ClickException(f"no schedule named {name!r}")
    return found.id


TENANT = click.option("--tenant", required=True, help="The tenant that owns the schedules")


@schedules.command("list")
@TENANT
def list_command(tenant: str) -> None:
    """One JSON line per schedule."""
    with for_tenant(tenant) as (made, ref):
        for schedule in made.schedules.list_schedules(ref):
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
    spec = {k: v for k, v in options.items() if k not in ("file_id", "input_path", "output_path")}
    spec["input"] = {"file_id": options["file_id"], "path": options["input_path"]}
    spec["output"] = options["output_path"]
    with for_tenant(tenant) as (made, ref):
        _show(made.schedules.create(ref, cast(ScheduleFields, spec)))


def _set_paused(tenant: str, name: str, paused: bool) -> None:
    with for_tenant(tenant) as (made, ref):
        schedule_id = _by_name(made, ref, name)
        _show(made.schedules.update(ref, schedule_id, ScheduleFields(paused=paused)))


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
    with for_tenant(tenant) as (made, ref):
        made.schedules.delete(ref, _by_name(made, ref, name))
    click.echo(json.dumps({"deleted": name}))


@schedules.command("runs")
@TENANT
@click.argument("name")
@click.option("--limit", default=20, show_default=True)
def runs_command(tenant: str, name: str, limit: int) -> None:
    """NAME's runs, newest first, one JSON line each (the batch's status and rows)."""
    with for_tenant(tenant) as (made, ref):
        for batch in made.schedules.runs(ref, _by_name(made, ref, name), limit):
            click.echo(json.dumps({
                "batch_id": str(batch.id), "scheduled_for": batch.scheduled_for.isoformat()
                if batch.scheduled_for else None, "status": batch.status, "rows": batch.rows,
                "error": batch.error_message,
            }))  # fmt: skip
