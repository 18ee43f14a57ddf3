#!/usr/bin/env python
"""The service's command line: up, worker, grpc, db, create-api-key, models, schedules,
streams, bench."""

from __future__ import annotations

import functools
import json
import logging
import os
from pathlib import Path
from typing import Any

import click

from app.cli.schedules import schedules as schedules_command
from app.cli.streams import streams as streams_command
from app.container import Container
from app.observability import logs
from app.platform.settings import Settings
from bench.cli import bench as bench_command


@functools.cache
def _container() -> Container:
    """The command's services, built once (see app.container)."""
    return Container.from_env()


def _settings() -> Settings:
    return _container().settings


@click.group()
def cli() -> None:
    if Settings.from_env().log_format == "json":  # as the service's own processes log
        logs.setup(logging.INFO, "json")
    else:
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
    from app.cli.launcher import Launcher

    Launcher(
        Settings.from_env(),
        host=host,
        port=port,
        flower_port=flower_port,
        worker_concurrency=concurrency,
    ).run()


@cli.command(context_settings={"ignore_unknown_options": True})
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


@cli.command()
def grpc() -> None:
    """Run the gRPC door (KServe v2 / Triton's GRPCInferenceService) on
    GRPC_HOST:GRPC_PORT until SIGTERM or Ctrl-C (`make run` starts it)."""
    from app.grpc.__main__ import main

    main()


@cli.group()
def db() -> None:
    """Database schema (Alembic)."""


@db.command("upgrade")
def db_upgrade() -> None:
    """Apply every migration."""
    from app.platform.migrate import upgrade

    upgrade(_settings().database_url)
    click.echo("database is at the latest migration")


@db.command("revision")
@click.option("-m", "--message", required=True)
def db_revision(message: str) -> None:
    """Write a new migration from the difference between the models and the database."""
    from alembic import command

    from app.platform.migrate import alembic_config

    command.revision(alembic_config(_settings().database_url), message, autogenerate=True)


@cli.command("create-api-key")
@click.option("--tenant", help="Tenant name; created if new")
@click.option("--operator", is_flag=True, help="An operator key (model repository routes)")
@click.option(
    "--expires-in-days",
    type=click.FloatRange(min=0, min_open=True, max=36500),
    help="The key stops working after this many days (default: until revoked)",
)
@click.option("--json", "as_json", is_flag=True, help="Print {tenant, api_key, webhook_secret}")
def create_api_key(
    tenant: str | None, operator: bool, expires_in_days: float | None, as_json: bool
) -> None:
    """Create an API key for TENANT, or an operator key. The key is printed once
    and stored hashed."""
    from datetime import UTC, datetime, timedelta

    from app.tenancy.keys import create_api_key as create
    from app.tenancy.keys import create_operator_key

    if operator == (tenant is not None):
        raise click.UsageError("give either --tenant NAME or --operator")
    expires_at = None
    if expires_in_days is not None:
        expires_at = datetime.now(UTC) + timedelta(days=expires_in_days)
    database = _container().database
    with database.sessionmaker() as session:
        if operator:
            key = create_operator_key(session, expires_at=expires_at)
        else:
            creds = create(session, str(tenant), expires_at=expires_at)
    database.engine.dispose()
    if operator:
        shown = {"kind": "operator", "api_key": key,
                 "expires_at": expires_at.isoformat() if expires_at else None}  # fmt: skip
        click.echo(json.dumps(shown) if as_json else f"operator key: {key}\n(not shown again)")
        return
    expiry = creds.expires_at.isoformat() if creds.expires_at else None
    if as_json:  # {"tenant", "api_key", "webhook_secret"}, and "expires_at" for a key that expires
        shown = {"tenant": creds.tenant, "api_key": creds.api_key,
                 "webhook_secret": creds.webhook_secret}  # fmt: skip
        click.echo(json.dumps(shown | ({"expires_at": expiry} if expiry else {})))
    else:
        click.echo(
            f"tenant:         {creds.tenant}\napi key:        {creds.api_key}\n"
            f"webhook secret: {creds.webhook_secret}\nexpires:        {expiry or 'never'}\n"
            "(the key is not shown again)"
        )


