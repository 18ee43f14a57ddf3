"""Durable responses (/v1/responses) through the official `openai` client over real
HTTP: background, polled, streamed and resumed, cancelled, deleted, chained; and
a response whose API and worker are both replaced mid-generation."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import openai
import pytest
import sqlalchemy as sa
from flask import Flask

from app.cards import ModelCard
from app.generation.chat import ChatFormat
from app.jobs.transitions import take_back_expired_leases
from app.platform.database import Database
from app.platform.settings import ROOT, Settings
from app.web.context import services
from tests.conftest import TenantAuth, WorkerProcess
from tests.generation.schemas import PERSON, messages
from tests.generation.test_doors import _kill
from tests.support import LiveServer, live_server, wait_until

pytestmark = pytest.mark.processes

STORY = "Write a very long story about a dragon."


def client_for(server: LiveServer, tenant: TenantAuth) -> openai.OpenAI:
    key = tenant.headers["Authorization"].split(" ", 1)[1]
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=key, max_retries=0, timeout=120)


@pytest.fixture
def client_of(
    app: Flask, serve: Callable[[Flask], LiveServer], tenant: TenantAuth, worker: WorkerProcess
) -> openai.OpenAI:
    return client_for(serve(app), tenant)


def finished(client: openai.OpenAI, response_id: str, timeout: float = 120) -> Any:
    def done() -> bool:
        return client.responses.retrieve(response_id).status not in ("queued", "in_progress")

    wait_until(done, f"response {response_id} finished", timeout, 0.1)
    return client.responses.retrieve(response_id)


def test_a_response_answers_and_a_second_goes_on_from_it(client_of: openai.OpenAI) -> None:
    first = client_of.responses.create(
        model="smollm2", input="My name is Ada. Say hello to me.", temperature=0,
        max_output_tokens=30, metadata={"case": "chain"},
    )  # fmt: skip
    assert first.status in ("completed", "incomplete") and first.id.startswith("resp_")
    assert first.output_text
    assert first.usage is not None and first.usage.output_tokens > 0
    assert first.metadata == {"case": "chain"}
    items = client_of.responses.input_items.list(first.id)
    assert [(i.role, i.content[0].text) for i in items.data] == [  # type: ignore[union-attr]
        ("user", "My name is Ada. Say hello to me.")
    ]
    second = client_of.responses.create(
        model="smollm2", input="What is my name?", previous_response_id=first.id,
        instructions="Answer in one short sentence.", temperature=0, max_output_tokens=20,
    )  # fmt: skip
    assert second.status in ("completed", "incomplete") and second.output_text
    assert second.previous_response_id == first.id
    # It read the first's conversation after its own instructions: its prompt is
    # exactly these messages' tokens.
    card = ModelCard.load(ROOT / "models" / "smollm2" / "1")
    assert card.generation is not None
    chat = ChatFormat(card.path / "tokenizer.json", card.generation)
    turns = (("system", "Answer in one short sentence."),
             ("user", "My name is Ada. Say hello to me."), ("assistant", first.output_text),
             ("user", "What is my name?"))  # fmt: skip
    assert second.usage is not None
    assert second.usage.input_tokens == len(chat.chat_ids(turns))
    with pytest.raises(openai.BadRequestError) as caught:
        client_of.responses.create(model="smollm2", input="hi",
                                   previous_response_id=f"resp_{uuid.uuid4().hex}")  # fmt: skip
    assert isinstance(caught.value.body, dict)
    assert caught.value.body["param"] == "previous_response_id"


def test_a_background_response_is_polled_to_the_same_text_as_a_waited_one(
    client_of: openai.OpenAI,
) -> None:
    asked = {"model": "smollm2", "input": STORY, "temperature": 0, "max_output_tokens": 60}
    waited = client_of.responses.create(**asked)
    queued = client_of.responses.create(**asked, background=True)
    assert queued.status in ("queued", "in_progress") and queued.background
    done = finished(client_of, queued.id)
    assert done.status == "incomplete" and done.incomplete_details is not None  # max tokens
    assert done.output_text == waited.output_text


def test_a_structured_response_parses(client_of: openai.OpenAI) -> None:
    answer = client_of.responses.create(
        model="smollm2", input=messages("Kenji, aged 31, lives in Osaka.")[0]["content"],
        temperature=0, max_output_tokens=60,
        text={"format": {"type": "json_schema", "name": "person", "schema": PERSON,
                         "strict": True}},
    )  # fmt: skip
    jsonschema.validate(json.loads(answer.output_text), PERSON)


def test_the_stream_helper_and_a_resumed_stream_get_every_event_once(
    client_of: openai.OpenAI,
) -> None:
    short = {"model": "smollm2", "input": "What is 2+2?", "temperature": 0,
             "max_output_tokens": 100}  # fmt: skip
    with client_of.responses.stream(**short) as stream:
        kinds = [event.type for event in stream]
        answer = stream.get_final_response()
    assert kinds[:4] == ["response.created", "response.in_progress",
                         "response.output_item.added", "response.content_part.added"]  # fmt: skip
    assert kinds[-1] == "response.completed" and "response.output_text.delta" in kinds
    assert answer.output_text == client_of.responses.create(**short).output_text
    asked = {"model": "smollm2", "input": STORY, "temperature": 0, "max_output_tokens": 40}
    whole = client_of.responses.create(**asked)
    # A background stream read in part, dropped, then resumed after the last event seen.
    raw = client_of.responses.create(**asked, background=True, stream=True)
    seen = []
    for event in raw:
        seen.append(event)
        if event.type == "response.output_text.delta" and len(seen) > 6:
            break
    raw.close()
    response_id = seen[0].response.id  # type: ignore[union-attr]
    resumed = client_of.responses.retrieve(
        response_id, stream=True, starting_after=seen[-1].sequence_number
    )
    rest = list(resumed)
    numbers = [e.sequence_number for e in seen + rest]
    assert numbers == sorted(set(numbers)), "every event once, in order"
    deltas = "".join(e.delta for e in seen + rest if e.type == "response.output_text.delta")
    assert deltas == whole.output_text == finished(client_of, response_id).output_text
    assert rest[-1].type == "response.incomplete"


def test_a_cancelled_response_keeps_its_text_and_a_deleted_one_is_gone(
    client_of: openai.OpenAI,
) -> None:
    started = client_of.responses.create(model="smollm2", input=STORY, temperature=0,
                                         max_output_tokens=2000, background=True)  # fmt: skip

    def some_text() -> bool:
        return len(client_of.responses.retrieve(started.id).output_text) > 20

    wait_until(some_text, "some text made", 60, 0.05)
    cancelled = client_of.responses.cancel(started.id)
    assert cancelled.status == "cancelled" and len(cancelled.output_text) > 20
    assert client_of.responses.delete(started.id) is None
    with pytest.raises(openai.NotFoundError):
        client_of.responses.retrieve(started.id)
    waited = client_of.responses.create(model="smollm2", input="hi", max_output_tokens=2)
    with pytest.raises(openai.BadRequestError):  # only a background one can be
        client_of.responses.cancel(waited.id)


def test_a_response_survives_its_api_and_its_worker_being_replaced(
    settings: Settings, make_app: Callable[..., Flask], serve: Callable[[Flask], LiveServer],
    tenant: TenantAuth, tmp_path: Path, database: Database,
) -> None:  # fmt: skip
    """Created in the background; the API serving it stopped and the worker killed
    mid-generation; a new API and a new worker: the response completes, its text
    equal to an uninterrupted greedy run's."""
    queue = f"responses-{uuid.uuid4().hex[:8]}"
    on_queue = settings.with_overrides(jobs_queue=queue)
    asked = {"model": "smollm2", "input": "Once upon a time", "temperature": 0,
             "max_output_tokens": 160, "background": True}  # fmt: skip
    first = WorkerProcess(on_queue, tmp_path / "first.log", concurrency=1, DRAIN_LINGER_MS="0")
    try:
        with live_server(make_app(jobs_queue=queue)) as first_api:  # stopped on leaving
            client = client_for(first_api, tenant)
            reference = finished(client, client.responses.create(**asked).id).output_text
            response_id = client.responses.create(**asked).id

            def half_made() -> bool:
                return len(client.responses.retrieve(response_id).output_text) > 80

            wait_until(half_made, "half the text made", 120, 0.01)
    finally:
        _kill(first)
    job_id = uuid.UUID(hex=response_id.removeprefix("resp_"))
    with database.engine.begin() as conn:
        conn.execute(sa.text("UPDATE jobs SET lease_expires_at = now() - interval '1 second' "
                             "WHERE id = :id"), {"id": job_id})  # fmt: skip
    with database.sessionmaker.begin() as session:
        assert take_back_expired_leases(session, 0.01, 0.01, 500) == [job_id]
    second_app = make_app(jobs_queue=queue)
    second = WorkerProcess(on_queue, tmp_path / "second.log", concurrency=1, DRAIN_LINGER_MS="0")
    try:
        with second_app.app_context():
            assert services().parts.dispatcher.wake("smollm2", force=True)
        client = client_for(serve(second_app), tenant)
        done = finished(client, response_id)
    finally:
        second.stop()
    assert done.output_text == reference and len(reference) > 80
