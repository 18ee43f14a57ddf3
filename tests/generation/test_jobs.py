"""Generation as jobs: POST /jobs with the chat model, run by a real worker's decode loop."""

from __future__ import annotations

import json
import time
from typing import Any

import jsonschema
import pytest
from flask.testing import FlaskClient

from tests.api.test_batches import submit as submit_batch
from tests.api.test_batches import upload, wait_batch
from tests.conftest import WorkerProcess, wait_for_job
from tests.generation.schemas import PERSON, messages, response_format
from tests.support import wait_until

NPY = "application/x-npy"

pytestmark = pytest.mark.processes


def submit(client: FlaskClient, auth: dict[str, str], inputs: Any, **parameters: Any) -> str:
    body = {"model": "smollm2", "inputs": inputs, "parameters": {"temperature": 0, **parameters}}
    response = client.post("/jobs", json=body, headers=auth)
    assert response.status_code == 202, response.json
    return str(response.json["id"])  # type: ignore[index]


def test_a_prompt_is_continued_greedily(
    client: FlaskClient, auth: dict[str, str], worker: WorkerProcess
) -> None:
    job_id = submit(client, auth, {"prompt": "The capital of France is"}, max_tokens=3)
    job = wait_for_job(client, auth, job_id, timeout=120)
    assert job["status"] == "succeeded", job
    outputs = job["outputs"]
    assert outputs["text"] == " Paris.\n"
    assert outputs["finish_reason"] == "length"
    assert (outputs["prompt_tokens"], outputs["completion_tokens"]) == (5, 3)


def test_a_generation_that_makes_byte_zero_ends_with_text_that_can_be_stored(
    client: FlaskClient, auth: dict[str, str], worker: WorkerProcess
) -> None:
    """Token 190 is byte 0 in SmolLM2's byte-level vocabulary. A caller who asks
    for it gets U+FFFD, as for bytes that make no character, and the job ends:
    PostgreSQL's text cannot hold U+0000, and a failed write would take the loop,
    and everyone's generations in it, down."""
    job_id = submit(client, auth, {"prompt": "Zero:"}, max_tokens=5, logprobs=True,
                    top_logprobs=1, logit_bias={"190": 100})  # fmt: skip
    job = wait_for_job(client, auth, job_id, timeout=120)
    assert job["status"] == "succeeded", job
    assert job["outputs"]["text"] == "\ufffd" * 5
    tokens = [entry["token"] for entry in json.loads(job["outputs"]["logprobs"])]
    assert tokens == ["\ufffd"] * 5
    events = client.get(f"/jobs/{job_id}/events", headers=auth).get_data(as_text=True)
    assert "\ufffd" in events and "\\u0000" not in events


def test_bulk_submits_take_the_same_request(
    client: FlaskClient, auth: dict[str, str], worker: WorkerProcess
) -> None:
    jobs = [
        {"model": "smollm2", "inputs": {"prompt": "The capital of France is"},
         "parameters": {"max_tokens": 2, "temperature": 0}},
        {"model": "smollm2", "inputs": {"messages": [{"role": "user", "content": "What is 2+2?"}]},
         "parameters": {"max_tokens": 30, "temperature": 0, "stop": [" is"]}},
        {"model": "smollm2", "inputs": {"prompt": "x"}, "parameters": {"max_tokens": 99999}},
    ]  # fmt: skip
    response = client.post("/jobs/bulk", json={"jobs": jobs}, headers=auth)
    assert response.status_code == 202, response.json
    items = response.json["jobs"]  # type: ignore[index]
    assert items[2]["status"] == 422 and "max_tokens" in items[2]["detail"]
    first = wait_for_job(client, auth, items[0]["id"], timeout=120)
    second = wait_for_job(client, auth, items[1]["id"], timeout=120)
    assert first["outputs"]["text"] == " Paris."
    assert second["outputs"]["text"] == "The answer to this classic math problem"
    assert second["outputs"]["finish_reason"] == "stop"


def test_an_idempotency_key_tells_parameters_apart(
    client: FlaskClient, auth: dict[str, str], worker: WorkerProcess
) -> None:
    """The same key with the same inputs but other parameters is another request: 422."""
    body = {"model": "smollm2", "inputs": {"prompt": "The capital of France is"},
            "parameters": {"max_tokens": 2, "temperature": 0}}  # fmt: skip
    headers = {**auth, "Idempotency-Key": "same-key"}
    first = client.post("/jobs", json=body, headers=headers)
    again = client.post("/jobs", json=body, headers=headers)
    assert first.status_code == again.status_code == 202
    assert first.json["id"] == again.json["id"]  # type: ignore[index]
    other = {**body, "parameters": {"max_tokens": 3, "temperature": 0}}
    assert client.post("/jobs", json=other, headers=headers).status_code == 422
    wait_for_job(client, auth, first.json["id"], timeout=120)  # type: ignore[index]