@cli.command("revoke-api-key")
@click.option("--prefix", help="The key's first 10 (or more) characters, or the whole key")
@click.option("--tenant", help="Revoke every key of this tenant")
def revoke_api_key(prefix: str | None, tenant: str | None) -> None:
    """Revoke a key, or all of a tenant's; running APIs refuse it within seconds."""
    from app.tenancy.keys import revoke_api_keys

    database = _container().database
    try:
        with database.sessionmaker() as session:
            revoked = revoke_api_keys(session, prefix=prefix, tenant=tenant)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    finally:
        database.engine.dispose()
    if not revoked:
        raise click.ClickException("no active key matched")
    click.echo(json.dumps({"revoked": revoked}))


@cli.command("list-api-keys")
@click.option("--tenant", help="Only this tenant's keys")
def list_api_keys(tenant: str | None) -> None:
    """Every key's prefix, kind, tenant, creation, expiry and revocation (JSON lines)."""
    from app.tenancy.keys import list_api_keys as listed

    database = _container().database
    with database.sessionmaker() as session:
        rows = listed(session, tenant)
    database.engine.dispose()
    for row in rows:
        click.echo(json.dumps(row))


@cli.command("settings")
@click.option("--write", is_flag=True, help="Put the table in README.md")
def settings_table(write: bool) -> None:
    """Every environment variable the service reads, with its default and what it
    does, as the README's Markdown table (made from app/platform/settings.py)."""
    from app.cli.settings_reference import in_readme, markdown
    from app.platform.settings import ROOT

    table = markdown()
    if not write:
        click.echo(table)
        return
    readme = ROOT / "README.md"
    text = readme.read_text()
    current = in_readme(text)
    if current is None:
        raise click.ClickException("README.md has no settings table markers to replace")
    readme.write_text(text.replace(current, table))
    click.echo("README.md: settings table written")


@cli.group()
def tenants() -> None:
    """Tenants and their quotas (jobs in flight, submits a second, batch rows a
    day, bytes stored, highest priority)."""


@tenants.command("list")
@click.argument("name", required=False)
def tenants_list(name: str | None) -> None:
    """Every tenant (or NAME) with its own quotas; null: the TENANT_* default."""
    from app.tenancy.keys import describe_tenants

    database = _container().database
    with database.sessionmaker() as session:
        rows = describe_tenants(session, name)
    database.engine.dispose()
    if name is not None and not rows:
        raise click.ClickException(f"no tenant named {name!r}")
    for row in rows:
        click.echo(json.dumps(row))


def _quota(value: str) -> float | None:
    return None if value.lower() in ("default", "none") else float(value)


@tenants.command("set")
@click.argument("name")
@click.option("--max-in-flight", help="Jobs queued or running at once")
@click.option("--max-submits-per-second", help="Requests that make work, a second")
@click.option("--max-batch-rows-per-day", help="Batch rows in any 24 hours")
@click.option("--max-stored-bytes", help="Bytes of uploads and batch results kept")
@click.option("--max-priority", help="Highest priority (0-9) its jobs may ask for")
def tenants_set(name: str, **quotas: str | None) -> None:
    """Set quotas of tenant NAME: a number, or `default` for the TENANT_* setting.
    Running API processes apply them within a few seconds."""
    from app.tenancy.keys import set_quotas

    changes = {}
    try:
        changes = {q: _quota(v) for q, v in quotas.items() if v is not None}
    except ValueError as exc:
        raise click.UsageError(f"a quota is a number or `default`: {exc}") from None
    if not changes:
        raise click.UsageError("give at least one quota to set")
    database = _container().database
    try:
        with database.sessionmaker() as session:
            row = set_quotas(session, name, changes)
    except (LookupError, ValueError) as exc:
        raise click.ClickException(str(exc).strip("'\"")) from None
    finally:
        database.engine.dispose()
    click.echo(json.dumps(row))


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
    from app.tenancy.keys import rotate_webhook_secret as rotate

    database = _container().database
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
    from app.repository.bundled import ensure_models

    root = Settings.from_env().model_repository
    built = ensure_models(root, force=force)
    for path in built:
        click.echo(f"built {path}")
    if not built:
        click.echo(f"models already built in {root} (use --force to rebuild)")


