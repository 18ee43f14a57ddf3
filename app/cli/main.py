"""The command line: one click group over the commands of this package, each going
through the container's operations. `manage.py` is a thin file over it. The
benchmark's command is loaded only when it runs: the benchmark (bench/, with
what bench/requirements.txt installs) is not part of the shipped service."""

from __future__ import annotations

import importlib
import logging

import click

from app.cli import models, running, schedules, streams, submit, tenants
from app.observability import logs
from app.platform.settings import Settings

# name: (where the command is, its help as `--help` lists it)
LAZY = {
    "bench": (
        "bench.cli:bench",
        "Benchmark this service against raw ONNX Runtime, a bare Celery round trip, the "
        "textbook Flask + Celery design, BentoML tasks and a bare Flask + ONNX Runtime sync "
        "endpoint, each in turn on this machine (see bench/README.md).",
    ),
}


class LazyGroup(click.Group):
    """A group whose LAZY commands are imported only when one is run: listed with
    their help, resolved to the real command at run time."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted([*super().list_commands(ctx), *LAZY])

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in LAZY:  # what `--help` lists: a stand-in with the command's help
            return click.Command(cmd_name, help=LAZY[cmd_name][1])
        return super().get_command(ctx, cmd_name)

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        name, command, rest = super().resolve_command(ctx, args)
        if name in LAZY:
            module, attribute = LAZY[name][0].split(":")
            command = getattr(importlib.import_module(module), attribute)
        return name, command, rest


@click.group(cls=LazyGroup)
def cli() -> None:
    if Settings.from_env().log_format == "json":  # as the service's own processes log
        logs.setup(logging.INFO, "json")
    else:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    logging.getLogger("alembic.runtime.plugins").setLevel(logging.WARNING)


for module in (running, tenants, models):
    for command in module.COMMANDS:
        cli.add_command(command)
cli.add_command(submit.submit)
cli.add_command(schedules.schedules)
cli.add_command(streams.streams)
