"""`python manage.py streams ...`: the stream door's bindings for operators (the same
data-plane operations as /streams), and its consumer process."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import click
from sqlalchemy import select

from app.bindings.tables import StreamBinding
from app.dataplane.requests import BindingFields
from app.errors import DomainError
from app.tenancy.keys import TenantRef
from app.tenancy.tables import Tenant

if TYPE_CHECKING:
    from app.dataplane import DataPlane


@click.group("streams")
def streams() -> None:
    """Stream bindings (a model between an input log and an output log), and the
    consumer that serves them."""


@contextmanager
def _plane(tenant: str) -> Iterator[tuple[DataPlane, TenantRef]]:
    """The data plane and the tenant named `tenant`, in one unit of work."""
    from app.container import Container

    container = Container.from_env()
    try:
        with container.unit_of_work() as session:
            found = session.scalar(select(Tenant.id).where(Tenant.name == tenant))
            if found is None:
                raise click.ClickException(f"no tenant named {tenant!r}")
            yield container.dataplane, TenantRef(found, tenant)
    except DomainError as exc:
        raise click.ClickException(exc.detail) from None
    finally:
        container.close()


def _show(binding: StreamBinding) -> None:
    from app.bindings.representation import BindingSchema

    click.echo(json.dumps(BindingSchema().dump(binding)))


def _find(plane: DataPlane, tenant: TenantRef, which: str) -> uuid.UUID:
    """A binding by its id, or by its input log (short or full name)."""
    try:
        return uuid.UUID(which)
    except ValueError:
        pass
    for binding in plane.list_bindings(tenant):
        if which in (binding.input, binding.input.rsplit(":", 1)[-1]):
            return binding.id
    raise click.ClickException(f"tenant {tenant.name!r} has no binding of input {which!r}")


TENANT = click.option("--tenant", required=True, help="The tenant that owns the bindings")
WHICH = click.argument("binding")


@streams.command("create")
@TENANT
@click.option("--model", required=True)
@click.option("--version", default=None, help="Default: the newest")
@click.option("--input", "input_", required=True, help="The input log's name, e.g. requests")
@click.option("--output", required=True, help="The output log's name, e.g. results")
@click.option("--paused", is_flag=True)
def create_command(
    tenant: str, model: str, version: str | None, input_: str, output: str, paused: bool
) -> None:
    """Bind MODEL to an input and an output log; prints the binding (its full log
    names) as JSON."""
    fields = BindingFields(model=model, version=version, input=input_, output=output,
                           paused=paused)  # fmt: skip
    with _plane(tenant) as (plane, ref):
        _show(plane.create_binding(ref, fields))


@streams.command("list")
@TENANT
def list_command(tenant: str) -> None:
    """One JSON line per binding."""
    with _plane(tenant) as (plane, ref):
        for binding in plane.list_bindings(ref):
            _show(binding)


@streams.command("show")
@TENANT
@WHICH
def show_command(tenant: str, binding: str) -> None:
    """BINDING (its id, or its input log's name) as JSON."""
    with _plane(tenant) as (plane, ref):
        _show(plane.get_binding(ref, _find(plane, ref, binding)))


def _set_paused(tenant: str, binding: str, paused: bool) -> None:
    with _plane(tenant) as (plane, ref):
        _show(plane.update_binding(ref, _find(plane, ref, binding), BindingFields(paused=paused)))


@streams.command("pause")
@TENANT
@WHICH
def pause_command(tenant: str, binding: str) -> None:
    """Stop reading BINDING's input log (its entries wait there) until resumed."""
    _set_paused(tenant, binding, True)


@streams.command("resume")
@TENANT
@WHICH
def resume_command(tenant: str, binding: str) -> None:
    """Read BINDING's input log again, from where it stopped."""
    _set_paused(tenant, binding, False)


@streams.command("delete")
@TENANT
@WHICH
def delete_command(tenant: str, binding: str) -> None:
    """Delete BINDING; its jobs, logs and consumer group stay."""
    with _plane(tenant) as (plane, ref):
        binding_id = _find(plane, ref, binding)
        plane.delete_binding(ref, binding_id)
    click.echo(json.dumps({"deleted": str(binding_id)}))


@streams.command("run")
def run_command() -> None:
    """Run a stream consumer until SIGTERM or Ctrl-C (`make run` starts one). This
    process becomes `python -m app.streams` (same pid, same signals): the door is a
    package beside this one, started, not imported."""
    from app.cli.launcher import streams_command

    args = streams_command()
    os.execv(args[0], args)