@models.command("list")
def models_list() -> None:
    """List every version in the repository: READY, or UNAVAILABLE and why."""
    settings = _settings()
    database = _container().database
    root = settings.model_repository
    statuses = _container().models.index()
    database.engine.dispose()
    for status in statuses:
        where = root / status.name / status.version
        click.echo(f"{status.name}:{status.version}\t{status.state}\t{where}\t{status.reason}")


@models.command("add")
@click.argument("path", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--name", required=True, help="The model's name: [A-Za-z0-9_.-]")
@click.option("--version", default=None, help="Default: one past the highest version, or 1")
@click.option("--force", is_flag=True, help="Replace the version if it exists")
@click.option("--description", default="", help="Written into the card")
@click.option("--tenant", "tenants", multiple=True, help="Only these tenants see it (repeat)")
def models_add(
    path: Path,
    name: str,
    version: str | None,
    force: bool,
    description: str,
    tenants: tuple[str, ...],
) -> None:
    """Check PATH (an .onnx file) with ONNX Runtime, draft its card.json from the
    graph, and place both in MODEL_REPOSITORY/NAME/VERSION/. Running API and
    worker processes serve it within MODEL_STATE_CACHE_SECONDS."""
    from app.errors import DomainError
    from app.repository import control
    from app.repository.registry import ModelRepository

    settings = _settings()
    database = _container().database
    try:
        added = control.add(
            database.engine, ModelRepository(settings.model_repository), path, name, version,
            force=force, description=description, tenants=list(tenants) or None,
        )  # fmt: skip
    except DomainError as exc:
        raise click.ClickException(exc.detail) from None
    finally:
        database.engine.dispose()
    card = added.card
    click.echo(f"{'replaced' if added.replaced else 'added'} {card.ref} at {card.path}")
    for spec in card.inputs:
        click.echo(f"  input  {spec.name} {spec.datatype} {list(spec.shape)}")
    for spec in card.outputs:
        click.echo(f"  output {spec.name} {spec.datatype} {list(spec.shape)}")
    for skipped in added.skipped_outputs:
        click.echo(f"  left out output {skipped}: a job cannot return that type")
    click.echo(f"  batching: max_batch_size {card.batching.max_batch_size}")
    click.echo(f"edit {card.path / 'card.json'} for its description, labels and batching")


@cli.command()
@click.option("--model", required=True, help="The model's name (GET /models)")
@click.option("--version", default=None, help="Default: the newest serving version")
@click.option(
    "--input",
    "input_path",
    required=True,
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help=".npy (a structured array for several inputs) or .json ({input: rows}, or rows)",
)
@click.option("--priority", type=click.IntRange(0, 9), default=None, help="0-9, higher first")
@click.option(
    "--each-row",
    is_flag=True,
    help="A job for each row (POST /jobs/bulk, 1,000 a request); prints one JSON line "
    "each, the job or the problem that refused that row",
)
@click.option("--wait", is_flag=True, help="Wait for the job; exit 1 unless it succeeded")
@click.option("--timeout", type=float, default=None, help="With --wait: give up after seconds")
@click.option("--api-key", envvar="INFERENCE_API_KEY", help="Default: $INFERENCE_API_KEY")
@click.option("--url", envvar="INFERENCE_URL", default="http://127.0.0.1:8000", show_default=True)
def submit(
    model: str,
    version: str | None,
    input_path: Path,
    priority: int | None,
    each_row: bool,
    wait: bool,
    timeout: float | None,
    api_key: str | None,
    url: str,
) -> None:
    """Submit a job over HTTP with the Python client and print it as JSON; a
    single array goes to the model's only input, named from its metadata. With
    --each-row, a job a row, submitted in bulk."""
    import numpy as np
    import requests

    from inference_client import ApiError, Client, WaitTimeout

    if not api_key:
        raise click.UsageError("give --api-key or set INFERENCE_API_KEY")
    if input_path.suffix not in (".npy", ".json"):
        raise click.UsageError("--input must be a .npy or .json file")
    try:
        if input_path.suffix == ".npy":
            array = np.load(input_path, allow_pickle=False)
            names = array.dtype.names
            inputs = {name: array[name] for name in names} if names else array
        else:
            inputs = json.loads(input_path.read_text())
    except ValueError as exc:
        raise click.UsageError(f"cannot read {input_path}: {exc}") from None
    client = Client(url, api_key)
    if each_row:
        try:
            rows = _rows_of(inputs)
        except ValueError as exc:
            raise click.UsageError(f"cannot cut {input_path} into rows: {exc}") from None
        try:
            _submit_rows(client, model, rows, version, priority, wait, timeout)
        finally:
            client.close()
        return
    try:
        job = client.submit(model, inputs, version=version, priority=priority)
        if wait:
            job = client.wait(job.id, timeout=timeout)
    except ApiError as exc:
        raise click.ClickException(f"{exc.status} {exc.title}: {exc.detail}") from None
    except WaitTimeout as exc:
        raise click.ClickException(str(exc)) from None
    except (requests.RequestException, ValueError) as exc:
        raise click.ClickException(str(exc)) from None
    finally:
        client.close()
    click.echo(json.dumps(job.raw, indent=2))
    if wait and not job.succeeded:
        raise SystemExit(1)


def _rows_of(inputs: Any) -> list[Any]:
    """One job's inputs a row: an array or list cut along its first axis; a mapping
    of input names cut together (every input the same number of rows)."""
    if isinstance(inputs, dict):
        counts = {name: len(values) for name, values in inputs.items()}
        if len(set(counts.values())) != 1:
            raise ValueError(f"the inputs have different numbers of rows: {counts}")
        count = next(iter(counts.values()))
        return [{name: values[i : i + 1] for name, values in inputs.items()} for i in range(count)]
    return [inputs[i : i + 1] for i in range(len(inputs))]


def _submit_rows(
    client: Any,
    model: str,
    rows: list[Any],
    version: str | None,
    priority: int | None,
    wait: bool,
    timeout: float | None,
) -> None:
    """Print each row's job (waited for with --wait) or its problem, a JSON line each;
    exit 1 unless every row was accepted (and, with --wait, succeeded)."""
    import requests

    from inference_client import ApiError, Job, WaitTimeout

    try:
        outcomes = client.submit_many(model, rows, version=version, priority=priority)
    except ApiError as exc:
        raise click.ClickException(f"{exc.status} {exc.title}: {exc.detail}") from None
    except (requests.RequestException, ValueError) as exc:
        raise click.ClickException(str(exc)) from None
    ok = True
    for outcome in outcomes:
        if isinstance(outcome, ApiError):
            ok = False
            click.echo(json.dumps(outcome.problem))
            continue
        job = outcome
        if wait:
            try:
                job = client.wait(job.id, timeout=timeout)
            except WaitTimeout as exc:
                job = exc.last if isinstance(exc.last, Job) else job
            ok = ok and job.succeeded
        click.echo(json.dumps(job.raw))
    if not ok:
        raise SystemExit(1)


cli.add_command(bench_command)
cli.add_command(schedules_command)
cli.add_command(streams_command)


if __name__ == "__main__":
    cli()
