"""Users' own models: added with `manage.py models add` or the operator's PUT,
served by the running API and worker without a restart; load, unload, version
policy, tenant grants, and broken files refused while other models serve."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
import sqlalchemy as sa
from click.testing import CliRunner
from flask import Flask
from flask.testing import FlaskClient

from app.platform.database import Database
from app.platform.settings import ROOT, Settings
from app.tenancy.keys import create_operator_key
from app.tenancy.tables import Tenant
from app.web.context import container_of
from manage import cli
from tests.conftest import (
    TenantAuth,
    WorkerProcess,
    insert_queued_job,
    job_run,
    make_tenant,
    service_env,
    wait_for_job,
)
from tests.support import FakeClock, execute, wait_until

ROWS = [[5.1, 3.5, 1.4, 0.2], [6.7, 3.0, 5.2, 2.3]]


@pytest.fixture(scope="module")
def iris_onnx(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small scikit-learn classifier exported with skl2onnx, as a user would."""
    from skl2onnx import to_onnx
    from sklearn.datasets import load_iris
    from sklearn.linear_model import LogisticRegression

    x, y = load_iris(return_X_y=True)
    model = LogisticRegression(max_iter=500).fit(x.astype(np.float32), y)
    onx = to_onnx(model, x[:1].astype(np.float32), options={"zipmap": False})
    path = tmp_path_factory.mktemp("user") / "model.onnx"
    path.write_bytes(onx.SerializeToString())
    return path


@pytest.fixture
def operator(database: Database) -> dict[str, str]:
    with database.sessionmaker.begin() as session:
        return {"Authorization": f"Bearer {create_operator_key(session)}"}


def fresh_name() -> str:
    return f"user-{uuid.uuid4().hex[:8]}"


def tenant_name(database: Database, tenant: TenantAuth) -> str:
    with database.sessionmaker() as session:
        name = session.scalar(sa.select(Tenant.name).where(Tenant.id == tenant.id))
    assert name is not None
    return name


def cli_add(settings: Settings, *args: str) -> Any:
    """`manage.py models add` in this process, against this run's settings."""
    env = service_env(settings)
    return CliRunner().invoke(cli, ["models", "add", *args], env=env, catch_exceptions=False)


def clocked(make_app: Callable[..., Flask], clock: FakeClock) -> FlaskClient:
    """A client of an API process of its own, whose model states are looked at
    again when `clock` moves on by MODEL_STATE_CACHE_SECONDS."""
    return make_app(clock=clock).test_client()


def listed(client: FlaskClient, name: str, headers: dict[str, str] | None = None) -> bool:
    models = client.get("/models", headers=headers or {}).json["models"]
    return any(m["name"] == name for m in models)


def run_job(
    client: FlaskClient, auth: dict[str, str], name: str, version: str | None = None
) -> dict[str, Any]:
    body: dict[str, Any] = {"model": name, "inputs": {"X": ROWS}}
    if version is not None:
        body["version"] = version
    return job_run(client, auth, body, timeout=30)


def direct(path: Path) -> list[Any]:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {"X": np.array(ROWS, dtype=np.float32)})


def put(
    client: FlaskClient, headers: dict[str, str], name: str, version: str, data: bytes, query=""
) -> Any:
    return client.put(
        f"/v2/repository/models/{name}/versions/{version}{query}",
        data=data,
        headers={**headers, "Content-Type": "application/octet-stream"},
    )


def test_models_add_serves_jobs_through_the_running_worker(
    settings: Settings, make_app: Callable[..., Flask], clock: FakeClock, auth: dict[str, str],
    worker: WorkerProcess, iris_onnx: Path,
) -> None:  # fmt: skip
    client = clocked(make_app, clock)
    name = fresh_name()
    added = subprocess.run(
        [sys.executable, "manage.py", "models", "add", str(iris_onnx), "--name", name],
        cwd=ROOT, env=service_env(settings), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert added.returncode == 0, added.stderr
    assert f"added {name}:1" in added.stdout
    card = json.loads((settings.model_repository / name / "1" / "card.json").read_text())
    assert card["inputs"] == [{"name": "X", "datatype": "FP32", "shape": [-1, 4]}]
    assert card["outputs"] == [
        {"name": "label", "datatype": "INT64", "shape": [-1]},
        {"name": "probabilities", "datatype": "FP32", "shape": [-1, 3]},
    ]
    assert card["batching"]["max_batch_size"] > 0 and card["execution"] == "worker"

    clock.advance(settings.model_state_cache_seconds)
    assert listed(client, name), "not seen"  # the API was not restarted
    job = run_job(client, auth, name)
    assert job["status"] == "succeeded", job
    label, probabilities = direct(iris_onnx)
    assert job["outputs"]["label"] == label.tolist()
    assert np.allclose(job["outputs"]["probabilities"], probabilities)

    again = cli_add(settings, str(iris_onnx), "--name", name)
    assert again.exit_code == 0 and f"added {name}:2" in again.output
    refused = cli_add(settings, str(iris_onnx), "--name", name, "--version", "1")
    assert refused.exit_code != 0 and "already exists" in refused.output
    assert (
        cli_add(settings, str(iris_onnx), "--name", name, "--version", "1", "--force").exit_code
        == 0
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--name", "../escape"], "must be 1 to 100 characters"),
        (["--name", "ok", "--version", "a/b"], "must be 1 to 50 characters"),
    ],
)
def test_models_add_refuses_bad_names(
    settings: Settings, iris_onnx: Path, args: list[str], message: str
) -> None:
    result = cli_add(settings, str(iris_onnx), *args)
    assert result.exit_code != 0 and message in result.output


