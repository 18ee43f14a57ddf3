"""Schemathesis hooks that make part of the generated requests ones a user would send.

A random `model` is an unknown model (404), random `inputs` never fit one (422) and a
random cron never parses, so a fuzzer left alone creates no job, batch, schedule or
binding, and its stateful phase has nothing to follow the links of. Here a drawn share
of the creating requests name a bundled model with inputs that fit it (drawn too),
a cron that parses, an uploaded file of a real format; the other fields stay as
generated, and the rest of the requests stay wholly generated. Waits are kept short:
no worker runs the jobs, so a job never changes and a `?wait=N` would hold for N s.

`register(hook)` takes `schemathesis.hook` (the CLI: SCHEMATHESIS_HOOKS) or a schema's
`schema.hook` (a test)."""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from typing import Any

import numpy as np
from hypothesis import strategies as st

PIXELS = st.floats(0, 16, width=32)
ROWS = st.lists(st.lists(PIXELS, min_size=64, max_size=64), min_size=1, max_size=3)
TEXTS = st.lists(st.text(max_size=30), min_size=1, max_size=3)
NAMES = st.text("abcdefghijklmnopqrstuvwxyz0123456789._-", min_size=1, max_size=20)
CRONS = st.sampled_from(["0 3 * * *", "0 4 29 2 *", "0 0 1 1 *", "30 2 * * 1-5 10"])
MAX_WAIT_S = 0.05


def _digits_inputs(rows: list[list[float]], tensor: bool) -> Any:
    if not tensor:
        return {"pixels": rows}
    flat = [value for row in rows for value in row]
    return [{"name": "pixels", "shape": [len(rows), 64], "datatype": "FP32", "data": flat}]


INPUTS = st.one_of(
    st.tuples(st.just("digits"), st.builds(_digits_inputs, ROWS, st.booleans())),
    st.tuples(st.just("minilm"), TEXTS.map(lambda texts: {"text": texts})),
)


def _fitting(body: Any, model_inputs: tuple[str, Any]) -> Any:
    """`body` (a generated job or batch) with a bundled model and inputs that fit it."""
    if not isinstance(body, dict):
        return body
    model, inputs = model_inputs
    fitted = {**body, "model": model, "inputs": inputs}
    fitted.pop("version", None)
    fitted.pop("file_id", None)
    return fitted


def _npy(rows: list[list[float]]) -> bytes:
    out = io.BytesIO()
    np.save(out, np.asarray(rows, dtype=np.float32))
    return out.getvalue()


def _jsonl(rows: list[list[float]]) -> bytes:
    return b"".join(json.dumps({"pixels": row}).encode() + b"\n" for row in rows)


UPLOADS = st.one_of(
    st.tuples(st.just("rows.npy"), ROWS.map(_npy)),
    st.tuples(st.just("rows.jsonl"), ROWS.map(_jsonl)),
)


def _steer(case: Any, draw: Callable[[st.SearchStrategy[Any]], Any]) -> Any:
    label = case.operation.label
    body = case.body
    if label == "POST /jobs":
        case.body = _fitting(body, draw(INPUTS))
    elif label == "POST /jobs/bulk" and isinstance(body, dict):
        jobs = body.get("jobs")
        if isinstance(jobs, list):
            body["jobs"] = [_fitting(job, draw(INPUTS)) for job in jobs]
    elif label == "POST /batches":
        case.body = _fitting(body, draw(INPUTS))
    elif label == "POST /files":
        filename, data = draw(UPLOADS)
        case.query = {**(case.query or {}), "filename": filename}
        case.query.pop("format", None)
        case.body = data
    elif label in ("POST /schedules", "PATCH /schedules/{schedule_id}") and isinstance(body, dict):
        body.update(model="digits", cron=draw(CRONS), timezone="UTC")
        body.pop("version", None)
        if label == "POST /schedules":  # a file's id, when a POST /files link gives one
            body.update(input={"file_id": str(draw(st.uuids()))}, output=None)
    elif label in ("POST /streams", "PATCH /streams/{binding_id}") and isinstance(body, dict):
        body.update(model="digits", output=draw(NAMES))
        body.pop("version", None)
        if label == "POST /streams":
            body["input"] = draw(NAMES)
    return case


STEERED = {
    "POST /jobs", "POST /jobs/bulk", "POST /batches", "POST /files", "POST /schedules",
    "PATCH /schedules/{schedule_id}", "POST /streams", "PATCH /streams/{binding_id}",
}  # fmt: skip


def steer_case(context: Any, case: Any) -> st.SearchStrategy[Any]:
    """Half of the creating requests steered, the other half as generated."""
    label = case.operation.label
    if (
        label == "GET /jobs/{job_id}"
        and case.query
        and isinstance(case.query.get("wait"), float | int)
    ):
        case.query["wait"] = min(case.query["wait"], MAX_WAIT_S)
    if label == "POST /jobs" and case.headers:
        case.headers.pop("Prefer", None)  # `Prefer: wait=N` would wait N s (no worker)
    if label not in STEERED:
        return st.just(case)
    return st.one_of(st.just(case), _steered(case))


@st.composite
def _steered(draw: st.DrawFn, case: Any) -> Any:
    return _steer(case, draw)


def register(hook: Callable[..., Any]) -> None:
    hook("flatmap_case")(steer_case)
