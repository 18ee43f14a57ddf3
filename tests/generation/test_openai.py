"""The OpenAI-compatible door, driven by the official `openai` client over real HTTP,
each call a job run by a real worker's decode loop."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import openai
import pytest
from flask import Flask
from flask.testing import FlaskClient

from tests.conftest import TenantAuth, WorkerProcess, wait_for_job
from tests.support import LiveServer

pytestmark = pytest.mark.processes

CHAT = [{"role": "user", "content": "What is 2+2?"}]


@pytest.fixture
def client_of(
    app: Flask, serve: Callable[[Flask], LiveServer], tenant: TenantAuth, worker: WorkerProcess
) -> openai.OpenAI:
    server = serve(app)
    key = tenant.headers["Authorization"].split(" ", 1)[1]
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=key, max_retries=0, timeout=120)


def test_a_chat_completion_is_a_job_with_its_usage(
    client_of: openai.OpenAI, client: FlaskClient, auth: dict[str, str]
) -> None:
    answer = client_of.chat.completions.create(
        model="smollm2",
        messages=CHAT,
        temperature=0,
        max_tokens=30,  # type: ignore[arg-type]
    )
    text = answer.choices[0].message.content
    assert text == "The answer to this classic math problem is 4."
    assert answer.choices[0].finish_reason == "stop"
    assert answer.usage is not None and answer.usage.completion_tokens == 11
    job = wait_for_job(client, auth, str(uuid.UUID(answer.id)))
    assert job["status"] == "succeeded" and job["outputs"]["text"] == text
    assert job["outputs"]["prompt_tokens"] == answer.usage.prompt_tokens
    report = client.get("/usage", headers=auth).get_json()
    (row,) = [m for m in report["models"] if m["model"] == "smollm2"]
    assert row["prompt_tokens"] == answer.usage.prompt_tokens
    assert row["completion_tokens"] == 11
    assert row["total_tokens"] == answer.usage.total_tokens == report["total"]["total_tokens"]


def test_a_streamed_chat_joins_to_the_whole_answer(client_of: openai.OpenAI) -> None:
    stream = client_of.chat.completions.create(
        model="smollm2", messages=CHAT, temperature=0, max_tokens=30, stream=True,  # type: ignore[arg-type]
        stream_options={"include_usage": True},
    )  # fmt: skip
    chunks = list(stream)
    pieces = [c.choices[0].delta.content or "" for c in chunks if c.choices]
    assert "".join(pieces) == "The answer to this classic math problem is 4."
    assert len([p for p in pieces if p]) >= 2, "the text came in more than one piece"
    reasons = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert reasons[-1] == "stop" and set(reasons[:-1]) == {None}
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 11
    assert len({c.id for c in chunks}) == 1


def test_a_text_completion_continues_the_prompt(client_of: openai.OpenAI) -> None:
    answer = client_of.completions.create(
        model="smollm2", prompt="The capital of France is", temperature=0, max_tokens=2
    )
    assert answer.choices[0].text == " Paris."
    assert answer.choices[0].finish_reason == "length"
    streamed = client_of.completions.create(
        model="smollm2", prompt="The capital of France is", temperature=0, max_tokens=2,
        stream=True,
    )  # fmt: skip
    assert "".join(c.choices[0].text for c in streamed) == " Paris."


def test_models_lists_the_generative_ones(client_of: openai.OpenAI) -> None:
    assert [m.id for m in client_of.models.list()] == ["smollm2"]


@pytest.mark.parametrize(
    ("change", "param", "words"),
    [
        ({"max_tokens": 100_000}, "max_tokens", "from 1 to 2048"),
        ({"temperature": "hot"}, "temperature", "expected a number"),
        ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages[0].role", "unknown role"),
        ({"frequency_penalty": 1.5}, "frequency_penalty", "only 0"),
        ({"logit_bias": {"1": 2}}, "logit_bias", "not supported"),
        ({"model": "digits"}, "model", "does not generate"),
        ({"messages": [{"role": "user", "content": "word " * 9000}]}, "messages", "context"),
    ],
)
def test_bad_requests_are_openai_errors_naming_the_field(
    client_of: openai.OpenAI, change: dict[str, Any], param: str, words: str
) -> None:
    """400 for what the door itself refuses, 422 for inputs the model cannot take
    (as on every door); either way OpenAI's error object, naming the field."""
    body: dict[str, Any] = {"model": "smollm2", "messages": CHAT, **change}
    with pytest.raises(openai.APIStatusError) as caught:
        client_of.chat.completions.create(**body)
    assert caught.value.status_code in (400, 422)
    error = caught.value.body
    assert isinstance(error, dict), error
    assert error["param"] == param and words in error["message"], error
    assert error["type"] == "invalid_request_error"


def test_a_wrong_key_is_an_openai_authentication_error(client_of: openai.OpenAI) -> None:
    other = client_of.with_options(api_key="not-a-key")
    with pytest.raises(openai.AuthenticationError) as caught:
        other.models.list()
    assert caught.value.status_code == 401
    assert (
        isinstance(caught.value.body, dict) and caught.value.body["type"] == "authentication_error"
    )