def test_a_corrupt_file_is_refused_by_the_cli_and_the_put(
    settings: Settings, client: FlaskClient, auth: dict[str, str], operator: dict[str, str],
    worker: WorkerProcess, tmp_path: Path, iris_onnx: Path,
) -> None:  # fmt: skip
    bad = tmp_path / "model.onnx"
    bad.write_bytes(iris_onnx.read_bytes()[:200])  # a truncated upload
    name = fresh_name()
    result = cli_add(settings, str(bad), "--name", name)
    assert result.exit_code != 0 and "not an ONNX model ONNX Runtime can load" in result.output
    assert not (settings.model_repository / name / "1").exists()

    response = put(client, operator, name, "1", b"not a model at all")
    assert response.status_code == 422, response.json
    assert response.content_type == "application/problem+json"
    assert response.json["type"] == "/problems/invalid-model"
    assert "not an ONNX model" in response.json["detail"]
    assert not (settings.model_repository / name).joinpath("1").exists()
    assert not list((settings.model_repository / ".incoming").glob("*"))  # nothing left behind
    # The models beside it keep serving.
    digits = client.post(
        "/jobs", json={"model": "digits", "inputs": {"pixels": [[0.0] * 64]}}, headers=auth
    )
    assert wait_for_job(client, auth, digits.json["id"])["status"] == "succeeded"


def test_put_adds_a_version_that_serves_at_once(
    client: FlaskClient, auth: dict[str, str], operator: dict[str, str], worker: WorkerProcess,
    iris_onnx: Path,
) -> None:  # fmt: skip
    name = fresh_name()
    response = put(client, operator, name, "1", iris_onnx.read_bytes())
    assert response.status_code == 201, response.json
    assert response.json["card"]["inputs"][0]["name"] == "X"
    assert run_job(client, auth, name, "1")["status"] == "succeeded"
    assert put(client, operator, name, "1", iris_onnx.read_bytes()).status_code == 409
    replaced = put(client, operator, name, "1", iris_onnx.read_bytes(), "?force=true")
    assert replaced.status_code == 201 and replaced.json["replaced"] is True


def test_operator_routes_need_an_operator_key(
    client: FlaskClient, auth: dict[str, str], operator: dict[str, str]
) -> None:
    for path in ("/v2/repository/index", "/v2/repository/models/digits/unload"):
        as_tenant = client.post(path, headers=auth)
        assert as_tenant.status_code == 403, path
        assert as_tenant.content_type == "application/problem+json"
        assert client.post(path).status_code == 401
    assert put(client, auth, "x", "1", b"").status_code == 403
    # An operator key is no tenant: job routes refuse it.
    as_operator = client.post(
        "/jobs", json={"model": "digits", "inputs": {"pixels": [[0.0] * 64]}}, headers=operator
    )
    assert as_operator.status_code == 403
    index = client.post("/v2/repository/index", headers=operator)
    assert index.status_code == 200
    assert {"name": "digits", "version": "1", "state": "READY", "reason": ""} in index.json


