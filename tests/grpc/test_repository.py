"""Triton's model repository extension on both KServe v2 doors, through Triton's own
clients (`tritonclient.grpc`, `tritonclient.http`) and raw stubs: the index with
each version's state, load with a `config` override (then the configuration shows
it), unload (then the model is not ready and inference is NOT_FOUND / 404), load
again; operator keys only; errors as Triton answers them."""

from __future__ import annotations

import json
import shutil
import uuid
from collections.abc import Iterator
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from flask import Flask
from tritonclient.utils import InferenceServerException

from app.grpc.generated import grpc_service_pb2 as pb
from app.grpc.generated import grpc_service_pb2_grpc as pb_grpc
from app.grpc.server import Running
from app.platform.database import Database
from app.platform.settings import Settings
from app.tenancy.keys import create_operator_key
from tests.conftest import TenantAuth
from tests.support import LiveServer

PIXELS = np.zeros((1, 64), dtype=np.float32)


@pytest.fixture
def operator(database: Database) -> dict[str, str]:
    """An operator key, as the gRPC door's metadata (lower case) wants it."""
    with database.sessionmaker.begin() as session:
        return {"authorization": f"Bearer {create_operator_key(session)}"}


@pytest.fixture
def model(settings: Settings) -> str:
    """A model of this test's own: the digits model's files under a fresh name."""
    name = f"repo-{uuid.uuid4().hex[:8]}"
    shutil.copytree(settings.model_repository / "digits", settings.model_repository / name)
    return name


@pytest.fixture
def http_client(app: Flask, serve: Any) -> Iterator[triton_http.InferenceServerClient]:
    served: LiveServer = serve(app)
    client = triton_http.InferenceServerClient(served.address)
    yield client
    client.close()


@pytest.fixture
def stub(grpc_server: Running) -> Iterator[pb_grpc.GRPCInferenceServiceStub]:
    with grpc.insecure_channel(f"127.0.0.1:{grpc_server.port}") as channel:
        yield pb_grpc.GRPCInferenceServiceStub(channel)


def refused(call: Any, *args: Any, **kwargs: Any) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as error:
        call(*args, **kwargs)
    return error.value


def grpc_code(error: InferenceServerException) -> str:
    return str(error.status()).removeprefix("StatusCode.")


def entries(index: list[dict[str, Any]], name: str) -> list[tuple[str, str, str]]:
    """(version, state, reason) of `name`'s entries in an index."""
    return [(e["version"], e["state"], e.get("reason", "")) for e in index if e["name"] == name]


def grpc_index(client: triton_grpc.InferenceServerClient, headers: dict[str, str]) -> list[Any]:
    return client.get_model_repository_index(headers=headers, as_json=True).get("models", [])


def grpc_pixels() -> triton_grpc.InferInput:
    tensor = triton_grpc.InferInput("pixels", list(PIXELS.shape), "FP32")
    tensor.set_data_from_numpy(PIXELS)
    return tensor


def http_pixels() -> triton_http.InferInput:
    tensor = triton_http.InferInput("pixels", list(PIXELS.shape), "FP32")
    tensor.set_data_from_numpy(PIXELS)
    return tensor


def card_of(settings: Settings, name: str, version: str = "1") -> dict[str, Any]:
    card: dict[str, Any] = json.loads(
        (settings.model_repository / name / version / "card.json").read_text()
    )
    return card


# -- the gRPC door ----------------------------------------------------------------------


