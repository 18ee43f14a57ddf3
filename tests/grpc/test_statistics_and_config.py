"""Triton's statistics and model configuration extensions on both KServe v2 doors,
read with Triton's own clients (`tritonclient.http` and `tritonclient.grpc`):
statistics counted from the calling tenant's jobs only, the configuration the
same on both doors, and server metadata naming both extensions."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from flask import Flask
from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2
from tritonclient.utils import InferenceServerException

from app.grpc.server import Running
from tests.conftest import TenantAuth, make_tenant
from tests.support import LiveServer, wait_until

RNG = np.random.default_rng(5)
ROWS = (1, 2, 1)  # three calls of digits, four rows in all
NON_FINITE = np.full((1, 64), 3e38, dtype=np.float32)  # a job that fails: non-finite outputs


def key_of(tenant: TenantAuth) -> dict[str, str]:
    return {"authorization": tenant.headers["Authorization"]}


def pixels(rows: np.ndarray) -> triton_http.InferInput:
    tensor = triton_http.InferInput("pixels", list(rows.shape), "FP32")
    tensor.set_data_from_numpy(rows)
    return tensor


def figure(stat: dict[str, Any], name: str) -> tuple[int, int]:
    """(count, ns) of one inference statistic; protobuf's JSON writes uint64 as
    strings and leaves zeros out."""
    found = stat["inference_stats"].get(name, {})
    return int(found.get("count", 0)), int(found.get("ns", 0))


def refused(call: Any, *args: Any, **kwargs: Any) -> InferenceServerException:
    """The error a Triton client's call raised (it must raise one)."""
    with pytest.raises(InferenceServerException) as error:
        call(*args, **kwargs)
    return error.value


@pytest.fixture
def http_client(app: Flask, serve: Any) -> Any:
    served: LiveServer = serve(app)
    client = triton_http.InferenceServerClient(served.address)
    yield client
    client.close()


@pytest.mark.processes
def test_statistics_count_the_tenants_own_calls_on_both_doors(
    http_client: Any,
    triton_client: triton_grpc.InferenceServerClient,
    tenant: TenantAuth,
    database: Any,
    worker: Any,
) -> None:
    started_ms = time.time() * 1000
    for rows in ROWS:
        data = (RNG.random((rows, 64)) * 16).astype(np.float32)
        http_client.infer("digits", [pixels(data)], headers=tenant.headers)
    failed = refused(http_client.infer, "digits", [pixels(NON_FINITE)], headers=tenant.headers)
    assert failed.status() == "422"

    def recorded() -> bool:  # the calls' records are written behind their answers
        [stat] = http_client.get_inference_statistics("digits", headers=tenant.headers)[
            "model_stats"
        ]
        return int(stat["execution_count"]) == len(ROWS) and figure(stat, "fail")[0] == 1

    wait_until(recorded, "every call's record", 30)
    over_http = http_client.get_inference_statistics("digits", headers=tenant.headers)
    over_grpc = triton_client.get_inference_statistics(
        "digits", headers=key_of(tenant), as_json=True
    )
    for answer in (over_http, over_grpc):
        [stat] = answer["model_stats"]
        assert stat["name"] == "digits" and stat["version"] == "1"
        assert int(stat["inference_count"]) == sum(ROWS)  # rows, as Triton counts them
        assert int(stat["execution_count"]) == len(ROWS)  # one per request
        assert started_ms - 1000 <= int(stat["last_inference"]) <= time.time() * 1000 + 1000
        success, fail = figure(stat, "success"), figure(stat, "fail")
        assert success[0] == len(ROWS) and success[1] > 0
        assert fail[0] == 1 and fail[1] > 0
        queue, infer = figure(stat, "queue"), figure(stat, "compute_infer")
        assert queue[0] == len(ROWS) and queue[1] > 0
        assert infer[0] == len(ROWS) and infer[1] > 0
        assert figure(stat, "compute_input") == (len(ROWS), 0)  # not measured apart
        assert figure(stat, "compute_output") == (len(ROWS), 0)

    versioned = http_client.get_inference_statistics("digits", "1", headers=tenant.headers)
    assert versioned == over_http
    every = http_client.get_inference_statistics(headers=tenant.headers)["model_stats"]
    assert [s for s in every if s["name"] == "digits"] == over_http["model_stats"]
    assert {"digits", "smollm2"} <= {s["name"] for s in every}

    other = make_tenant(database)  # the same model, another tenant: none of the above
    http_other = http_client.get_inference_statistics("digits", headers=other.headers)
    grpc_other = triton_client.get_inference_statistics(
        "digits", headers=key_of(other), as_json=True
    )
    for [stat] in (http_other["model_stats"], grpc_other["model_stats"]):
        assert int(stat.get("inference_count", 0)) == 0 and int(stat.get("last_inference", 0)) == 0
        assert figure(stat, "success") == (0, 0) and figure(stat, "fail") == (0, 0)


def test_statistics_of_an_unknown_model_and_without_a_key(
    http_client: Any, triton_client: triton_grpc.InferenceServerClient, tenant: TenantAuth
) -> None:
    key, http_stats = key_of(tenant), http_client.get_inference_statistics
    assert refused(http_stats, "no-such-model", headers=tenant.headers).status() == "404"
    assert refused(http_stats, "digits", "99", headers=tenant.headers).status() == "404"
    missing = refused(triton_client.get_inference_statistics, "no-such-model", headers=key)
    assert str(missing.status()) == "StatusCode.NOT_FOUND"
    assert "known models" in missing.message()
    assert refused(http_stats, "digits").status() == "401"
    anonymous = refused(triton_client.get_inference_statistics, "digits")
    assert str(anonymous.status()) == "StatusCode.UNAUTHENTICATED"


def same_config(client: triton_grpc.InferenceServerClient, model: str, http: Any) -> bool:
    """The gRPC door's ModelConfig message equals the HTTP door's JSON, read as one."""
    grpc_config = client.get_model_config(model).config
    return grpc_config == json_format.ParseDict(http, model_config_pb2.ModelConfig())


def test_model_configuration_is_the_same_on_both_doors(
    http_client: Any, triton_client: triton_grpc.InferenceServerClient
) -> None:
    digits = http_client.get_model_config("digits")
    assert digits["name"] == "digits" and digits["platform"] == "onnxruntime_onnx"
    assert digits["max_batch_size"] > 0 and "model_transaction_policy" not in digits
    [tensor] = digits["input"]
    assert tensor == {"name": "pixels", "data_type": "TYPE_FP32", "dims": [64]}
    assert http_client.get_model_config("digits", "1") == digits
    assert same_config(triton_client, "digits", digits)

    chat = http_client.get_model_config("smollm2")
    assert chat["model_transaction_policy"] == {"decoupled": True}
    assert chat["input"] == [{"name": "text_input", "data_type": "TYPE_STRING", "dims": [1]}]
    grpc_chat = triton_client.get_model_config("smollm2", as_json=True)["config"]
    assert grpc_chat["model_transaction_policy"] == {"decoupled": True}
    assert same_config(triton_client, "smollm2", chat)

    assert refused(http_client.get_model_config, "no-such-model").status() == "404"
    not_found = refused(triton_client.get_model_config, "no-such-model")
    assert str(not_found.status()) == "StatusCode.NOT_FOUND"


def test_server_metadata_names_both_extensions(
    http_client: Any, triton_client: triton_grpc.InferenceServerClient, grpc_server: Running
) -> None:
    for metadata in (
        http_client.get_server_metadata(),
        triton_client.get_server_metadata(as_json=True),
    ):
        assert {"statistics", "model_configuration"} <= set(metadata["extensions"])