def test_unload_stops_submits_and_queued_jobs_and_load_brings_it_back(
    app: Flask, client: FlaskClient, database: Database, tenant: TenantAuth,
    operator: dict[str, str], iris_onnx: Path,
) -> None:  # fmt: skip
    name = fresh_name()
    assert put(client, operator, name, "1", iris_onnx.read_bytes()).status_code == 201
    queued = insert_queued_job(database, tenant.id, {"X": ROWS}, model=name)

    unloaded = client.post(f"/v2/repository/models/{name}/unload", headers=operator)
    assert unloaded.status_code == 200
    assert unloaded.json == [
        {"name": name, "version": "1", "state": "UNAVAILABLE", "reason": "unloaded by an operator"}
    ]
    refused = client.post(
        "/jobs", json={"model": name, "inputs": {"X": ROWS}}, headers=tenant.headers
    )
    assert refused.status_code == 404 and refused.json["type"] == "/problems/unknown-model"
    assert "not serving" in refused.json["detail"]
    assert not listed(client, name, tenant.headers)
    # A job queued before the unload fails with a clear code when a worker reaches it.
    [outcome] = execute(container_of(app), [queued])
    assert outcome.status == "failed" and outcome.error_code == "model_unavailable"

    loaded = client.post(f"/v2/repository/models/{name}/load", headers=operator)
    assert loaded.status_code == 200 and loaded.json[0]["state"] == "READY"
    again = client.post(
        "/jobs", json={"model": name, "inputs": {"X": ROWS}}, headers=tenant.headers
    )
    assert again.status_code == 202
    assert client.post("/v2/repository/models/nope/load", headers=operator).status_code == 404


def test_a_broken_model_fails_only_its_own_jobs_and_load_names_why(
    settings: Settings, client: FlaskClient, auth: dict[str, str], operator: dict[str, str],
    worker: WorkerProcess, iris_onnx: Path,
) -> None:  # fmt: skip
    name = fresh_name()
    assert put(client, operator, name, "1", iris_onnx.read_bytes()).status_code == 201
    (settings.model_repository / name / "1" / "model.onnx").write_bytes(b"\x00corrupt")
    wait_until(lambda: listed(client, name), f"{name} listed")
    broken = run_job(client, auth, name, "1")
    assert broken["status"] == "failed" and broken["error"]["code"] == "model_invalid", broken
    digits = client.post(
        "/jobs", json={"model": "digits", "inputs": {"pixels": [[0.0] * 64]}}, headers=auth
    )
    assert wait_for_job(client, auth, digits.json["id"])["status"] == "succeeded"

    load = client.post(f"/v2/repository/models/{name}/load", headers=operator)
    assert load.status_code == 422 and load.content_type == "application/problem+json"
    assert "version 1" in load.json["detail"] and "not an ONNX model" in load.json["detail"]
    index = client.post("/v2/repository/index", headers=operator).json
    [entry] = [e for e in index if e["name"] == name]
    assert entry["state"] == "UNAVAILABLE" and "not an ONNX model" in entry["reason"]


def test_a_card_that_does_not_match_its_graph_is_refused_at_load(
    settings: Settings, client: FlaskClient, operator: dict[str, str], iris_onnx: Path
) -> None:
    name = fresh_name()
    assert put(client, operator, name, "1", iris_onnx.read_bytes()).status_code == 201
    card_path = settings.model_repository / name / "1" / "card.json"
    card = json.loads(card_path.read_text())
    card["inputs"][0]["name"] = "features"
    card_path.write_text(json.dumps(card))
    load = client.post(f"/v2/repository/models/{name}/load", headers=operator)
    assert load.status_code == 422
    assert "does not match card.json" in load.json["detail"] and "features" in load.json["detail"]


