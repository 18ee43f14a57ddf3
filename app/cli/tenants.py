"""Commands on tenants and their keys: create-api-key, revoke-api-key,
list-api-keys, rotate-webhook-secret, tenants list|set. The tenant operations
do the work, each command one unit of work."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import click

from app.cli.context import command


@click.command("create-api-key")
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
    if operator == (tenant is not None):
        raise click.UsageError("give either --tenant NAME or --operator")
    expires_at = None
    if expires_in_days is not None:
        expires_at = datetime.now(UTC) + timedelta(days=expires_in_days)
    with command() as made:
        if operator:
            key = made.tenants.create_operator_key(expires_at)
        else:
            creds = made.tenants.create_api_key(str(tenant), expires_at)
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


@click.command("revoke-api-key")
@click.option("--prefix", help="The key's first 10 (or more) characters, or the whole key")
@click.option("--tenant", help="Revoke every key of this tenant")
def revoke_api_key(prefix: str | None, tenant: str | None) -> None:
    """Revoke a key, or all of a tenant's; running APIs refuse it within seconds."""
    try:
        with command() as made:
            revoked = made.tenants.revoke_api_keys(prefix=prefix, tenant=tenant)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    if not revoked:
        raise click.ClickException("no active key matched")
    click.echo(json.dumps({"revoked": revoked}))


@click.command("list-api-keys")
@click.option("--tenant", help="Only this tenant's keys")
def list_api_keys(tenant: str | None) -> None:
    """Every key's prefix, kind, tenant, creation, expiry and revocation (JSON lines)."""
    with command() as made:
        rows = made.tenants.list_api_keys(tenant)
    for row in rows:
        click.echo(json.dumps(row))


@click.group()
def tenants() -> None:
    """Tenants and their quotas (jobs in flight, submits a second, batch rows a
    day, bytes stored, highest priority)."""


@tenants.command("list")
@click.argument("name", required=False)
def tenants_list(name: str | None) -> None:
    """Every tenant (or NAME) with its own quotas; null: the TENANT_* default."""
    with command() as made:
        rows = made.tenants.describe(name)
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
@click.option("--max-tokens-per-minute", help="Tokens its generations take a minute")
def tenants_set(name: str, **quotas: str | None) -> None:
    """Set quotas of tenant NAME: a number, or `default` for the TENANT_* setting.
    Running API processes apply them within a few seconds."""
    changes = {}
    try:
        changes = {q: _quota(v) for q, v in quotas.items() if v is not None}
    except ValueError as exc:
        raise click.UsageError(f"a quota is a number or `default`: {exc}") from None
    if not changes:
        raise click.UsageError("give at least one quota to set")
    try:
        with command() as made:
            row = made.tenants.set_quotas(name, changes)
    except (LookupError, ValueError) as exc:
        raise click.ClickException(str(exc).strip("'\"")) from None
    click.echo(json.dumps(row))


@click.command("rotate-webhook-secret")
@click.option("--tenant", required=True)
@click.option(
    "--overlap-hours",
    default=24.0,
    show_default=True,
    help="How long the old secret keeps signing too",
)
def rotate_webhook_secret(tenant: str, overlap_hours: float) -> None:
    """Give TENANT a new webhook secret; both sign deliveries during the overlap."""
    with command() as made:
        secret = made.tenants.rotate_webhook_secret(tenant, overlap_hours)
    click.echo(
        json.dumps(
            {
                "tenant": tenant,
                "webhook_secret": secret,
                "previous_secret_valid_hours": overlap_hours,
            }
        )
    )


COMMANDS = (create_api_key, revoke_api_key, list_api_keys, rotate_webhook_secret, tenants)
