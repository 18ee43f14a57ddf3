"""Stream bindings: /streams and `manage.py streams`, tenant isolation, log names."""

from __future__ import annotations

import json
from typing import Any

import pytest
import sqlalchemy as sa
from click.testing import CliRunner
from flask.testing import FlaskClient

from app.bindings import names
from app.bindings.tables import StreamEntry
from app.errors import InvalidRequest
from app.platform.database import Database
from app.platform.settings import Settings
from tests.conftest import TenantAuth, insert_queued_job, make_tenant


def post(client: FlaskClient, tenant: TenantAuth, **body: Any) -> Any:
    return client.post("/streams", json=body, headers=tenant.headers)


def test_a_binding_is_made_read_changed_and_deleted(
    client: FlaskClient, tenant: TenantAuth, settings: Settings
) -> None:
    created = post(client, tenant, model="digits", input="requests", output="results")
    assert created.status_code == 201, created.json
    binding = created.json
    prefix = f"{settings.streams_prefix}:{tenant.name}:"
    assert created.headers["Location"] == f"/streams/{binding['id']}"
    assert binding["input"] == prefix + "requests" and binding["output"] == prefix + "results"
    assert binding["dead_letter"] == prefix + "requests.dead"
    assert binding["model"] == "digits" and binding["version"] is None
    assert binding["paused"] is False
    url = f"/streams/{binding['id']}"
    assert client.get(url, headers=tenant.headers).json == binding
    assert client.get("/streams", headers=tenant.headers).json["items"] == [binding]

    changed = client.patch(url, json={"paused": True, "output": prefix + "scored", "version": "1"},
                           headers=tenant.headers)  # fmt: skip
    assert changed.status_code == 200, changed.json
    assert changed.json["paused"] is True and changed.json["output"] == prefix + "scored"
    assert changed.json["version"] == "1" and changed.json["input"] == binding["input"]

    moved = client.patch(url, json={"input": "elsewhere"}, headers=tenant.headers)
    assert moved.status_code == 422  # the input log is the binding itself
    assert client.delete(url, headers=tenant.headers).status_code == 204
    assert client.get(url, headers=tenant.headers).status_code == 404


def test_another_tenant_can_neither_see_nor_bind_a_tenants_logs(
    client: FlaskClient, tenant: TenantAuth, database: Database, settings: Settings
) -> None:
    binding = post(client, tenant, model="digits", input="mine", output="mine-out").json
    other = make_tenant(database)
    url = f"/streams/{binding['id']}"
    assert client.get(url, headers=other.headers).status_code == 404
    assert client.patch(url, json={"paused": True}, headers=other.headers).status_code == 404
    assert client.delete(url, headers=other.headers).status_code == 404
    assert client.get("/streams", headers=other.headers).json["items"] == []

    # Naming the first tenant's full log names: refused, never bound under its prefix.
    for field in ("input", "output"):
        body = {"model": "digits", "input": "theirs", "output": "theirs-out",
                field: binding[field]}  # fmt: skip
        refused = post(client, other, **body)
        assert refused.status_code == 422, refused.json
        assert refused.headers["Content-Type"] == "application/problem+json"
        assert "is not a log of yours" in refused.json["detail"]
    # Its own full name is accepted, as GET shows it.
    own = f"{settings.streams_prefix}:{other.name}:theirs"
    made = post(client, other, model="digits", input=own, output="theirs-out")
    assert made.status_code == 201 and made.json["input"] == own


@pytest.mark.parametrize(
    ("body", "status", "problem"),
    [
        ({"model": "nope", "input": "a", "output": "b"}, 404, "unknown-model"),
        ({"model": "digits", "input": "a b", "output": "b"}, 422, "validation-error"),
        ({"model": "digits", "input": "a", "output": "a"}, 422, "validation-error"),
        ({"model": "digits", "input": "a.dead", "output": "b"}, 422, "validation-error"),
        ({"model": "digits", "input": "a*", "output": "b"}, 422, "validation-error"),
        ({"model": "digits", "output": "b"}, 422, "validation-error"),
    ],
)
def test_a_wrong_binding_is_refused_with_a_problem(
    client: FlaskClient, tenant: TenantAuth, body: dict[str, Any], status: int, problem: str
) -> None:
    refused = post(client, tenant, **body)
    assert refused.status_code == status, refused.json
    assert refused.json["type"] == f"/problems/{problem}"
    assert refused.json["detail"]