def test_a_batch_of_generations_answers_each_row_in_order(
    client: FlaskClient, auth: dict[str, str], worker: WorkerProcess
) -> None:
    """Inline rows in each form the batch door takes (a job's body without the model,
    or the inputs with parameters beside them): a chunk job each, results as JSONL
    in input order with a job's outputs; usage counts their tokens."""
    rows = [
        {"inputs": {"prompt": "The capital of France is"},
         "parameters": {"max_tokens": 2, "temperature": 0}},
        {"messages": [{"role": "user", "content": "What is 2+2?"}],
         "parameters": {"max_tokens": 30, "temperature": 0}},
        {"prompt": "The capital of France is", "parameters": {"max_tokens": 3, "temperature": 0}},
    ]  # fmt: skip
    batch = submit_batch(client, auth, model="smollm2", inputs=rows)
    assert batch["rows"] == 3 and sum(batch["chunks"].values()) == 3
    done = wait_batch(client, auth, batch["id"])
    assert done["status"] == "succeeded" and done["rows_done"] == 3, done
    answer = client.get(f"/batches/{batch['id']}/results", headers=auth)
    lines = [json.loads(line) for line in answer.data.decode().splitlines()]
    assert [line["row"] for line in lines] == [0, 1, 2]
    texts = [line["outputs"]["text"] for line in lines]
    assert texts == [" Paris.", "The answer to this classic math problem is 4.", " Paris.\n"]
    assert lines[1]["outputs"]["finish_reason"] == "stop"
    assert lines[2]["outputs"]["completion_tokens"] == 3
    report = client.get("/usage", headers=auth).get_json()
    (usage,) = [m for m in report["models"] if m["model"] == "smollm2"]
    assert usage["completion_tokens"] >= 2 + 11 + 3
    npy = client.get(f"/batches/{batch['id']}/results", headers={**auth, "Accept": NPY})
    assert npy.status_code == 422 and "JSONL" in npy.json["detail"]  # type: ignore[index]


def test_a_batch_s_rows_take_a_schema_and_labels_each(
    client: FlaskClient, auth: dict[str, str], worker: WorkerProcess
) -> None:
    """Structured output and label scores are a row's parameters as a job's: a
    table of documents gets a JSON object and a label with its probability per row."""
    ask = "Is the sentiment of this review positive, negative or neutral? Answer with one word."
    review = {"messages": [{"role": "user", "content": f"{ask}\n\nAbsolutely wonderful!"}]}
    rows = [
        {"inputs": {"messages": messages("Tom Baker is 87 years old.")},
         "parameters": {"max_tokens": 60, "temperature": 0,
                        "response_format": response_format("person", PERSON)}},
        {"inputs": review, "parameters": {"labels": ["positive", "negative", "neutral"]}},
    ]  # fmt: skip
    batch = submit_batch(client, auth, model="smollm2", inputs=rows)
    done = wait_batch(client, auth, batch["id"])
    assert done["status"] == "succeeded" and done["rows_done"] == 2, done
    answer = client.get(f"/batches/{batch['id']}/results", headers=auth)
    person, scored = [json.loads(line)["outputs"] for line in answer.data.decode().splitlines()]
    jsonschema.validate(json.loads(person["text"]), PERSON)
    scores = json.loads(scored["label_scores"])
    assert sum(scores.values()) == pytest.approx(1.0) and scored["text"] == "positive"


def test_a_jsonl_file_of_requests_runs_as_a_batch(
    client: FlaskClient, auth: dict[str, str], worker: WorkerProcess
) -> None:
    lines = [
        {"inputs": {"prompt": "The capital of France is"},
         "parameters": {"max_tokens": 2, "temperature": 0}},
        {"prompt": "The capital of France is", "parameters": {"max_tokens": 3, "temperature": 0}},
    ]  # fmt: skip
    data = "".join(json.dumps(line) + "\n" for line in lines).encode()
    file_id = upload(client, auth, data, "requests.jsonl")
    batch = submit_batch(client, auth, model="smollm2", file_id=file_id)
    done = wait_batch(client, auth, batch["id"])
    assert done["status"] == "succeeded" and done["rows_done"] == 2, done
    answer = client.get(f"/batches/{batch['id']}/results", headers=auth)
    texts = [json.loads(line)["outputs"]["text"] for line in answer.data.decode().splitlines()]
    assert texts == [" Paris.", " Paris.\n"]


