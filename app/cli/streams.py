"""`python manage.py streams ...`: the stream door's bindings for operators (the same
binding operations as /streams), and its consumer process."""

from __future__ import annotations

import json
import os
import uuid

import click

from app.cli.context import for_tenant
from app.container import Container
from app.operations import BindingFields, TenantRef
from app.operations.bindings import BindingSchema, StreamBinding


@click.group("streams")
def streams() -> None:
    """Stream bindings (a model between an input log and an output log), and the
    consumer that serves them."""


def _show(binding: StreamBinding) -> None:
    click.echo(json.dumps(BindingSchema().dump(binding)))


def _find(container: Container, tenant: TenantRef, which: str) -> uuid.UUID:
    """A binding by its id, or by its input log (short or full name)."""
    found = container.bindings.find(tenant, which)
    if found is None:
        raise click.ClickException(f"tenant {tenant.name!r} has no binding of input {which!r}")
    return found


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
    with for_tenant(tenant) as (made, ref):
        _show(made.bindings.create(ref, fields))


@streams.command("list")
@TENANT
def list_command(tenant: str) -> None:
    """One JSON line per binding."""
    with for_tenant(tenant) as (made, ref):
        for binding in made.bindings.list_bindings(ref):
            _show(binding)


@streams.command("show")
@TENANT
@WHICH
def show_command(tenant: str, binding: str) -> None:
    """BINDING (its id, or its input log's name) as JSON."""
    with for_tenant(tenant) as (made, ref):
        _show(made.bindings.get(ref, _find(made, ref, binding)))


def _set_paused(tenant: str, binding: str, paused: bool) -> None:
    with for_tenant(tenant) as (made, ref):
        _show(made.bindings.update(ref, _find(made, ref, binding), BindingFields(paused=paused)))


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
    with for_tenant(tenant) as (made, ref):
        binding_id = _find(made, ref, binding)
        made.bindings.delete(ref, binding_id)
    click.echo(json.dumps({"deleted": str(binding_id)}))


@streams.command("run")
def run_command() -> None:
    """Run a stream consumer until SIGTERM or Ctrl-C (`make run` starts one). This
    process becomes `python -m app.streams` (same pid, same signals): the door is a
    package beside this one, started, not imported."""
    from app.cli.launcher import streams_command

    args = streams_command()
    os.execv(args[0], args)
