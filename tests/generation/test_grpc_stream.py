"""The chat model on ModelStreamInfer, read with tritonclient as a Triton decoupled
model is: a response per piece of text, then (when asked) an empty one flagged
`triton_final_response`; a client that leaves cancels its generation."""

from __future__ import annotations

import json
import threading
from typing import Any

import jsonschema
import numpy as np
import pytest
import tritonclient.grpc as triton
from flask.testing import FlaskClient
from sklearn.datasets import load_digits
from tritonclient.utils import InferenceServerException

from app.grpc.server import Running
from tests.conftest import TenantAuth, WorkerProcess, wait_for_job
from tests.generation.schemas import PERSON
from tests.generation.test_doors import PROMPT
from tests.generation.test_openai import PERSON_FORMAT
from tests.grpc.conftest import grpc_server  # noqa: F401  (the fixture)
from tests.support import wait_until

pytestmark = pytest.mark.processes

GREEDY = {"max_tokens": 16, "temperature": 0}


class Responses:
    """What a stream's callback received, in order, by request id (errors apart)."""

    def __init__(self) -> None:
        self.by_id: dict[str, list[Any]] = {}
        self.errors: list[InferenceServerException] = []
        self._lock = threading.Lock()

    def __call__(self, result: Any, error: InferenceServerException | None) -> None:
        with self._lock:
            if error is not None:
                self.errors.append(error)
            else:
                self.by_id.setdefault(result.get_response().id, []).append(result)

    def of(self, request_id: str) -> list[Any]:
        with self._lock:
            return list(self.by_id.get(request_id, []))


def final(result: Any) -> bool | None:
    """The response's `triton_final_response`, None when it has none."""
    parameters = result.get_response().parameters
    if "triton_final_response" not in parameters:
        return None
    return bool(parameters["triton_final_response"].bool_param)


def text_of(result: Any) -> str:
    array = result.as_numpy("text_output")
    assert array is not None and array.shape == (1,), array
    return str(array[0].decode())


def prompt() -> triton.InferInput:
    text = triton.InferInput("text_input", [1], "BYTES")
    text.set_data_from_numpy(np.array([PROMPT.encode()], dtype=object))
    return text


def key_of(tenant: TenantAuth) -> dict[str, str]:
    return {"authorization": tenant.headers["Authorization"]}


def whole_text(client: triton.InferenceServerClient, tenant: TenantAuth) -> str:
    """The same greedy request's text, from unary ModelInfer."""
    result = client.infer("smollm2", [prompt()], headers=key_of(tenant), parameters=GREEDY)
    return text_of(result)


def test_stream_infer_sends_each_piece_then_an_empty_final_response(
    grpc_server: Running,  # noqa: F811
    tenant: TenantAuth,
    worker: WorkerProcess,
    client: FlaskClient,
) -> None:
    triton_client = triton.InferenceServerClient(f"127.0.0.1:{grpc_server.port}")
    responses = Responses()
    try:
        whole = whole_text(triton_client, tenant)
        pixels = triton.InferInput("pixels", [1, 64], "FP32")
        pixels.set_data_from_numpy(load_digits().data[:1].astype(np.float32))
        triton_client.start_stream(responses, headers=key_of(tenant))
        triton_client.async_stream_infer(
            "smollm2", [prompt()], request_id="chat", parameters=GREEDY,
            enable_empty_final_response=True,
        )  # fmt: skip
        triton_client.async_stream_infer("digits", [pixels], request_id="digit")
        triton_client.stop_stream()  # returns once every request was answered
    finally:
        triton_client.close()
    assert not responses.errors, responses.errors
    chat = responses.of("chat")
    flags = [final(result) for result in chat]
    assert flags[-1] is True and flags[:-1] == [False] * (len(chat) - 1), flags
    pieces, last = chat[:-1], chat[-1]
    assert len(pieces) > 1, "the text came in one piece"
    assert last.as_numpy("text_output") is None  # the final response is empty
    assert "".join(text_of(result) for result in pieces) == whole
    job_ids = {result.get_response().parameters["job_id"].string_param for result in chat}
    assert len(job_ids) == 1
    job = wait_for_job(client, tenant.headers, job_ids.pop())
    assert job["status"] == "succeeded" and job["outputs"]["text"] == whole
    assert job["outputs"]["completion_tokens"] == 16
    [digit] = responses.of("digit")  # a model that is not generative: one answer, as before
    assert digit.as_numpy("label").shape == (1,)
    assert "triton_final_response" not in digit.get_response().parameters
    assert digit.get_response().parameters["job_id"].string_param