def test_grpc_load_with_a_config_unload_and_load_again(
    triton_client: triton_grpc.InferenceServerClient, operator: dict[str, str],
    tenant: TenantAuth, settings: Settings, model: str,
) -> None:  # fmt: skip
    triton_client.load_model(model, headers=operator)
    assert entries(grpc_index(triton_client, operator), model) == [("1", "READY", "")]
    assert triton_client.is_model_ready(model)
    assert triton_client.get_model_config(model).config.max_batch_size == 64

    config = {"max_batch_size": 8, "dynamic_batching": {"max_queue_delay_microseconds": 500}}
    triton_client.load_model(model, headers=operator, config=json.dumps(config))
    shown = triton_client.get_model_config(model).config
    assert shown.max_batch_size == 8
    assert shown.dynamic_batching.max_queue_delay_microseconds == 500
    assert card_of(settings, model)["batching"]["max_batch_size"] == 8  # kept in card.json
    assert card_of(settings, model)["batching"]["why"]  # the card's other fields are kept

    triton_client.unload_model(model, headers=operator, unload_dependents=True)
    assert not triton_client.is_model_ready(model)
    assert entries(grpc_index(triton_client, operator), model) == [
        ("1", "UNAVAILABLE", "unloaded by an operator")
    ]
    tenant_key = {"authorization": tenant.headers["Authorization"]}
    gone = refused(triton_client.infer, model, [grpc_pixels()], headers=tenant_key)
    assert grpc_code(gone) == "NOT_FOUND" and "unloaded by an operator" in gone.message()

    triton_client.load_model(model, headers=operator)
    assert triton_client.is_model_ready(model)
    assert entries(grpc_index(triton_client, operator), model) == [("1", "READY", "")]
    assert triton_client.get_model_config(model).config.max_batch_size == 8  # as loaded


def test_grpc_config_round_trips_protobufs_json(
    triton_client: triton_grpc.InferenceServerClient, operator: dict[str, str], model: str
) -> None:
    """The configuration a client reads (protobuf's JSON: int64 as strings) goes
    back as a load's config with one field changed, and only that field changes."""
    triton_client.load_model(model, headers=operator)
    config = triton_client.get_model_config(model, as_json=True)["config"]
    assert config["input"][0]["dims"] == ["64"]  # protobuf's JSON, as sent back
    config["max_batch_size"] = 32
    config["version_policy"] = {"latest": {"num_versions": 1}}
    config["parameters"] = {"owner": {"string_value": "research"}}
    triton_client.load_model(model, headers=operator, config=json.dumps(config))
    after = triton_client.get_model_config(model, as_json=True)["config"]
    assert after == config


def test_grpc_index_ready_filter_and_repository_name(
    stub: pb_grpc.GRPCInferenceServiceStub, triton_client: triton_grpc.InferenceServerClient,
    operator: dict[str, str], model: str,
) -> None:  # fmt: skip
    metadata = list(operator.items())
    triton_client.unload_model(model, headers=operator)
    every = stub.RepositoryIndex(pb.RepositoryIndexRequest(), metadata=metadata)
    ready = stub.RepositoryIndex(pb.RepositoryIndexRequest(ready=True), metadata=metadata)
    assert {(m.name, m.state) for m in every.models} >= {
        (model, "UNAVAILABLE"),
        ("digits", "READY"),
    }
    assert {m.state for m in ready.models} == {"READY"}
    assert model not in {m.name for m in ready.models} and "digits" in {
        m.name for m in ready.models
    }
    for call, request in (
        (stub.RepositoryIndex, pb.RepositoryIndexRequest(repository_name="models")),
        (stub.RepositoryModelLoad, pb.RepositoryModelLoadRequest(repository_name="models",
                                                                 model_name=model)),
        (stub.RepositoryModelUnload, pb.RepositoryModelUnloadRequest(repository_name="models",
                                                                     model_name=model)),
    ):  # fmt: skip
        with pytest.raises(grpc.RpcError) as named:
            call(request, metadata=metadata)
        assert named.value.code() == grpc.StatusCode.UNIMPLEMENTED  # as Triton answers
        assert "repository_name" in str(named.value.details())


