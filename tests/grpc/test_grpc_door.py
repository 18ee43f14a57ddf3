"""The gRPC door through Triton's own client (`tritonclient.grpc`) and raw stubs:
health and metadata, unary inference with typed and raw contents (the same
outputs as the HTTP sync door and as ONNX Runtime itself, each call a job with
its record), errors mapped to status codes, keys, and message size limits."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as triton
from flask import Flask
from grpc_health.v1 import health_pb2, health_pb2_grpc
from sqlalchemy import func, select, update
from tritonclient.grpc import service_pb2 as triton_pb
from tritonclient.grpc import service_pb2_grpc as triton_pb_grpc
from tritonclient.utils import InferenceServerException

from app.cards import ModelCard
from app.grpc.generated import grpc_service_pb2 as pb
from app.grpc.generated import grpc_service_pb2_grpc as pb_grpc
from app.grpc.server import Running
from app.jobs.tables import Job
from app.observability import metrics
from app.platform.database import Database
from app.platform.settings import Settings
from app.runtime.sessions import SessionPool
from app.tenancy.keys import create_operator_key
from app.tenancy.tables import Tenant
from tests.conftest import TenantAuth, lane_of, make_tenant, wait_for_record
from tests.grpc.conftest import FailsOnce
from tests.support import wait_until

RNG = np.random.default_rng(11)
PIXELS = (RNG.random((5, 64)) * 16).astype(np.float32)


def direct(model_repository: Path, pixels: np.ndarray) -> dict[str, np.ndarray]:
    """ONNX Runtime called directly on the same file: the reference."""
    return SessionPool("cpu").run(
        ModelCard.load(model_repository / "digits" / "1"), {"pixels": pixels}
    )


def key_of(tenant: TenantAuth) -> dict[str, str]:
    return {"authorization": tenant.headers["Authorization"]}


def pixels_input(pixels: np.ndarray = PIXELS) -> triton.InferInput:
    tensor = triton.InferInput("pixels", list(pixels.shape), "FP32")
    tensor.set_data_from_numpy(pixels)
    return tensor


@pytest.fixture
def stub(grpc_server: Running) -> Iterator[pb_grpc.GRPCInferenceServiceStub]:
    with grpc.insecure_channel(f"127.0.0.1:{grpc_server.port}") as channel:
        yield pb_grpc.GRPCInferenceServiceStub(channel)


def code_of(error: InferenceServerException) -> str:
    return str(error.status())


# -- health and metadata ----------------------------------------------------------------


def test_health_and_server_metadata_need_no_key(
    triton_client: triton.InferenceServerClient, grpc_server: Running
) -> None:
    assert triton_client.is_server_live() and triton_client.is_server_ready()
    metadata = triton_client.get_server_metadata(as_json=True)
    assert metadata["name"] == "inference-jobs"
    with grpc.insecure_channel(f"127.0.0.1:{grpc_server.port}") as channel:
        checker = health_pb2_grpc.HealthStub(channel)
        for service in ("", "inference.GRPCInferenceService"):
            answer = checker.Check(health_pb2.HealthCheckRequest(service=service))
            assert answer.status == health_pb2.HealthCheckResponse.SERVING


def test_model_metadata_config_and_readiness_follow_the_card(
    triton_client: triton.InferenceServerClient, tenant: TenantAuth, model_repository: Path
) -> None:
    card = ModelCard.load(model_repository / "digits" / "1")
    metadata = triton_client.get_model_metadata("digits", headers=key_of(tenant), as_json=True)
    assert metadata["name"] == "digits" and metadata["versions"] == ["1"]
    assert metadata["platform"] == "onnxruntime_onnx"
    assert [
        (i["name"], i["datatype"], [int(d) for d in i["shape"]]) for i in metadata["inputs"]
    ] == [(s.name, s.datatype, list(s.shape)) for s in card.inputs]
    assert [o["name"] for o in metadata["outputs"]] == [s.name for s in card.outputs]
    config = triton_client.get_model_config("digits", as_json=True)["config"]
    assert config["name"] == "digits" and config["backend"] == "onnxruntime"
    assert config["max_batch_size"] == card.batching.max_batch_size > 0
    [pixels] = config["input"]
    assert pixels["data_type"] == "TYPE_FP32" and [int(d) for d in pixels["dims"]] == [64]
    assert triton_client.is_model_ready("digits")
    assert triton_client.is_model_ready("digits", "1")
    assert not triton_client.is_model_ready("no-such-model")
    assert not triton_client.is_model_ready("digits", "99")
    with pytest.raises(InferenceServerException) as missing:
        triton_client.get_model_metadata("no-such-model")
    assert code_of(missing.value) == "StatusCode.NOT_FOUND"
    assert "known models" in missing.value.message()


def test_rpcs_not_served_say_so(
    triton_client: triton.InferenceServerClient, tenant: TenantAuth
) -> None:
    with pytest.raises(InferenceServerException) as trace:
        triton_client.get_trace_settings(headers=key_of(tenant))
    assert code_of(trace.value) == "StatusCode.UNIMPLEMENTED"
    message = trace.value.message()
    assert "TraceSetting is not supported" in message and "ModelStatistics" in message
    with pytest.raises(InferenceServerException) as shared_memory:
        triton_client.get_system_shared_memory_status(headers=key_of(tenant))
    assert code_of(shared_memory.value) == "StatusCode.UNIMPLEMENTED"


# -- inference --------------------------------------------------------------------------


def test_raw_contents_through_tritonclient_equal_onnx_runtime_and_the_http_door(
    triton_client: triton.InferenceServerClient, tenant: TenantAuth, worker: Any,
    model_repository: Path, database: Database, app: Flask,
) -> None:  # fmt: skip
    result = triton_client.infer(
        "digits", [pixels_input()], headers=key_of(tenant), request_id="req-7"
    )
    expected = direct(model_repository, PIXELS)
    assert np.array_equal(result.as_numpy("label"), expected["label"])
    assert np.array_equal(result.as_numpy("probabilities"), expected["probabilities"])
    response = result.get_response()
    assert response.id == "req-7" and response.model_name == "digits"
    job_id = uuid.UUID(response.parameters["job_id"].string_param)
    # The same call on the HTTP sync door gives the same bytes.
    body = {"inputs": [{"name": "pixels", "shape": [5, 64], "datatype": "FP32",
                        "data": PIXELS.reshape(-1).tolist()}]}  # fmt: skip
    http = app.test_client().post("/v2/models/digits/infer", json=body, headers=tenant.headers)
    assert http.status_code == 200, http.get_data(as_text=True)
    outputs = {o["name"]: o["data"] for o in http.json["outputs"]}
    assert np.array_equal(
        np.asarray(outputs["probabilities"], np.float32).reshape(5, 10),
        result.as_numpy("probabilities"),
    )
    # Its record, written behind, seen where the tenant sees every job.
    job = wait_for_record(app.test_client(), tenant.headers, str(job_id))
    assert job["status"] == "succeeded"
    assert job["outputs"]["label"] == expected["label"].tolist()

    def usage() -> dict[str, Any] | None:
        models = app.test_client().get("/usage", headers=tenant.headers).json["models"]
        found = [m for m in models if m["model"] == "digits"]
        return found[0] if found and found[0]["jobs"] == 2 else None

    digits = wait_until(usage, "both calls in /usage", 30)  # the gRPC call and the HTTP one
    assert digits["rows"] == 10
    with database.sessionmaker() as session:
        stored = session.get(Job, job_id)
        assert stored is not None and stored.priority == 10  # ahead of async work, as sync


def test_typed_contents_and_requested_outputs(
    stub: pb_grpc.GRPCInferenceServiceStub, tenant: TenantAuth, worker: Any,
    model_repository: Path,
) -> None:  # fmt: skip
    request = pb.ModelInferRequest(model_name="digits", model_version="1", id="typed")
    tensor = request.inputs.add(name="pixels", datatype="FP32", shape=[5, 64])
    tensor.contents.fp32_contents.extend(PIXELS.reshape(-1).tolist())
    request.outputs.add(name="label")
    response = stub.ModelInfer(request, metadata=list(key_of(tenant).items()), timeout=60)
    assert response.id == "typed" and [o.name for o in response.outputs] == ["label"]
    [label] = response.raw_output_contents
    assert np.array_equal(np.frombuffer(label, "<i8"), direct(model_repository, PIXELS)["label"])


def test_typed_contents_through_tritonclients_messages_equal_the_http_door(
    grpc_server: Running, tenant: TenantAuth, worker: Any, app: Flask
) -> None:
    """Typed contents (`fp32_contents`), sent in tritonclient.grpc's own generated
    messages through its own stub (its InferInput only sends raw contents), read
    back by its InferResult: the same outputs, bit for bit, as the HTTP sync door
    answers for the same rows."""
    pixels = (RNG.random((7, 64)) * 16).astype(np.float32)
    request = triton_pb.ModelInferRequest(model_name="digits", id="typed-triton")
    tensor = request.inputs.add(name="pixels", datatype="FP32", shape=[7, 64])
    tensor.contents.fp32_contents.extend(pixels.reshape(-1).tolist())
    request.outputs.add(name="probabilities")
    request.outputs.add(name="label")
    with grpc.insecure_channel(f"127.0.0.1:{grpc_server.port}") as channel:
        stub = triton_pb_grpc.GRPCInferenceServiceStub(channel)
        response = stub.ModelInfer(request, metadata=list(key_of(tenant).items()), timeout=60)
    result = triton.InferResult(response)
    assert response.id == "typed-triton"
    assert [o.name for o in response.outputs] == ["probabilities", "label"]
    body = {"inputs": [{"name": "pixels", "shape": [7, 64], "datatype": "FP32",
                        "data": pixels.reshape(-1).tolist()}]}  # fmt: skip
    http = app.test_client().post("/v2/models/digits/infer", json=body, headers=tenant.headers)
    assert http.status_code == 200, http.get_data(as_text=True)
    outputs = {o["name"]: o for o in http.json["outputs"]}
    label, probabilities = result.as_numpy("label"), result.as_numpy("probabilities")
    assert label.dtype == np.int64 and probabilities.dtype == np.float32
    assert label.tolist() == outputs["label"]["data"] and list(label.shape) == [7]
    assert np.array_equal(
        probabilities, np.asarray(outputs["probabilities"]["data"], np.float32).reshape(7, 10)
    )
    assert list(probabilities.shape) == outputs["probabilities"]["shape"]


@pytest.mark.parametrize(
    ("headers", "code"),
    [
        ({}, "UNAUTHENTICATED"),
        ({"authorization": "Bearer ik_not-a-key"}, "UNAUTHENTICATED"),
        ({"authorization": "Basic dXNlcjpwdw=="}, "UNAUTHENTICATED"),
    ],
    ids=["no key", "unknown key", "not bearer"],
)
def test_inference_needs_a_valid_tenant_key(
    triton_client: triton.InferenceServerClient, headers: dict[str, str], code: str
) -> None:
    with pytest.raises(InferenceServerException) as refused:
        triton_client.infer("digits", [pixels_input()], headers=headers)
    assert code_of(refused.value) == f"StatusCode.{code}"


def test_an_operator_key_is_not_a_tenant(
    triton_client: triton.InferenceServerClient, database: Database
) -> None:
    with database.sessionmaker.begin() as session:
        operator = create_operator_key(session)
    with pytest.raises(InferenceServerException) as refused:
        triton_client.infer(
            "digits", [pixels_input()], headers={"authorization": f"Bearer {operator}"}
        )
    assert code_of(refused.value) == "StatusCode.PERMISSION_DENIED"


def test_an_unauthenticated_call_is_refused_before_its_message_is_read(
    grpc_server: Running,
) -> None:
    """Bytes that are no message at all: a caller without a key hears UNAUTHENTICATED,
    not INVALID_ARGUMENT, so nothing of the body was parsed."""
    with grpc.insecure_channel(f"127.0.0.1:{grpc_server.port}") as channel:
        raw = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
        with pytest.raises(grpc.RpcError) as refused:
            raw(b"\xff\xff\xff garbage", timeout=10)
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_a_message_that_is_not_one_is_invalid_argument(
    grpc_server: Running, tenant: TenantAuth
) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{grpc_server.port}") as channel:
        raw = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
        with pytest.raises(grpc.RpcError) as refused:
            raw(b"\xff\xff\xff garbage", metadata=list(key_of(tenant).items()), timeout=10)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "inference.ModelInferRequest" in refused.value.details()


def test_domain_errors_map_to_status_codes_naming_what_was_wrong(
    triton_client: triton.InferenceServerClient, tenant: TenantAuth
) -> None:
    with pytest.raises(InferenceServerException) as unknown:
        triton_client.infer("no-such-model", [pixels_input()], headers=key_of(tenant))
    assert code_of(unknown.value) == "StatusCode.NOT_FOUND"
    assert "no-such-model" in unknown.value.message() and "digits" in unknown.value.message()

    wrong = triton.InferInput("pixels", [1, 63], "FP32")
    wrong.set_data_from_numpy(np.zeros((1, 63), np.float32))
    with pytest.raises(InferenceServerException) as shape:
        triton_client.infer("digits", [wrong], headers=key_of(tenant))
    assert code_of(shape.value) == "StatusCode.INVALID_ARGUMENT"
    assert "pixels" in shape.value.message() and "[1, 63]" in shape.value.message()
    assert "64" in shape.value.message()  # what was expected

    with pytest.raises(InferenceServerException) as output:
        triton_client.infer(
            "digits", [pixels_input()], outputs=[triton.InferRequestedOutput("nope")],
            headers=key_of(tenant),
        )  # fmt: skip
    assert code_of(output.value) == "StatusCode.INVALID_ARGUMENT"
    assert "nope" in output.value.message()

    with pytest.raises(InferenceServerException) as sequence:
        triton_client.infer("digits", [pixels_input()], sequence_id=3, headers=key_of(tenant))
    assert code_of(sequence.value) == "StatusCode.INVALID_ARGUMENT"
    assert "sequence" in sequence.value.message()


def test_a_used_up_quota_is_resource_exhausted_with_when_to_retry(
    stub: pb_grpc.GRPCInferenceServiceStub, database: Database
) -> None:
    tenant = make_tenant(database)
    with database.sessionmaker() as session:
        limit = update(Tenant).where(Tenant.id == tenant.id).values(max_submits_per_second=0.5)
        session.execute(limit)  # below one: its first submit is already one too many
        session.commit()
    request = pb.ModelInferRequest(model_name="digits")
    request.inputs.add(name="pixels", datatype="FP32", shape=[2, 64])
    request.raw_input_contents.append(PIXELS[:2].tobytes())
    with pytest.raises(grpc.RpcError) as full:
        stub.ModelInfer(request, metadata=list(key_of(tenant).items()), timeout=30)
    error = full.value
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, error.details()
    assert "max_submits_per_second" in error.details()
    trailing = dict(error.trailing_metadata())
    assert trailing["error-code"] == "quota-exceeded" and int(trailing["retry-after"]) >= 1
    with database.sessionmaker() as session:  # nothing of the request was kept
        assert not session.scalar(select(func.count()).where(Job.tenant_id == tenant.id))


def slow_request(seconds: float) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="slow")
    request.inputs.add(name="x", datatype="FP32", shape=[1, 64])
    request.inputs.add(name="steps", datatype="INT64", shape=[1])
    request.raw_input_contents.extend(
        [np.full((1, 64), 0.1, np.float32).tobytes(),
         np.array([int(seconds / 2e-6)], "<i8").tobytes()]
    )  # fmt: skip
    return request


def records_of(database: Database, tenant: TenantAuth) -> list[Job]:
    with database.sessionmaker() as session:
        return list(session.scalars(select(Job).where(Job.tenant_id == tenant.id)))


def test_a_call_that_outlives_its_deadline_names_its_record(
    stub: pb_grpc.GRPCInferenceServiceStub, tenant: TenantAuth, worker: Any, database: Database
) -> None:
    with pytest.raises(grpc.RpcError) as late:  # about 3 s of work, 1 s to wait
        stub.ModelInfer(slow_request(3), metadata=list(key_of(tenant).items()), timeout=1.0)
    error = late.value
    assert error.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    trailing = dict(error.trailing_metadata() or ())
    assert "job-id" in trailing, (error.details(), trailing)  # the server answered in time
    # A worker had taken it: it ran to its end, and its record says so.
    [record] = wait_until(lambda: records_of(database, tenant), "the call's record", 30)
    assert str(record.id) == trailing["job-id"] and record.status == "succeeded"


def test_an_oversize_request_is_refused_and_the_server_goes_on(
    serve_grpc: Any, tenant: TenantAuth, worker: Any
) -> None:
    running = serve_grpc(grpc_max_message_bytes=256 * 1024)
    client = triton.InferenceServerClient(f"127.0.0.1:{running.port}")
    big = np.zeros((2048, 64), np.float32)  # 512 KiB of pixels
    with pytest.raises(InferenceServerException) as refused:
        client.infer("digits", [pixels_input(big)], headers=key_of(tenant))
    assert code_of(refused.value) == "StatusCode.RESOURCE_EXHAUSTED"
    result = client.infer("digits", [pixels_input()], headers=key_of(tenant))
    assert result.as_numpy("label").shape == (5,)
    client.close()


def test_a_unary_call_the_client_cancels_before_a_worker_takes_it_never_runs(
    stub: pb_grpc.GRPCInferenceServiceStub, tenant: TenantAuth, database: Database, worker: Any,
    settings: Settings,
) -> None:  # fmt: skip
    """Both worker children busy: the third call waits on the lane; its client
    cancels it, it is taken back, and never runs (no record)."""
    metadata = list(key_of(tenant).items())
    busy = [stub.ModelInfer.future(slow_request(2), metadata=metadata, timeout=60)
            for _ in range(2)]  # fmt: skip
    lane = lane_of(settings)
    wait_until(lambda: lane.waiting("slow") == 0 and not records_of(database, tenant),
               "both slow calls to be taken", 30)  # fmt: skip
    time.sleep(0.3)
    future = stub.ModelInfer.future(slow_request(0.1), metadata=metadata, timeout=60)
    wait_until(lambda: lane.waiting("slow") == 1, "the third call on the lane", 10)
    future.cancel()
    wait_until(lambda: lane.waiting("slow") == 0, "the cancelled call taken back", 10)
    for call in busy:
        assert call.result(timeout=30).outputs
    wait_until(lambda: len(records_of(database, tenant)) == 2, "the two calls' records", 30)
    time.sleep(1.0)  # the writers' next round: still no third record
    assert len(records_of(database, tenant)) == 2


def test_calls_are_counted_by_method_and_code(
    triton_client: triton.InferenceServerClient, tenant: TenantAuth, worker: Any
) -> None:
    def count(method: str, code: str) -> float:
        value: float = metrics.GRPC_REQUESTS.labels(method, code)._value.get()
        return value

    before = count("ModelInfer", "OK"), count("ModelInfer", "NOT_FOUND")
    triton_client.infer("digits", [pixels_input()], headers=key_of(tenant))
    with pytest.raises(InferenceServerException):
        triton_client.infer("no-such-model", [pixels_input()], headers=key_of(tenant))
    assert (count("ModelInfer", "OK"), count("ModelInfer", "NOT_FOUND")) == (
        before[0] + 1,
        before[1] + 1,
    )


def test_health_says_not_serving_while_the_database_is_away(serve_grpc: Any, settings: Any) -> None:
    unreachable = "postgresql://nobody@127.0.0.1:1/none"
    running = serve_grpc(database_url=unreachable)
    with grpc.insecure_channel(f"127.0.0.1:{running.port}") as channel:
        answer = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
        assert answer.status == health_pb2.HealthCheckResponse.NOT_SERVING
        ready = pb_grpc.GRPCInferenceServiceStub(channel).ServerReady(pb.ServerReadyRequest())
        assert not ready.ready


def test_a_bytes_shape_its_data_cannot_hold_is_refused_before_any_allocation(
    stub: pb_grpc.GRPCInferenceServiceStub, tenant: TenantAuth
) -> None:
    request = pb.ModelInferRequest(model_name="minilm")
    request.inputs.add(name="text", datatype="BYTES", shape=[2**40])
    request.raw_input_contents.append(b"\x00\x00\x00\x00")
    with pytest.raises(grpc.RpcError) as refused:
        stub.ModelInfer(request, metadata=list(key_of(tenant).items()), timeout=30)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "does not fit shape [1099511627776]" in refused.value.details()
    assert "element 1 has no 4-byte length" in refused.value.details()


def test_an_unexpected_error_is_internal_without_its_internals(
    serve_grpc: Any, tenant: TenantAuth, worker: Any, model_repository: Path,
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    """The call operations fail unexpectedly inside a call: INTERNAL, with a reference
    to the logged error and nothing of it; the next call is answered."""
    running = serve_grpc()
    plane = running.container.calls
    broken = FailsOnce(plane.infer)
    monkeypatch.setattr(plane, "infer", broken)
    with grpc.insecure_channel(f"127.0.0.1:{running.port}") as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        request = pb.ModelInferRequest(model_name="digits", id="boom")
        request.inputs.add(name="pixels", datatype="FP32", shape=[5, 64])
        request.raw_input_contents.append(PIXELS.tobytes())
        metadata = list(key_of(tenant).items())
        logged_at = caplog.at_level("ERROR", logger="app.grpc.status")
        with logged_at, pytest.raises(grpc.RpcError) as failed:
            stub.ModelInfer(request, metadata=metadata, timeout=30)
        error = failed.value
        assert error.code() == grpc.StatusCode.INTERNAL
        said = error.details() + repr(error.trailing_metadata() or ())
        assert not [part for part in FailsOnce.INTERNALS if part in said], said
        # The reference the caller got finds the whole error in the log.
        reference = error.details().split("reference ")[1].split(")")[0]
        [logged] = [r for r in caplog.records if reference in r.getMessage()]
        assert logged.exc_info is not None and str(logged.exc_info[1]) == FailsOnce.SECRET

        # The next call on the same channel is answered, by the same server.
        answer = stub.ModelInfer(request, metadata=metadata, timeout=60)
        assert broken.calls == 2
        label = np.frombuffer(answer.raw_output_contents[0], "<i8")
        assert np.array_equal(label, direct(model_repository, PIXELS)["label"])
