"""A GGUF model of a user's own (Llama 3's chat template) added while the bundled
chat model streams to other clients: it answers at once on every door that
generates (the `openai` client's streamed chat, a job, KServe v2 over HTTP and
gRPC), the same greedy text on each, and once removed every door says it is not
there; the other clients' streams go on whole throughout."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import openai
import pytest
import tritonclient.grpc as triton
from flask import Flask

from app.grpc.server import Running
from app.web.context import container_of
from tests.conftest import TenantAuth, WorkerProcess, job_run
from tests.generation.tiny_gguf import LLAMA3, write_tiny
from tests.grpc.conftest import grpc_server  # noqa: F401  (the fixture)
from tests.support import LiveServer, wait_until

pytestmark = pytest.mark.processes

GREEDY = {"max_tokens": 6, "temperature": 0}
ASKED = [{"role": "user", "content": "the he"}]


class Streams:
    """Clients streaming the bundled model's chat, one call after another."""

    def __init__(self, client: openai.OpenAI, clients: int) -> None:
        self.client, self.texts, self.errors = client, [], []  # type: ignore[var-annotated]
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(clients)]
        for thread in self._threads:
            thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                chunks = self.client.chat.completions.create(
                    model="smollm2", messages=ASKED, stream=True, **GREEDY  # type: ignore[arg-type]
                )  # fmt: skip
                self.texts.append("".join(c.choices[0].delta.content or "" for c in chunks
                                          if c.choices))  # fmt: skip
            except Exception as exc:  # (counted, and the test fails on it)
                self.errors.append(repr(exc))

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(120)


def test_an_own_gguf_added_while_the_chat_model_streams_answers_on_every_door(
    app: Flask, serve: Callable[[Flask], LiveServer], tenant: TenantAuth,
    worker: WorkerProcess, grpc_server: Running, tmp_path: Path,  # noqa: F811
) -> None:  # fmt: skip
    server = serve(app)
    key = tenant.headers["Authorization"].split(" ", 1)[1]
    chat = openai.OpenAI(base_url=f"{server.url}/v1", api_key=key, max_retries=0, timeout=120)
    plane = container_of(app)
    http = app.test_client()
    load = Streams(chat, 2)
    name = f"own-{uuid.uuid4().hex[:8]}"
    try:
        wait_until(lambda: len(load.texts) >= 2, "the bundled model's first streams", 120)
        source = write_tiny(tmp_path / "llama3.gguf", template=LLAMA3, bos="<|begin_of_text|>",
                            add_bos=True)  # fmt: skip
        plane.models.add(source, name, weights="fp32")

        def streamed() -> str | None:  # (each API process sees the model within a second)
            try:
                chunks = chat.chat.completions.create(model=name, messages=ASKED,  # type: ignore[arg-type]
                                                      stream=True, **GREEDY)  # fmt: skip
                return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            except openai.NotFoundError:
                return None

        text = wait_until(streamed, "the added model on /v1", 60)
        body = {"model": name, "inputs": {"messages": ASKED}, "parameters": GREEDY}
        job = job_run(http, tenant.headers, body)
        assert job["status"] == "succeeded" and job["outputs"]["text"] == text, job
        assert job["outputs"]["completion_tokens"] >= 1, job

        prompt = "the he"
        kserve = {"inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [1],
                              "data": [prompt]}], "parameters": GREEDY}  # fmt: skip
        answered = http.post(f"/v2/models/{name}/infer", json=kserve, headers=tenant.headers)
        assert answered.status_code == 200, answered.json
        [over_http] = answered.json["outputs"][0]["data"]
        grpc = triton.InferenceServerClient(f"127.0.0.1:{grpc_server.port}")
        try:
            tensor = triton.InferInput("text_input", [1], "BYTES")
            tensor.set_data_from_numpy(np.array([prompt.encode()], dtype=object))
            authorization = {"authorization": tenant.headers["Authorization"]}
            result = grpc.infer(name, [tensor], parameters=GREEDY, headers=authorization)
            assert result.as_numpy("text_output").tolist() == [over_http.encode()]
        finally:
            grpc.close()
    finally:
        plane.models.remove(name)

    def refused() -> Any:
        answered = http.post("/jobs", json=body, headers=tenant.headers)
        return answered if answered.status_code == 404 else None

    assert "is not in the repository" in wait_until(refused, "the removed model refused", 30).text
    with pytest.raises(openai.NotFoundError):
        chat.chat.completions.create(model=name, messages=ASKED, **GREEDY)  # type: ignore[arg-type]
    assert http.post(f"/v2/models/{name}/infer", json=kserve,
                     headers=tenant.headers).status_code == 404  # fmt: skip
    load.stop()
    assert not load.errors, load.errors[:3]
    assert len(load.texts) >= 3 and len(set(load.texts)) == 1, set(load.texts)  # greedy: whole
