#!/usr/bin/env python
"""The service's command line: up, db, create-api-key, models, schedules, bench."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import click

from app.config import Settings
from app.embedded import resolve_urls
from app.schedules.cli import schedules as schedules_command
from bench.cli import bench as bench_command


def _settings() -> Settings:
    return resolve_urls(Settings.from_env())


@click.group()
def cli() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    logging.getLogger("alembic.runtime.plugins").setLevel(logging.WARNING)


@cli.command()
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
    from app.launcher import Launcher

    Launcher(
        Settings.from_env(),
        host=host,
        port=port,
        flower_port=flower_port,
        worker_concurrency=concurrency,
    ).run()


@cli.group()
def db() -> None:
    """Database schema (Alembic)."""


@db.command("upgrade")
def db_upgrade() -> None:
    """Apply every migration."""
    from app.db.migrate import upgrade

    upgrade(_settings().database_url)
    click.echo("database is at the latest migration")


@db.command("revision")
@click.option("-m", "--message", required=True)
def db_revision(message: str) -> None:
    """Write a new migration from the difference between the models and the database."""
    from alembic import command

    from app.db.migrate import alembic_config

    command.revision(alembic_config(_settings().database_url), message, autogenerate=True)


@cli.command("create-api-key")
@click.option("--tenant", required=True, help="Tenant name; created if new")
@click.option("--json", "as_json", is_flag=True, help="Print {tenant, api_key, webhook_secret}")
def create_api_key(tenant: str, as_json: bool) -> None:
    """Create an API key for TENANT. The key is printed once and stored hashed."""
    from app.db.session import Database
    from app.tenants import create_api_key as create

    database = Database(_settings().database_url)
    with database.sessionmaker() as session:
        creds = create(session, tenant)
    database.engine.dispose()
    if as_json:
        click.echo(json.dumps(creds.__dict__))
    else:
        click.echo(
            f"tenant:         {creds.tenant}\napi key:        {creds.api_key}\n"
            f"webhook secret: {creds.webhook_secret}\n(the key is not shown again)"
        )


@cli.command("rotate-webhook-secret")
@click.option("--tenant", required=True)
@click.option(
    "--overlap-hours",
    default=24.0,
    show_default=True,
    help="How long the old secret keeps signing too",
)
def rotate_webhook_secret(tenant: str, overlap_hours: float) -> None:
    """Give TENANT a new webhook secret; both sign deliveries during the overlap."""
    from app.db.session import Database
    from app.tenants import rotate_webhook_secret as rotate

    database = Database(_settings().database_url)
    with database.sessionmaker() as session:
        secret = rotate(session, tenant, overlap_hours)
    database.engine.dispose()
    click.echo(
        json.dumps(
            {
                "tenant": tenant,
                "webhook_secret": secret,
                "previous_secret_valid_hours": overlap_hours,
            }
        )
    )


@cli.group()
def models() -> None:
    """The model repository."""


@models.command("build")
@click.option("--force", is_flag=True, help="Rebuild even if the files exist")
def models_build(force: bool) -> None:
    """Build the bundled models (offline, from packages) into MODEL_REPOSITORY."""
    from app.inference.builders import ensure_models

    root = Settings.from_env().model_repository
    built = ensure_models(root, force=force)
    for path in built:
        click.echo(f"built {path}")
    if not built:
        click.echo(f"models already built in {root} (use --force to rebuild)")


@models.command("list")
def models_list() -> None:
    """List the models and versions in the repository."""
    from app.inference.repository import ModelRepository

    for card in ModelRepository(Settings.from_env().model_repository).all():
        click.echo(f"{card.ref}\t{Path(card.onnx_path)}")


cli.add_command(bench_command)
cli.add_command(schedules_command)


if __name__ == "__main__":
    cli()