def test_without_an_empty_final_response_the_pieces_come_and_the_stream_ends(
    grpc_server: Running,  # noqa: F811
    tenant: TenantAuth,
    worker: WorkerProcess,
) -> None:
    """As from Triton for a model that sends its final flag on its own: no final
    response, every piece flagged not final; the client knows it has them all
    when the stream ends (`stop_stream` returns)."""
    triton_client = triton.InferenceServerClient(f"127.0.0.1:{grpc_server.port}")
    responses = Responses()
    try:
        whole = whole_text(triton_client, tenant)
        triton_client.start_stream(responses, headers=key_of(tenant))
        triton_client.async_stream_infer("smollm2", [prompt()], request_id="chat",
                                         parameters=GREEDY)  # fmt: skip
        triton_client.stop_stream()
    finally:
        triton_client.close()
    assert not responses.errors, responses.errors
    chat = responses.of("chat")
    assert chat and all(final(result) is False for result in chat)
    assert "".join(text_of(result) for result in chat) == whole


def test_a_stream_cut_mid_generation_cancels_it(
    grpc_server: Running,  # noqa: F811
    tenant: TenantAuth,
    worker: WorkerProcess,
    client: FlaskClient,
) -> None:
    triton_client = triton.InferenceServerClient(f"127.0.0.1:{grpc_server.port}")
    responses = Responses()
    text = triton.InferInput("text_input", [1], "BYTES")
    text.set_data_from_numpy(np.array([b"Once upon a time"], dtype=object))
    try:
        triton_client.start_stream(responses, headers=key_of(tenant))
        long = {"max_tokens": 2000, "temperature": 0}
        triton_client.async_stream_infer("smollm2", [text], request_id="long", parameters=long)
        wait_until(lambda: len(responses.of("long")) >= 3, "three pieces", 60)
        triton_client.stop_stream(cancel_requests=True)  # the client goes away mid-answer
    finally:
        triton_client.close()
    job_id = responses.of("long")[0].get_response().parameters["job_id"].string_param
    job = wait_for_job(client, tenant.headers, job_id, timeout=30)
    assert job["status"] == "cancelled"
    assert 0 < job["outputs"]["completion_tokens"] < 2000


def test_a_response_format_as_json_in_a_string_parameter_shapes_the_answer(
    grpc_server: Running,  # noqa: F811
    tenant: TenantAuth,
    worker: WorkerProcess,
) -> None:
    """gRPC's parameters are scalars: the schema comes as its JSON in a string, as
    Triton's vLLM backend takes its guided-decoding options."""
    client = triton.InferenceServerClient(f"127.0.0.1:{grpc_server.port}")
    asked = {**GREEDY, "max_tokens": 60, "response_format": json.dumps(PERSON_FORMAT)}
    text = triton.InferInput("text_input", [1], "BYTES")
    text.set_data_from_numpy(np.array([b"Tom Baker is 87 years old."], dtype=object))
    result = client.infer("smollm2", [text], headers=key_of(tenant), parameters=asked)
    jsonschema.validate(json.loads(text_of(result)), PERSON)
    with pytest.raises(InferenceServerException) as caught:
        client.infer("smollm2", [text], headers=key_of(tenant),
                     parameters={**asked, "response_format": "{not json"})  # fmt: skip
    assert "response_format" in str(caught.value) and "INVALID_ARGUMENT" in str(caught.value)
