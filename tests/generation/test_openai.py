"""The OpenAI-compatible door, driven by the official `openai` client over real HTTP,
each call a job run by a real worker's decode loop."""

from __future__ import annotations

import base64
import json
import math
import uuid
from collections.abc import Callable
from typing import Any

import jsonschema
import numpy as np
import openai
import pytest
from flask import Flask
from flask.testing import FlaskClient
from tokenizers import Tokenizer

from app.platform.settings import ROOT
from tests.conftest import TenantAuth, WorkerProcess, wait_for_job
from tests.generation.schemas import PERSON, messages, response_format
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
        ({"frequency_penalty": 2.5}, "frequency_penalty", "from -2 to 2"),
        ({"logit_bias": {"1": 200}}, "logit_bias", "from -100 to 100"),
        ({"logit_bias": {"60000": 1}}, "logit_bias", "not in this model's vocabulary"),
        ({"top_logprobs": 21, "logprobs": True}, "top_logprobs", "from 0 to 20"),
        ({"n": 9}, "n", "at most 8"),
        ({"response_format": {"type": "yaml"}}, "response_format", "json_schema"),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {
                        "name": "x",
                        "strict": True,
                        "schema": {
                            "type": "array",
                            "items": {"type": "integer"},
                            "uniqueItems": True,
                        },
                    },
                }
            },
            "response_format.json_schema.schema",
            "uniqueItems",
        ),
        (
            {
                "max_tokens": 3,
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {
                        "name": "x",
                        "schema": {
                            "type": "object",
                            "required": ["name"],
                            "properties": {"name": {"type": "string"}},
                        },
                    },
                },
            },
            "max_tokens",
            "shortest answer",
        ),
        ({"model": "digits"}, "model", "does not generate"),
        ({"messages": [{"role": "user", "content": "word " * 9000}]}, "messages", "context"),
    ],
)
def test_bad_requests_are_openai_errors_naming_the_field(
    client_of: openai.OpenAI, change: dict[str, Any], param: str, words: str
) -> None:
    """400 with OpenAI's error object, naming the field: for what the door itself
    refuses and for inputs the model cannot take (422 on the other doors)."""
    body: dict[str, Any] = {"model": "smollm2", "messages": CHAT, **change}
    with pytest.raises(openai.APIStatusError) as caught:
        client_of.chat.completions.create(**body)
    assert caught.value.status_code == 400
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


PERSON_FORMAT = response_format("person", PERSON)


