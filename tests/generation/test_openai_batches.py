"""Batches in OpenAI's Batch format through /v1/files and /v1/batches, driven by the
official `openai` client over real HTTP, each line a chunk job run by a real
worker's decode loop."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from typing import Any

import openai
import pytest
from flask import Flask
from flask.testing import FlaskClient
from openai.types import Batch

from app.platform.database import Database
from tests.conftest import TenantAuth, WorkerProcess, make_tenant
from tests.support import LiveServer, wait_until

pytestmark = pytest.mark.processes

CHAT = "/v1/chat/completions"
TOPICS = ["the sea", "a cat", "winter", "music", "bread", "a river", "the moon", "trees"]


@pytest.fixture
def server(app: Flask, serve: Callable[[Flask], LiveServer], worker: WorkerProcess) -> LiveServer:
    return serve(app)


def client_for(server: LiveServer, tenant: TenantAuth) -> openai.OpenAI:
    key = tenant.headers["Authorization"].split(" ", 1)[1]
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=key, max_retries=0, timeout=60)


@pytest.fixture
def client_of(server: LiveServer, tenant: TenantAuth) -> openai.OpenAI:
    return client_for(server, tenant)


def line(custom_id: str, body: dict[str, Any], url: str = CHAT) -> str:
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": url, "body": body})


def chat(i: int, **extra: Any) -> dict[str, Any]:
    messages = [{"role": "user", "content": f"Say one word about {TOPICS[i % len(TOPICS)]}."}]
    return {"model": "smollm2", "messages": messages, "max_tokens": 2 + i % 3, "temperature": 0,
            **extra}  # fmt: skip


def upload(client: openai.OpenAI, lines: list[str]) -> str:
    data = ("\n".join(lines) + "\n").encode()
    file = client.files.create(file=("requests.jsonl", data), purpose="batch")
    assert file.bytes == len(data) and file.purpose == "batch" and file.id.startswith("file-")
    return file.id


def wait(client: openai.OpenAI, batch_id: str, timeout: float = 120) -> Batch:
    def ended() -> Batch | None:
        batch = client.batches.retrieve(batch_id)
        return batch if batch.status in ("completed", "failed", "cancelled", "expired") else None

    return wait_until(ended, f"batch {batch_id} to end", timeout, interval=0.5)


def jsonl(client: openai.OpenAI, file_id: str | None) -> list[dict[str, Any]]:
    assert file_id is not None
    return [json.loads(text) for text in client.files.content(file_id).text.splitlines()]


def test_a_file_of_200_requests_answers_197_and_names_3_errors(
    client_of: openai.OpenAI, client: FlaskClient, auth: dict[str, str]
) -> None:
    """Bad lines never stop the others: a line that is not JSON, one for another url
    and one whose body the /v1 door refuses land in the error file; the rest are
    answered in input order with the body /v1/chat/completions gives."""
    lines = [line(f"request-{i}", chat(i)) for i in range(200)]
    lines[17] = '{"custom_id": "request-17", "method": "POST", not json'
    lines[88] = line("request-88", chat(88), url="/v1/embeddings")
    lines[150] = line("request-150", chat(150, max_tokens=-1))
    file_id = upload(client_of, lines)
    started = time.monotonic()
    batch = client_of.batches.create(
        input_file_id=file_id, endpoint=CHAT, completion_window="24h",
        metadata={"purpose": "test"},
    )  # fmt: skip
    assert batch.status in ("validating", "in_progress") and batch.input_file_id == file_id
    done = wait(client_of, batch.id, timeout=240)
    took = time.monotonic() - started
    print(f"200-line batch: {took:.1f} s from create to completed")
    assert done.status == "completed", done
    assert done.request_counts is not None
    assert (done.request_counts.total, done.request_counts.completed) == (200, 197)
    assert done.request_counts.failed == 3 and done.metadata == {"purpose": "test"}
    assert done.completed_at is not None and done.in_progress_at is not None

    answers = jsonl(client_of, done.output_file_id)
    good = [i for i in range(200) if i not in (17, 88, 150)]
    assert [a["custom_id"] for a in answers] == [f"request-{i}" for i in good]
    for answer in answers:
        assert answer["error"] is None and answer["id"].startswith("batch_req_")
        response = answer["response"]
        assert response["status_code"] == 200 and response["request_id"]
        body = response["body"]
        assert body["object"] == "chat.completion" and body["model"] == "smollm2"
        assert body["choices"][0]["message"]["content"].strip()
        assert 1 <= body["usage"]["completion_tokens"] <= 4
    # the same lines run alike: greedy decoding of the same prompt
    texts = {a["custom_id"]: a["response"]["body"]["choices"][0]["message"]["content"]
             for a in answers}  # fmt: skip
    assert texts["request-0"] == texts["request-24"]

    errors = jsonl(client_of, done.error_file_id)
    assert [e["custom_id"] for e in errors] == [None, "request-88", "request-150"]
    not_json, wrong_url, refused = errors
    assert not_json["response"] is None and not_json["error"]["code"] == "invalid_json_line"
    assert "line 18" in not_json["error"]["message"]
    assert wrong_url["response"] is None and wrong_url["error"]["code"] == "invalid_url"
    assert refused["error"] is None and refused["response"]["status_code"] == 422
    error = refused["response"]["body"]["error"]
    assert error["param"] == "max_tokens" and error["type"] == "invalid_request_error"

    # The same batch at the batch door, by its id
    native = client.get(f"/batches/{uuid.UUID(done.id.removeprefix('batch_'))}", headers=auth)
    assert native.json["rows_done"] == 197 and native.json["rows_failed"] == 3  # type: ignore[index]
    output = client_of.files.retrieve(done.output_file_id or "")
    assert output.purpose == "batch_output"
    assert output.bytes == len(client_of.files.content(output.id).content)


def test_a_repeated_custom_id_or_a_second_model_refuses_the_file(
    client_of: openai.OpenAI,
) -> None:
    twice = upload(client_of, [line("a", chat(0)), line("b", chat(1)), line("a", chat(2))])
    with pytest.raises(openai.BadRequestError) as caught:
        client_of.batches.create(input_file_id=twice, endpoint=CHAT, completion_window="24h")
    assert "custom_id 'a' is line 1's too" in caught.value.message
    assert isinstance(caught.value.body, dict) and caught.value.body["param"] == "input_file_id"
    models = upload(client_of, [line("a", chat(0)), line("b", chat(1, model="digits"))])
    with pytest.raises(openai.BadRequestError) as caught:
        client_of.batches.create(input_file_id=models, endpoint=CHAT, completion_window="24h")
    assert "one model" in caught.value.message
    # Past the first MiB the file is read by the worker: the batch fails validating,
    # before any of its requests runs.
    padding = "word " * 2000
    far = [line(f"r{i}", chat(i, messages=[{"role": "user", "content": padding}]))
           for i in range(120)] + [line("r3", chat(3))]  # fmt: skip
    batch = client_of.batches.create(
        input_file_id=upload(client_of, far), endpoint=CHAT, completion_window="24h"
    )
    failed = wait(client_of, batch.id)
    assert failed.status == "failed" and failed.errors and failed.errors.data
    assert failed.errors.data[0].code == "duplicate_custom_id"
    assert "line 121" in (failed.errors.data[0].message or "")
    assert failed.request_counts is not None and failed.request_counts.completed == 0


def test_text_completions_and_another_tenants_view(
    client_of: openai.OpenAI, server: LiveServer, database: Database
) -> None:
    body = {"model": "smollm2", "prompt": "The capital of France is", "max_tokens": 2,
            "temperature": 0}  # fmt: skip
    lines = [line("x", body, "/v1/completions"), line("y", {**body, "max_tokens": 3},
                                                      "/v1/completions")]  # fmt: skip
    file_id = upload(client_of, lines)
    batch = client_of.batches.create(
        input_file_id=file_id, endpoint="/v1/completions", completion_window="24h"
    )
    done = wait(client_of, batch.id)
    answers = jsonl(client_of, done.output_file_id)
    bodies = [a["response"]["body"] for a in answers]
    assert [b["choices"][0]["text"] for b in bodies] == [" Paris.", " Paris.\n"]
    assert {b["object"] for b in bodies} == {"text_completion"} and done.error_file_id is None
    assert next(iter(client_of.batches.list(limit=5))).id == batch.id
    assert client_of.files.content(file_id).content.decode().count("\n") == 2

    other = client_for(server, make_tenant(database))
    for call in (
        lambda: other.batches.retrieve(batch.id),
        lambda: other.batches.cancel(batch.id),
        lambda: other.files.retrieve(file_id),
        lambda: other.files.content(file_id),
        lambda: other.files.content(done.output_file_id or ""),
        lambda: other.batches.create(
            input_file_id=file_id, endpoint="/v1/completions", completion_window="24h"
        ),
    ):
        with pytest.raises(openai.NotFoundError):
            call()
    assert list(other.batches.list()) == []


def test_a_cancelled_batch_keeps_what_finished(client_of: openai.OpenAI) -> None:
    lines = [line(f"c{i}", chat(i, max_tokens=200)) for i in range(24)]
    batch = client_of.batches.create(
        input_file_id=upload(client_of, lines), endpoint=CHAT, completion_window="24h"
    )
    wait_until(lambda: client_of.batches.retrieve(batch.id).status == "in_progress" or None,
               "the batch's lines to be cut", interval=0.2)  # fmt: skip
    cancelling = client_of.batches.cancel(batch.id)
    assert cancelling.status in ("cancelling", "cancelled")
    done = wait(client_of, batch.id)
    assert done.status == "cancelled" and done.cancelled_at is not None
    counts = done.request_counts
    assert counts is not None and counts.failed >= 1
    errors = jsonl(client_of, done.error_file_id)
    assert {e["error"]["code"] for e in errors} == {"batch_cancelled"}
    assert len(errors) == counts.failed
    with pytest.raises(openai.ConflictError):
        client_of.batches.cancel(batch.id)