def test_a_model_granted_to_one_tenant_is_invisible_to_others(
    settings: Settings, make_app: Callable[..., Flask], clock: FakeClock, database: Database,
    iris_onnx: Path, worker: WorkerProcess,
) -> None:  # fmt: skip
    client = clocked(make_app, clock)
    acme, other = make_tenant(database), make_tenant(database)
    name = fresh_name()
    result = cli_add(
        settings, str(iris_onnx), "--name", name, "--tenant", tenant_name(database, acme)
    )
    assert result.exit_code == 0, result.output
    clock.advance(settings.model_state_cache_seconds)
    assert listed(client, name, acme.headers), "not seen"
    assert run_job(client, acme.headers, name)["status"] == "succeeded"

    assert not listed(client, name, other.headers)
    assert not listed(client, name)  # nor without a key
    assert client.get(f"/v2/models/{name}", headers=other.headers).status_code == 404
    submit = client.post(
        "/jobs", json={"model": name, "inputs": {"X": ROWS}}, headers=other.headers
    )
    assert submit.status_code == 404 and name not in submit.json["known_models"]
    infer = client.post(
        f"/v2/models/{name}/infer",
        json={"inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 4], "data": ROWS[0]}]},
        headers=other.headers,
    )
    assert infer.status_code == 404


def test_version_policy_latest_serves_only_the_newest(
    settings: Settings, client: FlaskClient, auth: dict[str, str], operator: dict[str, str],
    worker: WorkerProcess, iris_onnx: Path,
) -> None:  # fmt: skip
    name = fresh_name()
    for version in ("1", "2"):
        assert put(client, operator, name, version, iris_onnx.read_bytes()).status_code == 201
    assert client.get(f"/v2/models/{name}/versions/1").status_code == 200
    card_path = settings.model_repository / name / "2" / "card.json"
    card = json.loads(card_path.read_text())
    card["version_policy"] = {"latest": 1}
    card_path.write_text(json.dumps(card))
    assert client.post(f"/v2/repository/models/{name}/load", headers=operator).status_code == 200

    job = run_job(client, auth, name)
    assert job["status"] == "succeeded" and job["model_version"] == "2"
    old = client.post("/jobs", json={"model": name, "version": "1", "inputs": {"X": ROWS}},
                      headers=auth)  # fmt: skip
    assert old.status_code == 404 and old.json["known_models"] == [f"{name}:2"]
    assert "version_policy" in old.json["detail"]
    models = client.get("/models").json["models"]
    assert next(m for m in models if m["name"] == name)["versions"] == ["2"]


def test_a_new_version_keeps_its_models_tenants_and_policy(
    settings: Settings, client: FlaskClient, database: Database, operator: dict[str, str],
    iris_onnx: Path,
) -> None:  # fmt: skip
    """A version PUT without a card must not open a model granted to one tenant."""
    acme, other = make_tenant(database), make_tenant(database)
    name = fresh_name()
    granted = cli_add(settings, str(iris_onnx), "--name", name, "--description", "irises",
                      "--tenant", tenant_name(database, acme))  # fmt: skip
    assert granted.exit_code == 0, granted.output
    assert put(client, operator, name, "2", iris_onnx.read_bytes()).status_code == 201
    card = json.loads((settings.model_repository / name / "2" / "card.json").read_text())
    assert card["tenants"] == [tenant_name(database, acme)] and card["description"] == "irises"
    assert not listed(client, name, other.headers)
    assert client.get(f"/v2/models/{name}", headers=acme.headers).json["versions"] == ["2"]
    ready = client.post("/v2/repository/index", json={"ready": True}, headers=operator).json
    assert {e["version"] for e in ready if e["name"] == name} == {"1", "2"}


def test_a_model_over_max_model_bytes_is_refused(
    settings: Settings,
    database: Database,
    iris_onnx: Path,
    make_app: Callable[..., Flask],
) -> None:
    small = make_app(settings.with_overrides(max_model_bytes=100)).test_client()
    with database.sessionmaker.begin() as session:
        headers = {"Authorization": f"Bearer {create_operator_key(session)}"}
    response = put(small, headers, fresh_name(), "1", iris_onnx.read_bytes())
    assert response.status_code == 413 and "MAX_MODEL_BYTES" in response.json["detail"]


def test_an_inline_model_with_a_broken_file_answers_model_invalid(
    settings: Settings, make_app: Callable[..., Flask], clock: FakeClock, auth: dict[str, str],
    operator: dict[str, str], iris_onnx: Path,
) -> None:  # fmt: skip
    client = clocked(make_app, clock)
    name = fresh_name()
    assert put(client, operator, name, "1", iris_onnx.read_bytes()).status_code == 201
    version_dir = settings.model_repository / name / "1"
    card = json.loads((version_dir / "card.json").read_text())
    (version_dir / "model.onnx").write_bytes(b"\x00corrupt")
    (version_dir / "card.json").write_text(json.dumps({**card, "execution": "inline"}))
    app_repository = container_of(client.application).parts.repository
    clock.advance(settings.model_state_cache_seconds)
    assert app_repository.resolve(name).extra.get("execution") == "inline", "not seen"
    body = {"inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 4], "data": ROWS[0]}]}
    failed = client.post(f"/v2/models/{name}/infer", json=body, headers=auth)
    assert failed.status_code == 500 and failed.json["error_code"] == "model_invalid"
    assert "cannot serve" in failed.json["detail"]
    # After a load names the broken file, the model is not served at all.
    assert client.post(f"/v2/repository/models/{name}/load", headers=operator).status_code == 422
    refused = client.post(f"/v2/models/{name}/infer", json=body, headers=auth)
    assert refused.status_code == 404 and "not an ONNX model" in refused.json["detail"]
