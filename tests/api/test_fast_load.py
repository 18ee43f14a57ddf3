"""The hot routes' fast paths (a schema's `fast_load`, JobSchema's own `dump`)
answer exactly as marshmallow would, or step aside for it; and the routes take them."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import pytest
from flask.testing import FlaskClient
from hypothesis import given, settings
from hypothesis import strategies as st
from marshmallow import Schema, ValidationError

from app.jobs.representation import JobSchema
from app.jobs.tables import Job
from app.runtime.tensors import pack
from app.web.schemas import BulkJobSchema, SubmitHeadersSchema, SubmitJobSchema

PIXELS = {"pixels": [[0.0] * 64]}
USUAL: list[dict[str, Any]] = [
    {"model": "digits", "inputs": PIXELS},
    {"model": "digits", "inputs": PIXELS, "priority": 3, "version": "1"},
    {"model": "digits", "inputs": [{"name": "pixels", "shape": [1, 64], "datatype": "FP32",
                                    "data": [0.0] * 64}], "version": None, "webhook": None},
]  # fmt: skip

values = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 12), st.floats(allow_nan=False),
    st.text(max_size=3), st.just("x" * 256), st.just([]), st.just(PIXELS),
    st.just({"url": "https://example.com/hook"}), st.just("2030-01-01T00:00:00Z"),
)  # fmt: skip
keys = st.sampled_from(
    ["model", "inputs", "version", "priority", "webhook", "deadline", "idempotency_key",
     "cancel_after", "unknown"]
)  # fmt: skip
# Any JSON-ish value, any mix of keys, and (most often) a usual body with one or
# two of its keys changed, added or spoilt.
changes = st.dictionaries(keys, values, max_size=2)
bodies = st.one_of(
    st.dictionaries(keys, values, max_size=6), values,
    st.builds(lambda change: {**USUAL[1], **change}, changes),
    st.builds(lambda change: {**USUAL[1], **change}, changes),
)  # fmt: skip


def loaded(schema: Schema, body: Any) -> dict[str, Any] | None:
    """What marshmallow makes of `body`; None where it refuses it."""
    try:
        result: dict[str, Any] = schema.load(body)
    except ValidationError:
        return None
    return result


@pytest.mark.parametrize("schema", [SubmitJobSchema(), BulkJobSchema()], ids=["job", "bulk-item"])
@settings(max_examples=400, deadline=None, derandomize=True)
@given(body=bodies)
def test_fast_load_equals_load_or_steps_aside(schema: SubmitJobSchema, body: Any) -> None:
    fast = schema.fast_load(body)
    if fast is not None:
        assert fast == loaded(schema, body)


EDGES = [
    {"priority": p} for p in (-1, 0, 9, 10, True, 1.0, "1", None)
] + [{"version": v} for v in ("", 1, None, ["1"])] + [
    {"model": m} for m in ("", 1, None)
] + [{"inputs": None}, {"inputs": []}, {"unknown": 1}, {"webhook": {}}, {"deadline": None},
     {"idempotency_key": None}, {"cancel_after": 0}, {"cancel_after": None}]  # fmt: skip


@pytest.mark.parametrize("schema", [SubmitJobSchema(), BulkJobSchema()], ids=["job", "bulk-item"])
@pytest.mark.parametrize("change", EDGES, ids=str)
def test_fast_load_at_the_edges(schema: SubmitJobSchema, change: dict[str, Any]) -> None:
    body = {**USUAL[1], **change}
    fast = schema.fast_load(body)
    assert fast is None or fast == loaded(schema, body)


@pytest.mark.parametrize("schema", [SubmitJobSchema(), BulkJobSchema()], ids=["job", "bulk-item"])
@pytest.mark.parametrize("body", USUAL)
def test_the_usual_bodies_take_the_fast_path(schema: SubmitJobSchema, body: dict[str, Any]) -> None:
    assert schema.fast_load(body) == loaded(schema, body) is not None


def test_a_bulk_item_s_idempotency_key_is_checked_as_load_checks_it() -> None:
    schema = BulkJobSchema()
    body = {"model": "digits", "inputs": PIXELS, "idempotency_key": "k-1"}
    assert schema.fast_load(body) == loaded(schema, body) is not None
    for bad in ("", "x" * 256, 7):
        assert schema.fast_load({**body, "idempotency_key": bad}) is None
        assert loaded(schema, {**body, "idempotency_key": bad}) is None


def test_headers_fast_path_only_when_none_of_its_headers_is_sent() -> None:
    schema = SubmitHeadersSchema()
    assert schema.fast_load({"Accept": "application/json"}) == {} == schema.load({})
    for header in ("Cancel-After", "Prefer", "Idempotency-Key"):
        assert schema.fast_load({header: "1"}) is None


def test_post_jobs_loads_its_body_by_the_fast_path_and_still_words_errors(
    client: FlaskClient, auth: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    taken: list[dict[str, Any] | None] = []
    fast_load = SubmitJobSchema.fast_load

    def spy(self: SubmitJobSchema, data: Any) -> dict[str, Any] | None:
        taken.append(fast_load(self, data))
        return taken[-1]

    monkeypatch.setattr(SubmitJobSchema, "fast_load", spy)
    accepted = client.post("/jobs", json={"model": "digits", "inputs": PIXELS}, headers=auth)
    assert accepted.status_code == 202, accepted.json
    refused = client.post("/jobs", json={"model": "digits", "inputs": PIXELS, "priority": "high"},
                          headers=auth)  # fmt: skip
    assert refused.status_code == 422 and refused.mimetype == "application/problem+json"
    assert "priority" in str(refused.json)
    assert taken[0] is not None and taken[1] is None


def jobs_in_every_state() -> list[Job]:
    now = datetime(2026, 11, 25, 8, 30, 1, 123456, tzinfo=UTC)
    base: dict[str, Any] = dict(
        id=uuid.uuid4(), tenant_id=1, model="digits", model_version="1", status="queued",
        priority=0, attempts=0, max_attempts=3, created_at=now,
    )  # fmt: skip
    outputs = pack({"probabilities": np.arange(10, dtype=np.float32).reshape(1, 10)})
    return [
        Job(**base),
        Job(**{**base, "status": "running", "started_at": now + timedelta(seconds=1),
               "attempts": 1, "priority": 10, "deadline_at": now + timedelta(hours=1)}),
        Job(**{**base, "status": "succeeded", "started_at": now, "output_data": outputs,
               "finished_at": now + timedelta(milliseconds=7), "compute_seconds": 0.00012,
               "batch_share": 0.25, "webhook_url": "https://example.com/h",
               "webhook_events": ["job.succeeded"]}),
        Job(**{**base, "status": "failed", "finished_at": now, "error_code": "invalid_input",
               "error_message": "no", "outputs": {"y": [1, 2]}}),
        Job(**{**base, "status": "cancelled", "cancel_requested_at": now, "finished_at": now,
               "purged_at": now + timedelta(days=1)}),
        Job(),
    ]  # fmt: skip


@pytest.mark.parametrize("job", jobs_in_every_state(), ids=lambda job: str(job.status))
def test_job_dump_equals_marshmallow_s(job: Job) -> None:
    schema = JobSchema()
    fast, slow = schema.dump(job), Schema.dump(schema, job)
    for so_far in ("queued_seconds", "running_seconds"):  # "so far": read from the clock
        if isinstance(slow[so_far], float) and job.finished_at is None:
            assert fast.pop(so_far) == pytest.approx(slow.pop(so_far), abs=5)
    assert fast == slow
    assert list(schema.dump(job)) == list(schema.fields)  # every field, none besides