def test_grpc_repository_rpcs_need_an_operator_key(
    triton_client: triton_grpc.InferenceServerClient, operator: dict[str, str],
    tenant: TenantAuth, model: str,
) -> None:  # fmt: skip
    triton_client.load_model(model, headers=operator)
    tenant_key = {"authorization": tenant.headers["Authorization"]}
    for call in (
        lambda h: triton_client.get_model_repository_index(headers=h),
        lambda h: triton_client.load_model(model, headers=h),
        lambda h: triton_client.unload_model(model, headers=h),
    ):
        as_tenant = refused(call, tenant_key)
        assert grpc_code(as_tenant) == "PERMISSION_DENIED" and "operator key" in as_tenant.message()
        assert grpc_code(refused(call, None)) == "UNAUTHENTICATED"
        bad = {"authorization": "Bearer not-a-key"}
        assert grpc_code(refused(call, bad)) == "UNAUTHENTICATED"
    assert triton_client.is_model_ready(model)  # the refused unloads did nothing


def test_grpc_errors_as_triton_answers_them(
    triton_client: triton_grpc.InferenceServerClient, stub: pb_grpc.GRPCInferenceServiceStub,
    operator: dict[str, str], settings: Settings, model: str,
) -> None:  # fmt: skip
    unknown = refused(triton_client.load_model, "no-such-model", headers=operator)
    assert grpc_code(unknown) == "NOT_FOUND"
    assert grpc_code(refused(triton_client.unload_model, "no-such-model", headers=operator)) == (
        "NOT_FOUND"
    )
    other = refused(triton_client.load_model, model, headers=operator,
                    config=json.dumps({"name": "digits"}))  # fmt: skip
    assert grpc_code(other) == "INVALID_ARGUMENT" and "config.name" in other.message()
    preferred = json.dumps({"dynamic_batching": {"preferred_batch_size": [4, 8]}})
    sizes = refused(triton_client.load_model, model, headers=operator, config=preferred)
    assert grpc_code(sizes) == "INVALID_ARGUMENT"
    assert "config.dynamic_batching.preferred_batch_size" in sizes.message()
    files = refused(triton_client.load_model, model, headers=operator, config="{}",
                    files={"file:1/model.onnx": b"\x08\x01"})  # fmt: skip
    assert grpc_code(files) == "INVALID_ARGUMENT"
    assert "not supported; PUT the file" in files.message()
    assert card_of(settings, model)["batching"]["max_batch_size"] == 64  # nothing written

    metadata = list(operator.items())
    request = pb.RepositoryModelUnloadRequest(model_name=model)
    request.parameters["unload_dependents"].string_param = "true"
    with pytest.raises(grpc.RpcError) as not_bool:
        stub.RepositoryModelUnload(request, metadata=metadata)
    assert not_bool.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "unload_dependents" in str(not_bool.value.details())
    with pytest.raises(grpc.RpcError) as nameless:
        stub.RepositoryModelLoad(pb.RepositoryModelLoadRequest(), metadata=metadata)
    assert nameless.value.code() == grpc.StatusCode.INVALID_ARGUMENT

    (settings.model_repository / model / "1" / "model.onnx").write_bytes(b"\x00corrupt")
    broken = refused(triton_client.load_model, model, headers=operator)
    assert grpc_code(broken) == "INVALID_ARGUMENT"  # Triton's code for a load that failed
    assert "version 1" in broken.message() and "not an ONNX model" in broken.message()
    [(_, state, reason)] = entries(grpc_index(triton_client, operator), model)
    assert state == "UNAVAILABLE" and "not an ONNX model" in reason


def test_server_metadata_names_the_repository_extension(
    triton_client: triton_grpc.InferenceServerClient, http_client: triton_http.InferenceServerClient
) -> None:
    for metadata in (
        triton_client.get_server_metadata(as_json=True),
        http_client.get_server_metadata(),
    ):
        assert {"model_repository", "model_repository(unload_dependents)"} <= set(
            metadata["extensions"]
        )


# -- the HTTP door ----------------------------------------------------------------------


