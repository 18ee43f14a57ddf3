"""/batches: many rows for one model, run as chunk jobs; progress, results, cancel.
Handlers only translate HTTP; the batch operations do the work."""

from __future__ import annotations

import uuid
from typing import Any

from flask import Response, request, stream_with_context
from marshmallow import Schema, fields, validate

from app.operations import BatchRequest, Webhook
from app.operations.batches import BATCH_EVENTS, BatchSchema, results
from app.web.auth import authenticated, current_tenant
from app.web.blueprint import Blueprint, links_by_id
from app.web.context import services
from app.web.schemas import WebhookSchema

blp = Blueprint("batches", __name__, url_prefix="/batches", description="Batch inference")


def batch_links(pointer: str = "/id") -> dict[str, Any]:
    """What a client does with a batch it got: follow it, cancel it, read its results,
    its input file."""
    return links_by_id(
        pointer,
        GetBatch="get /batches/{batch_id}",
        CancelBatch="post /batches/{batch_id}/cancel",
        BatchResults="get /batches/{batch_id}/results",
    ) | links_by_id(f"{pointer.removesuffix('/id')}/file_id", GetInputFile="get /files/{file_id}")


class BatchWebhookSchema(WebhookSchema):
    events = fields.List(
        fields.String(validate=validate.OneOf(BATCH_EVENTS)),
        load_default=list(BATCH_EVENTS),
        validate=validate.Length(min=1),
        metadata={"description": f"Any of {', '.join(BATCH_EVENTS)}; default: all"},
    )


class SubmitBatchSchema(Schema):
    model = fields.String(required=True, metadata={"example": "digits"})
    version = fields.String(load_default=None)
    inputs = fields.Raw(
        load_default=None,
        metadata={
            "description": "Rows as in a job's inputs (along the first axis); for a "
            "generative model a list of requests, each a job's body without the model "
            '({"inputs": {...}, "parameters": {...}}); or file_id'
        },
    )
    file_id = fields.UUID(
        load_default=None, metadata={"description": "An uploaded file (POST /files); or inputs"}
    )
    webhook = fields.Nested(BatchWebhookSchema, load_default=None)


class BatchListArgsSchema(Schema):
    limit = fields.Integer(load_default=50, validate=validate.Range(min=1, max=200))


class BatchListSchema(Schema):
    items = fields.List(fields.Nested(BatchSchema))


class ResultsArgsSchema(Schema):
    output = fields.String(
        load_default=None,
        metadata={"description": ".npy and Parquet: one output (default: all; in an .npy, "
                  "as a structured array with a field per output)"},
    )  # fmt: skip


@blp.post("")
@blp.response(202, BatchSchema, description="Accepted; follow the Location URL",
              links=batch_links())  # fmt: skip
@blp.alt_response(404, response="NOT_FOUND", description="Unknown model or file")
@blp.alt_response(422, response="UNPROCESSABLE_ENTITY", description="Rows do not fit the model")
@authenticated
@blp.arguments(SubmitBatchSchema())
def submit(body: dict[str, Any]) -> tuple[dict[str, Any], int, dict[str, str]]:
    webhook = body["webhook"]
    batch = services().batches.create(
        current_tenant(),
        BatchRequest(
            body["model"],
            body["version"],
            inputs=body["inputs"],
            file_id=body["file_id"],
            webhook=Webhook(webhook["url"], tuple(webhook["events"])) if webhook else None,
        ),
    )
    return batch, 202, {"Location": f"/batches/{batch['id']}"}


@blp.get("")
@blp.response(200, BatchListSchema, links=batch_links("/items/0/id"))
@authenticated
@blp.arguments(BatchListArgsSchema(), location="query")
def list_batches(args: dict[str, Any]) -> dict[str, Any]:
    return {"items": services().batches.list_batches(current_tenant(), args["limit"])}


@blp.get("/<uuid:batch_id>")
@blp.response(200, BatchSchema, links=batch_links())
@blp.alt_response(404, response="NOT_FOUND", description="No such batch for this tenant")
@authenticated
def get_batch(batch_id: uuid.UUID) -> dict[str, Any]:
    return services().batches.get(current_tenant(), batch_id)


@blp.post("/<uuid:batch_id>/cancel")
@blp.response(200, BatchSchema, description="Queued chunks stopped; running ones stop next",
              links=batch_links())  # fmt: skip
@blp.alt_response(404, response="NOT_FOUND", description="No such batch for this tenant")
@blp.alt_response(409, response="CONFLICT", description="The batch has already finished")
@authenticated
def cancel_batch(batch_id: uuid.UUID) -> dict[str, Any]:
    return services().batches.cancel(current_tenant(), batch_id)


@blp.get("/<uuid:batch_id>/results")
@blp.doc(
    responses={
        "200": {
            "description": "The outputs in input order, streamed: JSONL (a line per row, "
            "with its error where its chunk failed); with `Accept: application/x-npy` one "
            ".npy array; with `Accept: application/vnd.apache.parquet` a Parquet file, a "
            "column per output (.npy and Parquet: every row must have succeeded)",
            "content": {results.JSONL: {}, results.NPY: {}, results.PARQUET: {}},
        }
    }
)
@blp.alt_response(404, response="NOT_FOUND", description="No such batch for this tenant")
@blp.alt_response(409, response="CONFLICT", description="Not finished, or rows missing (.npy)")
@authenticated
@blp.arguments(ResultsArgsSchema(), location="query")
def batch_results(args: dict[str, Any], batch_id: uuid.UUID) -> Response:
    fmt = request.accept_mimetypes.best_match(
        [results.JSONL, results.NPY, results.PARQUET], results.JSONL
    )
    # The stream reads in sessions of its own: the request holds no connection.
    body, name = services().batches.results(current_tenant(), batch_id, fmt, args["output"])
    return Response(
        stream_with_context(body), mimetype=fmt,
        headers={"Content-Disposition": f'attachment; filename="{name}"'},
    )  # fmt: skip
