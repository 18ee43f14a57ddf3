"""Bytes on the doors not tried elsewhere: photos in a Parquet file's binary column,
run as a batch of the digit-photo pipeline (its chunks' steps recorded, results in
order); an unknown model answered in Triton's words on both sync doors; a gRPC
request mixing raw and typed contents refused, as Triton refuses it."""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path

import grpc
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from flask.testing import FlaskClient
from sklearn.datasets import load_digits

from app.container import Container
from app.grpc.generated import grpc_service_pb2 as pb
from app.grpc.generated import grpc_service_pb2_grpc as rpc
from app.grpc.server import door_settings, start
from app.platform.settings import Settings
from tests.code.folders import digit_png
from tests.conftest import TenantAuth, WorkerProcess
from tests.pipelines.test_doors import by_hand
from tests.support import wait_until

PARQUET = "application/vnd.apache.parquet"
DIGITS = load_digits()


def test_photos_in_a_parquet_binary_column_run_as_a_batch_of_the_pipeline(
    pipeline_models: Path, client: FlaskClient, tenant: TenantAuth, worker: WorkerProcess
) -> None:
    pngs = [digit_png(DIGITS.data[i]) for i in range(40)]
    table = pa.table({"image": pa.array(pngs, type=pa.binary())})
    buffer = io.BytesIO()
    pq.write_table(table, buffer)
    octets = "application/octet-stream"
    uploaded = client.post("/files?filename=photos.parquet", data=buffer.getvalue(),
                           headers=tenant.headers, content_type=octets)  # fmt: skip
    assert uploaded.status_code == 201, uploaded.json
    made = client.post("/batches", headers=tenant.headers,
                       json={"model": "digit-photo", "file_id": uploaded.json["id"]})  # fmt: skip
    assert made.status_code == 202, made.json
    url = f"/batches/{made.json['id']}"

    def finished() -> dict[str, object] | None:
        batch = client.get(url, headers=tenant.headers).json
        return batch if batch["status"] not in ("queued", "running") else None

    batch = wait_until(finished, "the batch finished", 120, 0.2)
    assert batch["status"] == "succeeded", batch
    results = client.get(f"{url}/results", headers={**tenant.headers, "Accept": PARQUET})
    assert results.status_code == 200, results.data[:300]
    answers = pq.read_table(io.BytesIO(results.data))
    digits, confidences = by_hand(pipeline_models, pngs)
    assert answers.column("digit").to_pylist() == digits
    np.testing.assert_allclose(answers.column("confidence").to_pylist(), confidences, rtol=1e-6)


def test_photos_as_b64_in_a_jsonl_batch_run_as_their_code_model(
    pipeline_models: Path, client: FlaskClient, tenant: TenantAuth, worker: WorkerProcess
) -> None:
    pngs = [digit_png(DIGITS.data[i]) for i in range(6)]
    lines = b"".join(json.dumps({"image": {"b64": base64.b64encode(p).decode()}}).encode()
                     + b"\n" for p in pngs)  # fmt: skip
    uploaded = client.post("/files?filename=photos.jsonl", data=lines, headers=tenant.headers,
                           content_type="application/octet-stream")  # fmt: skip
    assert uploaded.status_code == 201, uploaded.json
    batch = {"model": "digit-photo-code", "file_id": uploaded.json["id"]}
    made = client.post("/batches", headers=tenant.headers, json=batch)
    assert made.status_code == 202, made.json
    url = f"/batches/{made.json['id']}"
    wait_until(lambda: client.get(url, headers=tenant.headers).json["status"] == "succeeded",
               "the batch done", 120, 0.2)  # fmt: skip
    rows = [json.loads(line) for line in client.get(f"{url}/results", headers=tenant.headers)
            .data.decode().splitlines()]  # fmt: skip
    digits, _ = by_hand(pipeline_models, pngs)
    assert [row["outputs"]["digit"] for row in rows] == digits


def test_an_unknown_model_is_answered_in_tritons_words_on_both_sync_doors(
    client: FlaskClient, tenant: TenantAuth, settings: Settings
) -> None:
    body = {"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1.0]}]}
    http = client.post("/v2/models/nope/infer", json=body, headers=tenant.headers)
    assert http.status_code == 404
    assert http.json["detail"].startswith("Request for unknown model: model 'nope' is not in "
                                          "the repository; known models: ")  # fmt: skip
    running = start(Container(door_settings(settings)), "127.0.0.1", 0)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{running.port}") as channel:
            stub = rpc.GRPCInferenceServiceStub(channel)
            key = (("authorization", tenant.headers["Authorization"]),)
            request = pb.ModelInferRequest(model_name="nope")
            request.inputs.add(name="x", datatype="FP32", shape=[1]).contents.fp32_contents.append(
                1
            )
            with pytest.raises(grpc.RpcError) as refused:
                stub.ModelInfer(request, metadata=key)
            assert refused.value.code() == grpc.StatusCode.NOT_FOUND
            assert "Request for unknown model: model 'nope'" in refused.value.details()

            mixed = pb.ModelInferRequest(model_name="digits")
            first = mixed.inputs.add(name="pixels", datatype="FP32", shape=[1, 64])
            first.contents.fp32_contents.extend([0.0] * 64)
            mixed.raw_input_contents.append(np.zeros(64, dtype="<f4").tobytes())
            with pytest.raises(grpc.RpcError) as mixed_refused:
                stub.ModelInfer(mixed, metadata=key)
            assert mixed_refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert ("contents field must not be specified when using raw_input_contents for "
                    "'pixels' for model 'digits'") in mixed_refused.value.details()  # fmt: skip
    finally:
        running.stop(0)
        running.container.close()
