"""A generation request is looked at once: its model card resolved by the door that
checks it (the operations and the submit path are handed that card, not left to
look it up again), and its prompt tokenized by the API, which measures it against
the context; the worker's loop starts from those ids."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest
from flask import Flask

from app.cards import ModelCard
from app.generation.chat import ChatFormat
from app.generation.requests import stored_request
from app.jobs.staging import check_inputs
from app.repository.registry import ModelRepository
from app.runtime.tensors import pack


@pytest.fixture
def resolves(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names ModelRepository.resolve is asked for, in order."""
    asked: list[str] = []
    resolve = ModelRepository.resolve

    def counted(self: ModelRepository, name: str, *args: Any, **kwargs: Any) -> Any:
        asked.append(name)
        return resolve(self, name, *args, **kwargs)

    monkeypatch.setattr(ModelRepository, "resolve", counted)
    return asked


def test_a_chat_completion_of_two_choices_resolves_its_card_once(
    make_app: Callable[..., Flask], auth: dict[str, str], resolves: list[str]
) -> None:
    # (a queue of its own, which no worker serves: the jobs wait, and are
    # cancelled when the stream is closed)
    client = make_app(jobs_queue=f"card-once-{uuid.uuid4().hex[:8]}").test_client()
    body = {"model": "smollm2", "messages": [{"role": "user", "content": "Hi"}], "n": 2,
            "max_tokens": 4, "stream": True}  # fmt: skip
    response = client.post("/v1/chat/completions", json=body, headers=auth)
    try:
        assert response.status_code == 200, response.get_data(as_text=True)
        assert len(response.headers["X-Job-Id"].split(",")) == 2
    finally:
        response.close()
    assert resolves == ["smollm2"]


def test_a_background_response_resolves_its_card_once(
    make_app: Callable[..., Flask], auth: dict[str, str], resolves: list[str]
) -> None:
    client = make_app(jobs_queue=f"card-once-{uuid.uuid4().hex[:8]}").test_client()
    body = {"model": "smollm2", "input": "Hi", "background": True, "max_output_tokens": 4}
    response = client.post("/v1/responses", json=body, headers=auth)
    assert response.status_code == 200, response.get_data(as_text=True)
    assert response.json is not None and response.json["status"] == "queued", response.json
    assert resolves == ["smollm2"]


def test_the_stored_request_carries_the_ids_the_api_measured(
    card: ModelCard, chat: ChatFormat, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ids stored with the request are the prompt's own; a worker reading them
    back starts from them and tokenizes nothing."""
    messages = [{"role": "system", "content": "Answer briefly."},
                {"role": "user", "content": "Where is Paris?"}]  # fmt: skip
    arrays = check_inputs(card, {"messages": messages}, {"max_tokens": 4})
    request = stored_request(pack(arrays))
    assert request.prompt_ids is not None
    assert list(request.prompt_ids) == chat.encode(request)

    def tokenized(*_: Any) -> Any:
        raise AssertionError("the worker tokenized a prompt the API had measured")

    monkeypatch.setattr(chat, "encode", tokenized)
    assert chat.prompt_of(request) == list(request.prompt_ids)
