"""The client's generations against the real service and a real worker's decode
loop (the bundled chat model, greedy): a job whole, its text streamed from the
job's event stream, structured output under a JSON Schema, label scores."""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest

from inference_client import ApiError, Client, Job
from tests.generation.schemas import PERSON, messages

MODEL = "smollm2"
GREEDY: dict[str, Any] = {"temperature": 0}


@pytest.mark.usefixtures("worker")
def test_a_prompt_is_continued_as_a_job(api: Client) -> None:
    created = api.generations.create(MODEL, prompt="The capital of France is", max_tokens=3,
                                     **GREEDY)  # fmt: skip
    assert isinstance(created, Job) and created.model == MODEL
    job = api.jobs.wait(created.id, timeout=120)
    assert job.succeeded and job.outputs is not None, job
    assert job.outputs["text"] == " Paris.\n"
    assert job.outputs["finish_reason"] == "length" and job.outputs["completion_tokens"] == 3


@pytest.mark.usefixtures("worker")
def test_streamed_pieces_join_to_the_job_s_text(api: Client) -> None:
    chat = [{"role": "user", "content": "List three fruits, one per line."}]
    pieces = list(api.generations.stream(MODEL, messages=chat, max_tokens=48, **GREEDY))
    assert all(isinstance(piece, str) for piece in pieces)
    assert len(pieces) > 1  # the first text at once, then every 16 tokens: as it is made
    [job] = api.jobs.list(model=MODEL, include_outputs=True)  # the tenant's one job
    assert job.succeeded and job.outputs is not None, job
    text = job.outputs["text"]
    assert "\n" in text and "".join(pieces) == text  # a line end: data lines of one event
    # The same request again, whole: greedy decoding makes the same text.
    again = api.jobs.wait(api.generations.create(MODEL, messages=chat, max_tokens=48,
                                                 **GREEDY).id, timeout=120)  # fmt: skip
    assert again.outputs is not None and again.outputs["text"] == text


@pytest.mark.usefixtures("worker")
def test_structured_output_validates_against_the_schema(api: Client) -> None:
    person = api.generations.structured(
        MODEL, schema=PERSON, name="person",
        messages=messages("Maria, aged 29, works as a nurse."), max_tokens=80, **GREEDY,
    )  # fmt: skip
    assert isinstance(person, dict)
    jsonschema.validate(person, PERSON)
    assert person["age"] == 29 and "Maria" in person["name"], person


@pytest.mark.usefixtures("worker")
def test_classify_gives_every_label_a_probability(api: Client) -> None:
    ask = "Is the sentiment of this review positive, negative or neutral? Answer with one word."
    labels = ["positive", "negative", "neutral"]
    happy = [{"role": "user", "content": f"{ask}\n\nAbsolutely wonderful experience!"}]
    scores = api.generations.classify(MODEL, labels=labels, messages=happy)
    assert sorted(scores) == sorted(labels)
    assert all(isinstance(p, float) and 0.0 <= p <= 1.0 for p in scores.values())
    assert sum(scores.values()) == pytest.approx(1.0, abs=1e-5)
    assert max(scores, key=scores.__getitem__) == "positive", scores
    unhappy = [{"role": "user", "content": f"{ask}\n\nTerrible. It broke the first day."}]
    other = api.generations.classify(MODEL, labels=labels, messages=unhappy)
    assert other["negative"] > scores["negative"] and other["positive"] < scores["positive"]


def test_a_request_the_service_refuses_raises_its_problem(api: Client) -> None:
    with pytest.raises(ValueError, match="either messages or prompt"):
        api.generations.create(MODEL, messages=[{"role": "user", "content": "x"}], prompt="x")
    with pytest.raises(ValueError, match="either messages or prompt"):
        api.generations.create(MODEL)
    with pytest.raises(ApiError) as refused:
        api.generations.create(MODEL, prompt="x", max_tokens=99999)
    assert refused.value.status == 422 and "max_tokens" in refused.value.detail
    with pytest.raises(ApiError) as duplicated:
        api.generations.classify(MODEL, labels=["a", "a"], prompt="x")
    assert duplicated.value.status == 422 and "labels" in str(duplicated.value)
