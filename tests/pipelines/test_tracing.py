"""One trace per job, against a real OTLP/HTTP receiver run here on loopback: a job
submitted with a W3C traceparent keeps its trace id, and its spans reach the
receiver under that trace from the API (admission), the worker process (the
queue wait, the run, each pipeline step, the micro-batch's model call linked to
the run) and the webhook sender (the delivery); a sync call's run on the lane
joins its caller's trace too."""

from __future__ import annotations

import base64
import gzip
import threading
import uuid
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from app.observability import tracing
from app.operations.webhooks import WebhookOperations
from app.platform.settings import Settings
from app.web.context import container_of
from app.webhooks.delivery import DeliverySettings
from tests.code.folders import digit_png
from tests.conftest import WorkerProcess, wait_for_job
from tests.support import wait_until

pytestmark = pytest.mark.processes


class Receiver:
    """An OTLP/HTTP trace receiver (POST /v1/traces, protobuf), and a webhook sink
    (POST anything else): what it was sent, kept."""

    def __init__(self) -> None:
        self.spans: list[dict[str, Any]] = []
        self.hooks = 0
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                if self.path == "/v1/traces":
                    receiver.take(ExportTraceServiceRequest.FromString(body))
                else:
                    receiver.hooks += 1
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def take(self, request: ExportTraceServiceRequest) -> None:
        for resource in request.resource_spans:
            service = next((a.value.string_value for a in resource.resource.attributes
                            if a.key == "service.name"), "")  # fmt: skip
            for scope in resource.scope_spans:
                for span in scope.spans:
                    self.spans.append({
                        "service": service, "name": span.name, "trace": span.trace_id.hex(),
                        "id": span.span_id.hex(), "parent": span.parent_span_id.hex(),
                        "links": [link.trace_id.hex() for link in span.links],
                    })  # fmt: skip

    def names(self, trace: str) -> set[tuple[str, str]]:
        return {(s["service"], s["name"]) for s in self.spans if s["trace"] == trace}


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    made = Receiver()
    yield made
    made.server.shutdown()


@pytest.fixture
def traced(
    settings: Settings, receiver: Receiver, make_app: Callable[..., Flask], tmp_path: Path,
    pipeline_models: Path,
) -> Iterator[tuple[Flask, Settings]]:  # fmt: skip
    own = settings.with_overrides(jobs_queue=f"traced-{uuid.uuid4().hex[:8]}",
                                  webhook_allow_private_networks=True)  # fmt: skip
    worker = WorkerProcess(own, tmp_path / "worker.log", concurrency=1,
                           OTEL_EXPORTER_OTLP_ENDPOINT=receiver.url)  # fmt: skip
    app = make_app(own)
    assert tracing.setup("test-api", receiver.url)
    try:
        yield app, own
    finally:
        tracing.shutdown()
        worker.stop()


def test_a_jobs_spans_share_the_trace_it_came_with_across_every_process(
    traced: tuple[Flask, Settings], receiver: Receiver, auth: dict[str, str]
) -> None:
    app, own = traced
    client, container = app.test_client(), container_of(app)
    trace, call_trace = uuid.uuid4().hex, uuid.uuid4().hex
    image = {"b64": base64.b64encode(digit_png([0.0] * 28 + [16.0] * 8 + [0.0] * 28)).decode()}
    submitted = client.post("/jobs", headers={**auth, "traceparent": f"00-{trace}-{'1' * 16}-01"},
                            json={"model": "digit-photo", "inputs": {"image": [image]},
                                  "webhook": {"url": f"{receiver.url}/hook",
                                              "events": ["job.succeeded"]}})  # fmt: skip
    assert submitted.status_code == 202, submitted.json
    job = wait_for_job(client, auth, submitted.json["id"], 120)
    assert job["status"] == "succeeded" and job["trace_id"] == trace

    sender = WebhookOperations(container.parts.database, DeliverySettings.of(own))

    def delivered() -> bool:  # (what beat's sweep and the webhook sender do)
        with container.scope():
            for delivery_id in sender.send_due(lambda _id: None):
                sender.deliver(delivery_id)
        return receiver.hooks > 0

    wait_until(delivered, "the webhook delivered", 60, 0.2)
    tensor = {"name": "image", "shape": [1], "datatype": "BYTES", "data": [image]}
    caller = {**auth, "traceparent": f"00-{call_trace}-{'2' * 16}-01"}
    sync = client.post("/v2/models/digit-photo/infer", json={"inputs": [tensor]}, headers=caller)
    assert sync.status_code == 200, sync.json

    worker_side = {("inference-worker", n) for n in (
        "queue wait", "run", "step decode", "step classify", "step answer")}  # fmt: skip
    wanted = worker_side | {("test-api", "admission"), ("test-api", "webhook delivery")}
    wait_until(lambda: wanted <= receiver.names(trace), f"the job's spans (got "
               f"{sorted(receiver.names(trace))})", 60, 0.2)  # fmt: skip
    wait_until(lambda: {("inference-worker", "run"), ("inference-worker", "queue wait")}
               <= receiver.names(call_trace), "the sync call's spans", 60, 0.2)  # fmt: skip
    spans = {s["name"]: s for s in receiver.spans if s["trace"] == trace}
    assert spans["admission"]["parent"] == "1" * 16  # under the caller's span
    assert spans["run"]["parent"] == spans["admission"]["id"]
    assert spans["step classify"]["parent"] == spans["run"]["id"]
    batches = [s for s in receiver.spans if s["name"] == "model run" and trace in s["links"]]
    assert batches and batches[0]["trace"] != trace  # the micro-batch's own, linked to the run