def test_bad_rows_refuse_the_batch_naming_each(client: FlaskClient, auth: dict[str, str]) -> None:
    rows = [
        {"prompt": "fine"},
        {"prompt": "x", "parameters": {"max_tokens": 99999}},
        {"messages": [{"role": "wizard", "content": "hi"}]},
        "just text",
    ]
    answer = client.post("/batches", json={"model": "smollm2", "inputs": rows}, headers=auth)
    assert answer.status_code == 422, answer.json
    errors = answer.json["errors"]  # type: ignore[index]
    assert {"inputs[1].max_tokens", "inputs[2].messages[0].role", "inputs[3].row"} <= set(errors)
    assert client.get("/batches", headers=auth).json["items"] == []  # type: ignore[index]
    csv = upload(client, auth, b"prompt\nThe capital of France is\n", "rows.csv")
    refused = client.post("/batches", json={"model": "smollm2", "file_id": csv}, headers=auth)
    assert refused.status_code == 422 and ".jsonl" in refused.json["detail"]  # type: ignore[index]
    bad = upload(client, auth, b'{"prompt": "x", "parameters": {"top_k": -1}}\n', "bad.jsonl")
    refused = client.post("/batches", json={"model": "smollm2", "file_id": bad}, headers=auth)
    assert refused.status_code == 422 and "top_k" in str(refused.json)


def sse(text: str) -> list[dict[str, Any]]:
    """Server-Sent Events: each one's id, event and data (`sse_event`)."""
    return [event for block in text.split("\n\n") if (event := sse_event(block)) is not None]


def sse_event(block: str) -> dict[str, Any] | None:
    """One Server-Sent Event's id, event and data (its `data:` lines joined by
    newlines; a state event's parsed as JSON); None for a keepalive."""
    lines = [line for line in block.split("\n") if line and not line.startswith(":")]
    if not lines:
        return None
    fields: dict[str, Any] = {"data": []}
    for line in lines:
        name, _, value = line.partition(": ")
        if name == "data":
            fields["data"].append(value)
        else:
            fields[name] = value
    data = "\n".join(fields["data"])
    parsed = data if fields["event"] == "output" else json.loads(data)
    return {"id": int(fields["id"]), "event": fields["event"], "data": parsed}


def test_an_async_generation_streams_its_text_as_output_events_that_resume(
    client: FlaskClient, auth: dict[str, str], worker: WorkerProcess
) -> None:
    """GET /jobs/<id> shows a running generation's text so far; its event stream
    sends the text as `output` events between the state events, whose texts join
    to outputs.text; resumed with Last-Event-ID after an output event, it sends
    every later event once."""
    job_id = submit(client, auth, {"prompt": "Once upon a time"}, max_tokens=120)
    partial = None
    give_up = time.monotonic() + 120
    while time.monotonic() < give_up:
        job = client.get(f"/jobs/{job_id}", headers=auth).json
        assert job is not None
        if job["status"] == "running" and job["outputs"]:
            partial = job["outputs"]["text"]
            break
        if job["status"] not in ("queued", "running"):
            break
        time.sleep(0.02)
    events = sse(client.get(f"/jobs/{job_id}/events", headers=auth).get_data(as_text=True))
    kinds = [e["event"] for e in events]
    assert kinds[:2] == ["job.queued", "job.running"] and kinds[-1] == "job.succeeded", kinds
    outputs = [e for e in events if e["event"] == "output"]
    assert len(outputs) >= 2 and set(kinds[2:-1]) == {"output"}
    whole = events[-1]["data"]["job"]["outputs"]["text"]
    assert "".join(e["data"] for e in outputs) == whole
    assert partial and whole.startswith(partial) and len(partial) < len(whole)
    ids = [e["id"] for e in events]
    assert ids == sorted(set(ids))
    after = outputs[0]["id"]
    resumed = client.get(f"/jobs/{job_id}/events", headers={**auth, "Last-Event-ID": str(after)})
    assert sse(resumed.get_data(as_text=True)) == [e for e in events if e["id"] > after]


def test_a_long_poll_on_a_generation_waits_for_its_state_not_its_text(
    client: FlaskClient, auth: dict[str, str], worker: WorkerProcess
) -> None:
    """Pieces of text are no change of state: GET ?wait= on a running generation
    answers when it ends, not at its next piece."""
    job_id = submit(client, auth, {"prompt": "Once upon a time"}, max_tokens=60)

    def started() -> bool:
        job = client.get(f"/jobs/{job_id}", headers=auth).json
        return job is not None and job["status"] == "running" and bool(job["outputs"])

    wait_until(started, lambda: f"job {job_id} running with text", 120)
    job = client.get(f"/jobs/{job_id}?wait=60", headers=auth).json
    assert job is not None and job["status"] == "succeeded", job