def test_a_json_schema_answer_parses_and_validates_whole_and_streamed(
    client_of: openai.OpenAI,
) -> None:
    """The official client's own structured-output helper parses the answer."""
    asked = {"model": "smollm2", "messages": messages("Maria, aged 29, works as a nurse."),
             "temperature": 0, "max_tokens": 80, "response_format": PERSON_FORMAT}  # fmt: skip
    answer = client_of.chat.completions.create(**asked)
    text = answer.choices[0].message.content or ""
    jsonschema.validate(json.loads(text), PERSON)
    assert answer.choices[0].finish_reason == "stop"
    streamed = client_of.chat.completions.create(**asked, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == text


def test_log_probabilities_come_in_openai_s_shapes(client_of: openai.OpenAI) -> None:
    answer = client_of.chat.completions.create(
        model="smollm2", messages=CHAT, temperature=0, max_tokens=6, logprobs=True,
        top_logprobs=3,
    )  # fmt: skip
    logprobs = answer.choices[0].logprobs
    assert logprobs is not None and logprobs.content is not None
    assert "".join(t.token for t in logprobs.content) == answer.choices[0].message.content
    for token in logprobs.content:
        tops = [t.logprob for t in token.top_logprobs]
        assert len(tops) == 3 and tops == sorted(tops, reverse=True)
        assert token.logprob == tops[0] <= 0  # greedy: the pick is the likeliest
        assert sum(math.exp(t) for t in tops) <= 1.0
    streamed = client_of.chat.completions.create(
        model="smollm2", messages=CHAT, temperature=0, max_tokens=6, logprobs=True,
        top_logprobs=3, stream=True,
    )  # fmt: skip
    entries = [t for c in streamed if c.choices and c.choices[0].logprobs
               for t in c.choices[0].logprobs.content or ()]  # fmt: skip
    assert [t.model_dump() for t in entries] == [t.model_dump() for t in logprobs.content]
    legacy = client_of.completions.create(
        model="smollm2", prompt="The capital of France is", temperature=0, max_tokens=2,
        logprobs=2,
    )  # fmt: skip
    columns = legacy.choices[0].logprobs
    assert columns is not None and "".join(columns.tokens or ()) == " Paris."
    assert columns.text_offset == [0, len(columns.tokens[0])]  # type: ignore[index]
    assert all(len(top) == 2 for top in columns.top_logprobs or ())


def test_a_job_takes_the_same_parameters_and_keeps_the_log_probabilities(
    client: FlaskClient, auth: dict[str, str], worker: WorkerProcess
) -> None:
    body = {"model": "smollm2", "inputs": {"messages": messages("Kenji is 31.")},
            "parameters": {"temperature": 0, "max_tokens": 60, "response_format": PERSON_FORMAT,
                           "logprobs": True, "presence_penalty": 0.5}}  # fmt: skip
    created = client.post("/jobs", json=body, headers=auth)
    assert created.status_code == 202, created.get_json()
    job = wait_for_job(client, auth, created.get_json()["id"])
    assert job["status"] == "succeeded", job
    jsonschema.validate(json.loads(job["outputs"]["text"]), PERSON)
    entries = json.loads(job["outputs"]["logprobs"])
    assert "".join(e["token"] for e in entries) == job["outputs"]["text"]
    bad = client.post("/jobs", headers=auth, json={**body, "parameters": {
        "response_format": {"type": "json_schema", "json_schema": {
            "schema": {"type": "object", "not": {}}, "strict": True}}}})  # fmt: skip
    assert bad.status_code == 422 and bad.mimetype == "application/problem+json"
    assert '"not"' in bad.get_json()["errors"]["response_format.json_schema.schema"]


def test_embeddings_equal_the_job_door_s_vectors(
    client_of: openai.OpenAI, client: FlaskClient, auth: dict[str, str]
) -> None:
    texts = ["A cat sat on the mat.", "Stock markets fell sharply on Monday."]
    made = client_of.embeddings.create(model="minilm", input=texts)
    assert [d.index for d in made.data] == [0, 1] and len(made.data[0].embedding) == 384
    assert made.usage.prompt_tokens == made.usage.total_tokens > 10
    created = client.post("/jobs", json={"model": "minilm", "inputs": {"text": texts}},
                          headers=auth)  # fmt: skip
    job = wait_for_job(client, auth, created.get_json()["id"])
    for got, want in zip(made.data, job["outputs"]["embedding"], strict=True):
        a, b = np.array(got.embedding), np.array(want)
        assert a @ b / np.linalg.norm(a) / np.linalg.norm(b) >= 0.9999
    # The client asks for base64 by default and decodes it; token arrays are decoded
    # with the model's tokenizer.
    floats = client_of.embeddings.create(model="minilm", input=texts[0], encoding_format="float")
    assert floats.data[0].embedding == pytest.approx(made.data[0].embedding, abs=1e-6)
    packed = client_of.embeddings.create(model="minilm", input=texts[0], encoding_format="base64")
    raw = base64.b64decode(packed.data[0].embedding)  # type: ignore[arg-type]
    assert np.frombuffer(raw, "<f4").tolist() == pytest.approx(made.data[0].embedding, abs=1e-6)
    ids = Tokenizer.from_file(str(ROOT / "models/minilm/1/tokenizer.json")).encode(texts[0]).ids
    from_ids = client_of.embeddings.create(model="minilm", input=[ids[1:-1]])
    assert from_ids.data[0].embedding == pytest.approx(made.data[0].embedding, abs=1e-5)


@pytest.mark.parametrize(
    ("change", "param", "words"),
    [
        ({"input": "word " * 300}, "input", "more than 256 tokens"),
        ({"input": ["fine", ""]}, "input[1]", "non-empty"),
        ({"input": [[1, 2, 10**7]]}, "input[0]", "vocabulary"),
        ({"input": ""}, "input", "non-empty"),
        ({"model": "smollm2"}, "model", "does not make embeddings"),
        ({"dimensions": 128}, "dimensions", "384"),
        ({"encoding_format": "int8"}, "encoding_format", "base64"),
    ],
)
def test_bad_embedding_requests_name_the_field(
    client_of: openai.OpenAI, change: dict[str, Any], param: str, words: str
) -> None:
    body: dict[str, Any] = {"model": "minilm", "input": "hello", **change}
    with pytest.raises(openai.BadRequestError) as caught:
        client_of.embeddings.create(**body)
    error = caught.value.body
    assert isinstance(error, dict) and error["param"] == param and words in error["message"]


def test_labels_are_scored_with_their_probabilities_on_both_doors(
    client_of: openai.OpenAI, client: FlaskClient, auth: dict[str, str]
) -> None:
    ask = "Is the sentiment of this review positive, negative or neutral? Answer with one word."
    chat = [{"role": "user", "content": f"{ask}\n\nAbsolutely wonderful experience!"}]
    labels = ["positive", "negative", "neutral"]
    answer = client_of.chat.completions.create(
        model="smollm2",
        messages=chat,
        extra_body={"labels": labels},  # type: ignore[arg-type]
    )
    choice = answer.choices[0]
    scores = (choice.model_extra or {})["label_scores"]
    assert sorted(scores) == sorted(labels) and sum(scores.values()) == pytest.approx(1.0)
    assert choice.message.content == max(scores, key=scores.get) == "positive"
    body = {"model": "smollm2", "inputs": {"messages": chat}, "parameters": {"labels": labels}}
    job = wait_for_job(client, auth, client.post("/jobs", json=body, headers=auth).get_json()["id"])
    assert job["status"] == "succeeded" and job["outputs"]["text"] == "positive"
    assert json.loads(job["outputs"]["label_scores"]) == pytest.approx(scores, abs=1e-6)
    with pytest.raises(openai.BadRequestError) as caught:
        client_of.chat.completions.create(
            model="smollm2",
            messages=chat,
            extra_body={"labels": ["a", "a"]},  # type: ignore[arg-type]
        )
    assert isinstance(caught.value.body, dict) and caught.value.body["param"] == "labels[1]"


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city now",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"], "additionalProperties": False}}}  # fmt: skip
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"],
    "additionalProperties": False}}}  # fmt: skip


