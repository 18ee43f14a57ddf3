"""OpenAI's Files and Batch APIs at /v1: `POST /v1/files` (multipart, `purpose`
"batch"), `GET /v1/files[/<id>[/content]]`, `DELETE /v1/files/<id>`,
`POST /v1/batches`, `GET /v1/batches[/<id>]`, `POST /v1/batches/<id>/cancel`.

The official `openai` client's `files` and `batches` work unchanged. These are
the batch door's and the file store's operations under OpenAI's names and
objects (app.operations.openai_batches); errors are OpenAI's error objects, as
everywhere under /v1 (app.web.problems).
"""

from __future__ import annotations

from typing import Any

from flask import Blueprint, Response, request, stream_with_context

from app.operations.openai_batches import COMPLETION_WINDOW, OpenAIBatches
from app.web.auth import authenticated, current_tenant, streams_body
from app.web.context import services
from app.web.openai import invalid, json_body

# Outside /openapi.json, as the rest of /v1: OpenAI's API reference describes these.
blp = Blueprint("openai_batches", __name__, url_prefix="/v1")


def _operations() -> OpenAIBatches:
    return OpenAIBatches(services().batches, services().files)


@blp.post("/files")
@authenticated
@streams_body
def upload_file() -> tuple[dict[str, Any], int]:
    """A batch's input file, as OpenAI's `files.create(file=..., purpose="batch")`."""
    request.max_content_length = services().files.max_upload_bytes  # this route only
    if request.form.get("purpose") != "batch":
        raise invalid("purpose", 'only "batch" is supported (a batch\'s input file)')
    upload = request.files.get("file")
    if upload is None:
        raise invalid("file", "expected the file as a multipart part named `file`")
    filename = upload.filename or "batch.jsonl"
    return _operations().upload(current_tenant(), filename, upload.stream), 200


@blp.get("/files")
@authenticated
def list_files() -> dict[str, Any]:
    data = _operations().list_files(current_tenant())
    return {"object": "list", "data": data, "has_more": False}


@blp.get("/files/<file_id>")
@authenticated
def get_file(file_id: str) -> dict[str, Any]:
    return _operations().file(current_tenant(), file_id)


@blp.delete("/files/<file_id>")
@authenticated
def delete_file(file_id: str) -> dict[str, Any]:
    return _operations().delete_file(current_tenant(), file_id)


@blp.get("/files/<file_id>/content")
@authenticated
def file_content(file_id: str) -> Response:
    body = _operations().content(current_tenant(), file_id)
    return Response(stream_with_context(body), mimetype="application/octet-stream")


@blp.post("/batches")
@authenticated
def create_batch() -> dict[str, Any]:
    """A batch of an uploaded file's requests (OpenAI's `batches.create`)."""
    body = json_body()
    if unknown := sorted(set(body) - {"input_file_id", "endpoint", "completion_window",
                                      "metadata"}):  # fmt: skip
        raise invalid(unknown[0], "is not supported by this service")
    file_id = body.get("input_file_id")
    if not isinstance(file_id, str) or not file_id:
        raise invalid("input_file_id", "expected the id of a file uploaded with purpose batch")
    if body.get("completion_window") != COMPLETION_WINDOW:
        raise invalid("completion_window", f"only {COMPLETION_WINDOW!r} is supported")
    return _operations().create(
        current_tenant(), file_id, str(body.get("endpoint")), body.get("metadata")
    )


@blp.get("/batches")
@authenticated
def list_batches() -> dict[str, Any]:
    """A cursor page of batches, newest first (`limit` 1-100, default 20; `after`)."""
    limit = request.args.get("limit", "20")
    if not limit.isdigit() or not 1 <= int(limit) <= 100:
        raise invalid("limit", "expected an integer from 1 to 100")
    after = request.args.get("after") or None
    return _operations().list_batches(current_tenant(), int(limit), after)


@blp.get("/batches/<batch_id>")
@authenticated
def get_batch(batch_id: str) -> dict[str, Any]:
    return _operations().get(current_tenant(), batch_id)


@blp.post("/batches/<batch_id>/cancel")
@authenticated
def cancel_batch(batch_id: str) -> dict[str, Any]:
    return _operations().cancel(current_tenant(), batch_id)
