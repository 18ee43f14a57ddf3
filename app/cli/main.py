"""The command line: one click group over the commands of this package, each going
through the container's operations. `manage.py` is a thin file over it. The
benchmark's command is loaded only when it runs: the benchmark (bench/, with
what bench/requirements.txt installs) is not part of the shipped service."""

from __future__ import annotations

import importlib
import importlib.metadata
import logging

import click

from app.cli import models, running, schedules, streams, submit, tenants
from app.observability import logs
from app.platform.settings import ROOT, Settings

# Commands that read files lying at the checkout's root, which `pip install .` does
# not carry: alembic.ini and migrations/ (db, up), the bundled models' cards (up),
# bench/ (bench). Installed, ROOT is site-packages and they say so instead.
CHECKOUT_ONLY = ("up", "db", "bench")

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
        if name in CHECKOUT_ONLY and not in_checkout():
            raise click.ClickException(
                f"`{name}` runs from a checkout of the service (python manage.py {name}): it "
                f"needs alembic.ini, migrations/, models/ and bench/, which an installed package "
                f"does not carry (looked in {ROOT})"
            )
        if name in LAZY:
            module, attribute = LAZY[name][0].split(":")
            command = getattr(importlib.import_module(module), attribute)
        return name, command, rest


def in_checkout() -> bool:
    """Whether the code runs from a checkout (or the image's copy of one), where
    ROOT holds manage.py beside app/; an installed package's ROOT is site-packages."""
    return (ROOT / "manage.py").is_file() and (ROOT / "alembic.ini").is_file()


def version() -> str:
    """The installed distribution's version; from a checkout that is not installed,
    app.__version__, which the distribution's version is read from. (`app` is this
    package's parent, already loaded; read by name, since a static `from app import`
    reads to lint-imports as the CLI importing the Flask factory beside it.)"""
    try:
        return importlib.metadata.version("inference-jobs")
    except importlib.metadata.PackageNotFoundError:
        return str(importlib.import_module("app").__version__)


@click.group(cls=LazyGroup)
@click.version_option(version(), "--version", "-V", prog_name="inference-jobs")
def cli() -> None:
    """Inference job service: submit inputs over HTTP (or gRPC, or Redis streams) as
    jobs that Celery workers run on ONNX Runtime models, state kept in PostgreSQL.

    \b
    Most used:
      up                      the whole service on this machine (API :8000, workers,
                              beat, Flower), embedded PostgreSQL and Redis if unset
      models build | list     build the bundled models; list the repository
      create-api-key --tenant NAME
      submit --model digits --input rows.npy --wait
      db upgrade              the schema (Alembic migrations)
      worker | grpc | streams run
                              one process of the service, as docker-compose.yml runs

    Settings come from the environment (`settings` lists them). Run from a checkout
    (python manage.py ...) or installed (inference ...); up, db and bench need a checkout.
    """
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