@pytest.mark.parametrize(
    "choice", ["required", {"type": "function", "function": {"name": "get_weather"}}]
)
def test_a_required_or_named_tool_choice_returns_arguments_that_parse(
    client_of: openai.OpenAI, choice: Any
) -> None:
    chat = [{"role": "user", "content": "What is the weather like in Paris, in celsius?"}]
    answer = client_of.chat.completions.create(
        model="smollm2", messages=chat, tools=[WEATHER, TIME], tool_choice=choice,
        temperature=0, max_tokens=80,
    )  # fmt: skip
    choice_ = answer.choices[0]
    assert choice_.finish_reason == "tool_calls" and choice_.message.content is None
    (call,) = choice_.message.tool_calls or []
    assert call.type == "function" and call.id.startswith("call_")
    schema = {"get_weather": WEATHER, "get_time": TIME}[call.function.name]
    jsonschema.validate(json.loads(call.function.arguments), schema["function"]["parameters"])
    streamed = client_of.chat.completions.create(
        model="smollm2", messages=chat, tools=[WEATHER, TIME], tool_choice=choice,
        temperature=0, max_tokens=80, stream=True,
    )  # fmt: skip
    chunks = [c for c in streamed if c.choices]
    (delta,) = [t for c in chunks for t in c.choices[0].delta.tool_calls or ()]
    assert delta.function is not None and delta.function.arguments == call.function.arguments
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    # The call and its result go back as the next turn's history.
    follow_up = client_of.chat.completions.create(
        model="smollm2", temperature=0, max_tokens=20, messages=[
            *chat, choice_.message.model_dump(exclude_none=True),  # type: ignore[list-item]
            {"role": "tool", "tool_call_id": call.id, "content": "18 degrees and sunny"}],
    )  # fmt: skip
    assert follow_up.choices[0].finish_reason in ("stop", "length")


def test_bad_tools_name_the_field(client_of: openai.OpenAI) -> None:
    for tools, choice, param in [
        (
            [{"type": "function", "function": {"name": "no spaces"}}],
            "auto",
            "tools[0].function.name",
        ),
        ([WEATHER], {"type": "function", "function": {"name": "other"}}, "tool_choice"),
    ]:
        with pytest.raises(openai.BadRequestError) as caught:
            client_of.chat.completions.create(model="smollm2", messages=CHAT, tools=tools,
                                              tool_choice=choice)  # fmt: skip
        assert isinstance(caught.value.body, dict) and caught.value.body["param"] == param


def test_n_choices_share_one_prefill_and_a_seed_repeats_them(client_of: openai.OpenAI) -> None:
    asked = {"model": "smollm2", "messages": CHAT, "temperature": 1.0, "seed": 11, "n": 3,
             "max_tokens": 12}  # fmt: skip
    answer = client_of.chat.completions.create(**asked)
    texts = [c.message.content for c in answer.choices]
    assert [c.index for c in answer.choices] == [0, 1, 2] and len(set(texts)) > 1
    again = client_of.chat.completions.create(**asked)
    assert [c.message.content for c in again.choices] == texts
    assert answer.usage is not None and answer.usage.completion_tokens == sum(
        len(c.logprobs.content) if c.logprobs and c.logprobs.content else 0
        for c in client_of.chat.completions.create(**asked, logprobs=True).choices
    )
    streamed = client_of.chat.completions.create(**asked, stream=True)
    joined = ["", "", ""]
    for chunk in streamed:
        for choice in chunk.choices:
            joined[choice.index] += choice.delta.content or ""
    assert joined == texts
    with pytest.raises(openai.BadRequestError) as caught:
        client_of.chat.completions.create(**{**asked, "n": 9})
    assert isinstance(caught.value.body, dict) and caught.value.body["param"] == "n"
