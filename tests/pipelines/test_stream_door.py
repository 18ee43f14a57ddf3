"""The digit-photo pipeline on the stream door: photos as {"b64"} in input entries,
read by a real consumer process, run by a real worker, each result in the
output log equal to the pipeline's steps by hand; an entry's `traceparent` kept
with its job (its trace id on GET /jobs)."""

from __future__ import annotations

import base64
import json
import uuid
from pathlib import Path

from flask.testing import FlaskClient
from sklearn.datasets import load_digits

from app.platform.logstreams import RedisLogs
from tests.code.folders import digit_png
from tests.conftest import TenantAuth, WorkerProcess
from tests.pipelines.test_doors import by_hand
from tests.streams.conftest import (  # noqa: F401  (the stream door's fixtures)
    ConsumerProcess,
    consumer,
    embedded_redis,
    logs,
    produce,
    start_consumer,
    wait_for_results,
)

DIGITS = load_digits()


def test_photos_on_the_stream_door_come_back_as_the_pipelines_answers(
    pipeline_models: Path, client: FlaskClient, tenant: TenantAuth, worker: WorkerProcess,
    logs: RedisLogs, consumer: ConsumerProcess,  # noqa: F811
) -> None:  # fmt: skip
    names = uuid.uuid4().hex[:8]
    body = {"model": "digit-photo", "input": f"photos-{names}", "output": f"digits-{names}"}
    binding = client.post("/streams", json=body, headers=tenant.headers).json
    pngs = [digit_png(DIGITS.data[i]) for i in range(8)]
    traces = [uuid.uuid4().hex for _ in pngs]
    produce(logs, binding["input"], [{
        "id": f"p{i}", "inputs": json.dumps({"image": [{"b64": base64.b64encode(p).decode()}]}),
        "traceparent": f"00-{traces[i]}-{'3' * 16}-01"} for i, p in enumerate(pngs)])  # fmt: skip
    results = {r["id"]: r for r in wait_for_results(logs, binding["output"], len(pngs))}
    digits, _ = by_hand(pipeline_models, pngs)
    assert [results[f"p{i}"]["outputs"]["digit"] for i in range(len(pngs))] == [
        [d] for d in digits]  # fmt: skip
    job = client.get(f"/jobs/{results['p0']['job_id']}", headers=tenant.headers).json
    assert job["trace_id"] == traces[0]
