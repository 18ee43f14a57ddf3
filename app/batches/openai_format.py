"""Batches in OpenAI's Batch format: a `.jsonl` of `{"custom_id", "method": "POST",
"url", "body"}` lines in, output and error files of `{"id", "custom_id",
"response", "error"}` lines out.

As OpenAI does, a file is refused whole where its lines cannot be told apart or
run together (a custom_id used twice, requests naming different models), and
otherwise each line stands alone: a line that is not a request (not JSON, no
custom_id, another method or url) or whose body the /v1 door would refuse is cut
into a chunk job born failed, and every other line runs. A refused body is
answered as the door would have answered it (`response.status_code` 400 or 422
with OpenAI's error object, as OpenAI's own error files do); a line that is no
request, or one the batch's cancel stopped, has `error` instead.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson

from app.batches import readers
from app.batches.progress import Progress
from app.batches.results import Chunk
from app.batches.tables import Batch
from app.cards import ModelCard
from app.errors import InputsDoNotFit
from app.generation.openai_objects import (
    BadField,
    CompletionShape,
    ToolPlan,
    completion_request,
    error_object,
    json_outputs,
    streaming,
)
from app.jobs.staging import check_inputs
from app.runtime.tensors import unpack
from app.statuses import BATCH_OPEN, BatchStatus, JobStatus

ENDPOINTS = {"/v1/chat/completions": True, "/v1/completions": False}  # endpoint: chat?
COMPLETION_WINDOW = "24h"
OUTPUT, ERRORS = "openai-output", "openai-errors"  # a batch's two result files
FILES = (OUTPUT, ERRORS)
_WINDOW = timedelta(hours=24)
_LINE_FIELDS = {"custom_id", "method", "url", "body"}


class FileRefused(readers.BadRows):
    """The file as a whole, refused as OpenAI refuses it (`code` is OpenAI's)."""

    def __init__(self, code: str, row: int, message: str) -> None:
        super().__init__(row, message, {"input_file_id": f"line {row + 1}: {message}"})
        self.args, self.code = (f"line {row + 1}: {message}",), code


@dataclass(frozen=True)
class Line:
    """A line cut into a chunk job: its request as the job's inputs (None: refused
    before it ran), and the job's own columns (its custom_id; a refusal's error)."""

    arrays: dict[str, Any] | None
    columns: dict[str, Any]


def check_file(lines: Iterable[tuple[int, bytes]]) -> str | None:
    """The model the file's requests name (None if none does); FileRefused where a
    custom_id comes twice or two models are named. Lines that are no request are
    passed over here: each is refused on its own when it is cut."""
    seen: dict[str, int] = {}
    model: tuple[str, int] | None = None
    for row, raw in lines:
        try:
            value = orjson.loads(raw)
        except orjson.JSONDecodeError:
            continue
        if not isinstance(value, dict):
            continue
        custom_id, body = value.get("custom_id"), value.get("body")
        if isinstance(custom_id, str):
            if custom_id in seen:
                first = seen[custom_id] + 1
                raise FileRefused("duplicate_custom_id", row, f"custom_id {custom_id!r} is line "
                                  f"{first}'s too; each request needs its own")  # fmt: skip
            seen[custom_id] = row
        named = body.get("model") if isinstance(body, dict) else None
        if not isinstance(named, str) or not named:
            continue
        if model is None:
            model = named, row
        elif named != model[0]:
            raise FileRefused("mismatched_model", row, f"names model {named!r} where line "
                              f"{model[1] + 1} names {model[0]!r}: a batch's requests all "
                              "use one model")  # fmt: skip
    return None if model is None else model[0]


def model_of(head: bytes) -> str:
    """The model of a file's requests, from its first MiB (whose repeats it refuses)."""
    model = check_file(readers.raw_lines(_whole_lines(head)))
    if model is None:
        raise FileRefused("missing_required_parameter", 0, "no request in the file's first "
                          "lines names its model (body.model)")  # fmt: skip
    return model


def check_head(card: ModelCard, head: bytes) -> None:
    """A file's first MiB fits a batch of `card`'s model in OpenAI's format."""
    if card.generation is None:
        raise readers.BadRows(0, f"model {card.ref} does not generate text (GET /v1/models)")
    model = model_of(head)
    if model != card.name:
        raise FileRefused("mismatched_model", 0, f"the file's requests name {model!r}, not "
                          f"{card.name!r}")  # fmt: skip


def _whole_lines(head: bytes) -> list[bytes]:
    return [head[: head.rindex(b"\n") + 1]] if b"\n" in head else [head]


def lines(
    card: ModelCard, endpoint: str, parts: Callable[[], Iterable[bytes]], skip_rows: int
) -> Iterator[Line]:
    """The file's lines from `skip_rows`, each checked on its own; the whole file is
    checked first (FileRefused) before the first line is cut."""
    if skip_rows == 0:
        model = check_file(readers.raw_lines(parts()))
        if model is not None and model != card.name:
            raise FileRefused("mismatched_model", 0, f"the requests name {model!r}, not "
                              f"{card.name!r}")  # fmt: skip
    for row, raw in readers.raw_lines(parts()):
        if row >= skip_rows:
            yield parse_line(card, endpoint, row, raw)


def parse_line(card: ModelCard, endpoint: str, row: int, raw: bytes) -> Line:
    """One line: its request, or its refusal."""
    where = f"line {row + 1}"
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        return _not_a_request(None, "invalid_json_line", f"{where} is not JSON ({exc})")
    if not isinstance(value, dict):
        return _not_a_request(None, "invalid_json_line", f"{where} is not a JSON object")
    custom_id = value.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        return _not_a_request(None, "missing_required_parameter",
                              f"{where}: custom_id: expected a non-empty string")  # fmt: skip
    if unknown := sorted(set(value) - _LINE_FIELDS):
        return _not_a_request(custom_id, "invalid_request",
                              f"{where}: unknown field(s) {unknown}; expected "
                              f"{sorted(_LINE_FIELDS)}")  # fmt: skip
    if value.get("method") != "POST":
        return _not_a_request(custom_id, "invalid_method", f"{where}: method: expected POST, "
                              f"got {value.get('method')!r}")  # fmt: skip
    if value.get("url") != endpoint:
        return _not_a_request(custom_id, "invalid_url", f"{where}: url: expected this batch's "
                              f"endpoint {endpoint}, got {value.get('url')!r}")  # fmt: skip
    return _request(card, ENDPOINTS[endpoint], custom_id, value.get("body"))


def _request(card: ModelCard, chat: bool, custom_id: str, body: Any) -> Line:
    """A line's body as the /v1 door takes it (and refuses it)."""
    if not isinstance(body, dict):
        return _refused(custom_id, 400, "malformed_request", "The request body must be a JSON "
                        "object.", None)  # fmt: skip
    try:
        if streaming(body)[0]:
            raise BadField("stream", "a batch's requests are answered whole; leave it out")
        asked = completion_request(body, chat)
        if asked.n > 1:
            raise BadField("n", "a batch's request gets one choice: send a line for each")
        if asked.model != card.name:
            raise BadField("model", f"this batch runs model {card.name}")
    except BadField as exc:
        return _refused(custom_id, 400, "validation_error", str(exc), exc.param)
    try:
        arrays = check_inputs(card, asked.inputs, asked.parameters)
    except InputsDoNotFit as exc:
        errors = exc.extra.get("errors") or {}
        param = next(iter(errors), None) if isinstance(errors, dict) else None
        return _refused(custom_id, 422, "invalid_input", exc.detail, param)
    line: dict[str, Any] = {"custom_id": custom_id}
    if asked.tools is not None:  # (the answer's tool calls are shaped from its text)
        line["tools"] = asked.tools.to_json()
    return Line(arrays, {"batch_line": line})


def _failed(code: str, message: str, line: dict[str, Any]) -> Line:
    return Line(None, {"status": JobStatus.FAILED, "error_code": code, "error_message": message,
                       "finished_at": datetime.now(UTC), "batch_line": line})  # fmt: skip


def _not_a_request(custom_id: str | None, code: str, message: str) -> Line:
    return _failed(code, message, {"custom_id": custom_id, "refused": "line"})


def _refused(custom_id: str, status: int, code: str, message: str, param: str | None) -> Line:
    line = {"custom_id": custom_id, "refused": "request", "status_code": status, "param": param}
    return _failed(code, message, line)


# --- output ---------------------------------------------------------------------


def output(model: str, endpoint: str, chunks: Iterator[Chunk], errors: bool) -> Iterator[bytes]:
    """The output file (`errors` False: the answered requests) or the error file, a
    line per request in input order."""
    for chunk in chunks:
        line = answer(model, ENDPOINTS.get(endpoint, True), chunk)
        response = line["response"]
        if (response is not None and response["status_code"] == 200) != errors:
            yield orjson.dumps(line) + b"\n"


def answer(model: str, chat: bool, chunk: Chunk) -> dict[str, Any]:
    """A line of the output or error file for the chunk of one request."""
    fields = chunk.batch_line or {}
    request_id = chunk.job_id.hex if chunk.job_id else ""
    head = {"id": f"batch_req_{request_id}", "custom_id": fields.get("custom_id")}

    def response(status: int, body: dict[str, Any]) -> dict[str, Any]:
        answered = {"status_code": status, "request_id": request_id, "body": body}
        return {**head, "response": answered, "error": None}

    created = int(chunk.finished_at.timestamp()) if chunk.finished_at else None
    tools = ToolPlan.from_json(fields["tools"]) if fields.get("tools") else None
    shape = CompletionShape(chunk.job_id or uuid.UUID(int=0), model, chat, created, tools)
    if chunk.status == JobStatus.SUCCEEDED and chunk.output_data is not None:
        outputs = {name: array.tolist() for name, array in unpack(chunk.output_data).items()}
        final = {"status": JobStatus.SUCCEEDED, "finish_reason": outputs.get("finish_reason"),
                 "usage": outputs, **json_outputs(outputs)}  # fmt: skip
        return response(200, shape.whole(str(outputs.get("text", "")), final))
    message = chunk.error_message or ""
    if fields.get("refused") == "request":
        body = error_object(fields["status_code"], chunk.error_code or "", message,
                            fields.get("param"))  # fmt: skip
        return response(fields["status_code"], body)
    if fields.get("refused") == "line":
        return {**head, "response": None, "error": {"code": chunk.error_code, "message": message}}
    if chunk.status == JobStatus.FAILED:
        final = {"status": chunk.status, "error": chunk.error_message}
        return response(500, error_object(500, "inference-failed", shape.error(final)["message"],
                                          None))  # fmt: skip
    ended: dict[str, str] = {
        JobStatus.CANCELLED: "the batch was cancelled before this request ran to its end",
        JobStatus.EXPIRED: "the request's deadline passed before it ran",
    }
    error = {"code": f"batch_{chunk.status}", "message": ended.get(chunk.status, chunk.status)}
    return {**head, "response": None, "error": error}


# --- OpenAI's names and the Batch object -----------------------------------------


def batch_id(batch: uuid.UUID) -> str:
    return f"batch_{batch.hex}"


def upload_id(file: uuid.UUID) -> str:
    return f"file-{file.hex}"


def result_file_id(batch: uuid.UUID, errors: bool) -> str:
    """The output (or error) file of a batch: read from its chunks, never copied."""
    return f"file-{batch.hex}-{'errors' if errors else 'output'}"


def parse_id(text: str, prefix: str) -> tuple[uuid.UUID, str] | None:
    """(the id, what follows it) of an id of ours; None for any other text."""
    if not text.startswith(prefix):
        return None
    key, _, rest = text.removeprefix(prefix).partition("-")
    try:
        return uuid.UUID(hex=key), rest
    except ValueError:
        return None


def status(batch: Batch) -> str:
    """OpenAI's status of the batch: a batch whose every request failed is still
    `completed` (its error file says why); `failed` is the file's refusal."""
    if batch.error_code is not None:
        return "failed"
    if batch.status in BATCH_OPEN:
        if batch.cancel_requested_at is not None:
            return "cancelling"
        return "validating" if batch.status == BatchStatus.QUEUED else "in_progress"
    return "cancelled" if batch.status == BatchStatus.CANCELLED else "completed"


def batch_object(batch: Batch, counted: Progress) -> dict[str, Any]:
    """The batch as OpenAI's Batch object."""
    spec, now = batch.openai or {}, status(batch)

    def at(moment: datetime | None, *statuses: str) -> int | None:
        return int(moment.timestamp()) if moment and (not statuses or now in statuses) else None

    finished = batch.finished_at is not None and now != "failed"
    errors = None
    if batch.error_code is not None:
        error = {"code": batch.error_code, "message": batch.error_message, "param": None,
                 "line": None}  # fmt: skip
        errors = {"object": "list", "data": [error]}
    total = counted.rows_done + counted.rows_failed + max(counted.rows_pending, 0)
    return {
        "id": batch_id(batch.id), "object": "batch", "endpoint": spec.get("endpoint"),
        "model": batch.model, "errors": errors, "input_file_id": spec.get("input_file_id"),
        "completion_window": COMPLETION_WINDOW, "status": now,
        "output_file_id": result_file_id(batch.id, False)
        if finished and counted.rows_done else None,
        "error_file_id": result_file_id(batch.id, True)
        if finished and counted.rows_failed else None,
        "created_at": at(batch.created_at), "in_progress_at": at(batch.started_at),
        "expires_at": at(batch.created_at + _WINDOW), "finalizing_at": at(batch.finished_at),
        "completed_at": at(batch.finished_at, "completed"),
        "failed_at": at(batch.finished_at, "failed"), "expired_at": None,
        "cancelling_at": at(batch.cancel_requested_at, "cancelling", "cancelled"),
        "cancelled_at": at(batch.finished_at, "cancelled"),
        "request_counts": {"total": total, "completed": counted.rows_done,
                           "failed": counted.rows_failed},
        "metadata": spec.get("metadata"),
    }  # fmt: skip
