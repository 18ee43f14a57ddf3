"""Commands that run the service or set it up: up, worker, grpc, db, settings."""

from __future__ import annotations

import os

import click

from app.cli.context import container
from app.platform.settings import Settings


@click.command()
@click.option("--port", envvar="PORT", default=8000, show_default=True, help="API port")
@click.option("--host", envvar="HOST", default="127.0.0.1", show_default=True)
@click.option("--flower-port", envvar="FLOWER_PORT", default=5555, show_default=True)
@click.option(
    "--concurrency",
    envvar="WORKER_CONCURRENCY",
    default=2,
    show_default=True,
    help="Worker processes",
)
def up(port: int, host: str, flower_port: int, concurrency: int) -> None:
    """Run the whole service (API, worker, beat, Flower) until Ctrl-C."""
    from app.cli.launcher import Launcher

    Launcher(
        Settings.from_env(),
        host=host,
        port=port,
        flower_port=flower_port,
        worker_concurrency=concurrency,
    ).run()


@click.command(context_settings={"ignore_unknown_options": True})
@click.option(
    "--concurrency",
    envvar="WORKER_CONCURRENCY",
    type=int,
    default=None,
    help="Worker processes. Default: one per CUDA_DEVICES entry, else 1 (one per GPU)",
)
@click.option("--hostname", default="worker@%h", show_default=True, help="Unique per worker")
@click.argument("celery_args", nargs=-1, type=click.UNPROCESSED)
def worker(concurrency: int | None, hostname: str, celery_args: tuple[str, ...]) -> None:
    """Run an inference worker on the queues of WORKER_QUEUES (default: the default
    model queue and JOBS_QUEUE); further arguments go to `celery worker`."""
    from app.cli.launcher import worker_command

    settings = Settings.from_env()
    processes = concurrency or max(1, len(settings.cuda_devices))
    queues = ",".join(settings.inference_queues)
    argv = worker_command(queues, processes, hostname, *celery_args)
    os.execv(argv[0], argv)  # celery takes this process: signals reach it directly


@click.command()
def grpc() -> None:
    """Run the gRPC door (KServe v2 / Triton's GRPCInferenceService) on
    GRPC_HOST:GRPC_PORT until SIGTERM or Ctrl-C (`make run` starts it)."""
    # This process becomes `python -m app.grpc` (same pid, same signals): the door is
    # a package beside this one, started, not imported.
    from app.cli.launcher import grpc_command

    argv = grpc_command()
    os.execv(argv[0], argv)


@click.group()
def db() -> None:
    """Database schema (Alembic)."""


@db.command("upgrade")
def db_upgrade() -> None:
    """Apply every migration."""
    from app.platform.migrate import upgrade

    upgrade(container().settings.database_url)
    click.echo("database is at the latest migration")


@db.command("revision")
@click.option("-m", "--message", required=True)
def db_revision(message: str) -> None:
    """Write a new migration from the difference between the models and the database."""
    from alembic import command

    from app.platform.migrate import alembic_config

    command.revision(alembic_config(container().settings.database_url), message, autogenerate=True)


@click.command("settings")
def settings_table() -> None:
    """Every environment variable the service reads, with its default and what it
    does, as a Markdown table (made from app/platform/settings/; the site's
    settings reference is this table)."""
    from app.cli.settings_reference import markdown

    click.echo(markdown())


COMMANDS = (up, worker, grpc, db, settings_table)
