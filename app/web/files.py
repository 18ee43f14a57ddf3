"""/files: upload an input file for batches, streamed into the file store."""

from __future__ import annotations

import uuid
from typing import Any

from flask import request
from marshmallow import Schema, fields

from app.operations.files import FORMATS, File, Upload, format_of
from app.web.auth import authenticated, current_tenant, streams_body
from app.web.blueprint import Blueprint, link, links_by_id
from app.web.context import services

blp = Blueprint("files", __name__, url_prefix="/files", description="Input files for batches")


def file_links(pointer: str = "/id") -> dict[str, Any]:
    """What a client does with a file it uploaded: read it, delete it, run a batch
    or a schedule on it."""
    file_id = f"$response.body#{pointer}"
    return links_by_id(
        pointer, GetFile="get /files/{file_id}", DeleteFile="delete /files/{file_id}"
    ) | {
        "SubmitBatch": link("post", "/batches", body={"file_id": file_id}),
        "CreateSchedule": link("post", "/schedules", body={"input": {"file_id": file_id}}),
    }


class FileSchema(Schema):
    id = fields.UUID()
    filename = fields.String()
    format = fields.String(metadata={"enum": list(FORMATS)})
    size_bytes = fields.Integer()
    sha256 = fields.String()
    created_at = fields.DateTime()


class FileListSchema(Schema):
    items = fields.List(fields.Nested(FileSchema))


class UploadArgsSchema(Schema):
    filename = fields.String(
        load_default="upload", metadata={"description": "Its name; the extension gives the format"}
    )
    format = fields.String(
        load_default=None,
        metadata={"description": "npy, jsonl, csv or parquet, if the name does not say"},
    )


_UPLOAD = {
    "description": "The file's bytes (Content-Type: application/octet-stream), up to "
    "MAX_UPLOAD_BYTES (2 GiB by default): .npy, .jsonl, .csv, or Parquet (a column per "
    "model input, each row a list of the input's values, or one number)",
    "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
}


@blp.post("")
@blp.doc(requestBody=_UPLOAD)
@blp.response(201, FileSchema, links=file_links())
@blp.alt_response(413, response="REQUEST_ENTITY_TOO_LARGE", description="Over MAX_UPLOAD_BYTES")
@blp.alt_response(422, response="UNPROCESSABLE_ENTITY", description="Unknown format or empty")
@blp.alt_response(503, response="SERVICE_UNAVAILABLE", description="The file store failed")
@blp.alt_response(507, response="INSUFFICIENT_STORAGE", description="The file store is full")
@authenticated
@streams_body
@blp.arguments(UploadArgsSchema(), location="query")
def upload(args: dict[str, Any]) -> tuple[File, int, dict[str, str]]:
    operations = services().files
    fmt = format_of(args["filename"], args["format"])
    request.max_content_length = operations.max_upload_bytes  # this route only
    file = operations.upload(current_tenant(), Upload(args["filename"], fmt, request.stream))
    return file, 201, {"Location": f"/files/{file.id}"}


@blp.get("")
@blp.response(200, FileListSchema, links=file_links("/items/0/id"))
@authenticated
def list_files() -> dict[str, Any]:
    return {"items": services().files.list_files(current_tenant())}


@blp.get("/<uuid:file_id>")
@blp.response(200, FileSchema, links=file_links())
@blp.alt_response(404, response="NOT_FOUND", description="No such file for this tenant")
@authenticated
def get_file(file_id: uuid.UUID) -> File:
    return services().files.get(current_tenant(), file_id)


@blp.delete("/<uuid:file_id>")
@blp.response(204)
@blp.alt_response(404, response="NOT_FOUND", description="No such file for this tenant")
@blp.alt_response(409, response="CONFLICT", description="A batch is still reading it")
@authenticated
def delete_file(file_id: uuid.UUID) -> None:
    services().files.delete(current_tenant(), file_id)