def test_http_load_with_a_config_unload_and_load_again(
    http_client: triton_http.InferenceServerClient, operator: dict[str, str],
    tenant: TenantAuth, settings: Settings, model: str,
) -> None:  # fmt: skip
    headers = {"Authorization": operator["authorization"]}
    http_client.load_model(model, headers=headers)
    assert entries(http_client.get_model_repository_index(headers=headers), model) == [
        ("1", "READY", "")
    ]
    config = {"name": model, "max_batch_size": 16, "parameters": {"team": {"string_value": "a"}}}
    http_client.load_model(model, headers=headers, config=json.dumps(config))
    shown = http_client.get_model_config(model)
    assert shown["max_batch_size"] == 16 and shown["parameters"] == config["parameters"]
    assert shown["input"] == [{"name": "pixels", "data_type": "TYPE_FP32", "dims": [64]}]
    assert card_of(settings, model)["parameters"] == {"team": "a"}

    http_client.unload_model(model, headers=headers, unload_dependents=True)
    assert not http_client.is_model_ready(model)
    gone = refused(http_client.infer, model, [http_pixels()], headers=tenant.headers)
    assert gone.status() == "404" and "unloaded by an operator" in gone.message()
    assert entries(http_client.get_model_repository_index(headers=headers), model) == [
        ("1", "UNAVAILABLE", "unloaded by an operator")
    ]

    http_client.load_model(model, headers=headers)
    assert http_client.is_model_ready(model)
    assert http_client.get_model_config(model)["max_batch_size"] == 16


def test_http_errors_and_keys(
    http_client: triton_http.InferenceServerClient, operator: dict[str, str],
    tenant: TenantAuth, settings: Settings, model: str,
) -> None:  # fmt: skip
    headers = {"Authorization": operator["authorization"]}
    other = refused(http_client.load_model, model, headers=headers,
                    config=json.dumps({"name": "digits"}))  # fmt: skip
    assert other.status() == "400" and "config.name" in other.message()
    fixed = json.dumps({"instance_group": [{"count": 2, "kind": "KIND_CPU"}]})
    groups = refused(http_client.load_model, model, headers=headers, config=fixed)
    assert groups.status() == "400" and "config.instance_group" in groups.message()
    assert refused(http_client.load_model, "no-such-model", headers=headers).status() == "404"
    assert card_of(settings, model)["batching"]["max_batch_size"] == 64  # nothing written

    for call in (
        lambda h: http_client.get_model_repository_index(headers=h),
        lambda h: http_client.load_model(model, headers=h),
        lambda h: http_client.unload_model(model, headers=h),
    ):
        assert refused(call, tenant.headers).status() == "403"
        assert refused(call, None).status() == "401"
    assert http_client.is_model_ready(model)  # the refused unload did nothing


def test_http_bodies_read_as_triton_reads_them(
    app: Flask, operator: dict[str, str], model: str
) -> None:
    """Bodies without a JSON Content-Type (tritonclient sends none; curl -d says form
    data) are read as JSON, and non-boolean `unload_dependents` is refused."""
    client = app.test_client()
    headers = {"Authorization": operator["authorization"]}
    assert client.post(f"/v2/repository/models/{model}/load", headers=headers).status_code == 200
    form = {**headers, "Content-Type": "application/x-www-form-urlencoded"}
    ready = client.post("/v2/repository/index", data='{"ready": true}', headers=form)
    assert ready.status_code == 200 and {e["state"] for e in ready.json} == {"READY"}
    not_bool = client.post(
        f"/v2/repository/models/{model}/unload",
        data=json.dumps({"parameters": {"unload_dependents": "yes"}}),
        headers=headers,
    )
    assert not_bool.status_code == 400 and not_bool.json["type"] == "/problems/invalid-parameter"
    assert "unload_dependents" in not_bool.json["error"]
    unknown = client.post(
        f"/v2/repository/models/{model}/load",
        json={"parameters": {"poll": True}},
        headers=headers,
    )
    assert (
        unknown.status_code == 400
        and "unrecognized load parameter 'poll'" in unknown.json["detail"]
    )
    still = client.post("/v2/repository/index", json={"ready": True}, headers=headers).json
    assert (model, "READY") in {(e["name"], e["state"]) for e in still}