def test_an_input_log_is_bound_once_and_outputs_never_feed_inputs(
    client: FlaskClient, tenant: TenantAuth
) -> None:
    assert post(client, tenant, model="digits", input="in", output="out").status_code == 201
    twice = post(client, tenant, model="digits", input="in", output="other")
    assert twice.status_code == 409 and twice.json["type"] == "/problems/conflict"
    loop = post(client, tenant, model="digits", input="out", output="elsewhere")
    assert loop.status_code == 422 and "may not be another's input" in loop.json["detail"]


def test_a_tenant_prefix_is_never_the_prefix_of_another_tenants() -> None:
    """`~streams:acme:*` must not reach the logs of a tenant named `acme:x`, nor may
    a glob character of a name reach an ACL pattern."""
    acme = names.tenant_prefix("streams", "acme")
    tricky = names.full_name("streams", "acme:x", "requests", "input")
    assert acme == "streams:acme:" and not tricky.startswith(acme)
    assert tricky == "streams:acme%3Ax:requests"
    globbing = names.tenant_prefix("streams", "a*[b]?\\%")
    assert not set("*?[]\\") & set(globbing) and globbing.count(":") == 2
    with pytest.raises(InvalidRequest, match="is not a log of yours"):
        names.full_name("streams", "acme", "streams:acme:x:requests", "input")


def test_the_cli_manages_the_same_bindings(
    client: FlaskClient, tenant: TenantAuth, settings: Settings
) -> None:
    from app.cli.streams import streams

    env = {"DATABASE_URL": settings.database_url, "REDIS_URL": settings.redis_url,
           "MODEL_REPOSITORY": str(settings.model_repository),
           "STREAMS_PREFIX": settings.streams_prefix}  # fmt: skip
    cli = CliRunner()

    def run(*args: str) -> Any:
        done = cli.invoke(streams, [args[0], "--tenant", tenant.name, *args[1:]], env=env)
        assert done.exit_code == 0, done.output
        return [json.loads(line) for line in done.output.splitlines()]

    [made] = run("create", "--model", "digits", "--input", "cli-in", "--output", "cli-out")
    assert made["input"] == f"{settings.streams_prefix}:{tenant.name}:cli-in"
    assert client.get("/streams", headers=tenant.headers).json["items"] == [made]
    assert run("list") == [made]
    assert run("show", "cli-in") == [made] and run("show", made["id"]) == [made]
    [paused] = run("pause", "cli-in")
    assert paused["paused"] is True
    [resumed] = run("resume", made["input"])
    assert resumed["paused"] is False
    wrong = cli.invoke(streams, ["create", "--tenant", tenant.name, "--model", "nope",
                                 "--input", "x", "--output", "y"], env=env)  # fmt: skip
    assert wrong.exit_code != 0 and "model 'nope'" in wrong.output
    assert run("delete", "cli-in") == [{"deleted": made["id"]}]
    assert client.get("/streams", headers=tenant.headers).json["items"] == []


def test_a_binding_with_results_still_to_append_is_not_deleted(
    client: FlaskClient, tenant: TenantAuth, database: Database
) -> None:
    binding = post(client, tenant, model="digits", input="busy", output="busy-out").json
    job_id = insert_queued_job(database, tenant.id)
    with database.engine.begin() as conn:
        row = {"binding_id": binding["id"], "entry_id": "1-0", "request_id": "r1"}
        conn.execute(sa.insert(StreamEntry).values(**row, job_id=job_id))
    url = f"/streams/{binding['id']}"
    refused = client.delete(url, headers=tenant.headers)
    assert refused.status_code == 409, refused.json
    assert refused.json["unpublished"] == 1 and "pause it" in refused.json["detail"]
    with database.engine.begin() as conn:
        conn.execute(sa.update(StreamEntry).values(published_at=sa.func.now()))
    assert client.delete(url, headers=tenant.headers).status_code == 204
