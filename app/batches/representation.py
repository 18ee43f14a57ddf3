"""A batch as clients see it: GET /batches/<id> and its webhooks' payloads."""

from __future__ import annotations

from typing import Any

from marshmallow import Schema, fields
from sqlalchemy.orm import Session

from app.batches.progress import progress
from app.batches.tables import Batch
from app.statuses import BATCH_OPEN, BatchStatus


class FailedRowsSchema(Schema):
    first = fields.Integer(metadata={"description": "First row of the range (from 0)"})
    last = fields.Integer(metadata={"description": "Last row of the range, inclusive"})
    status = fields.String(metadata={"description": "failed, cancelled or expired"})
    error = fields.String(allow_none=True, metadata={"description": "The chunk's error code"})


class BatchSchema(Schema):
    id = fields.UUID()
    status = fields.String(metadata={"enum": [s.value for s in BatchStatus]})
    model = fields.String()
    model_version = fields.String()
    file_id = fields.UUID(allow_none=True, attribute="input_file_id")
    rows = fields.Integer(allow_none=True, metadata={"description": "Known once split"})
    rows_done = fields.Integer(metadata={"description": "Rows with outputs"})
    rows_failed = fields.Integer(metadata={"description": "Rows whose chunk failed or stopped"})
    rows_pending = fields.Integer()
    chunk_rows = fields.Integer()
    chunks = fields.Dict(
        keys=fields.String(), values=fields.Integer(),
        metadata={"description": "Chunk jobs by status"},
    )  # fmt: skip
    failed_rows = fields.List(
        fields.Nested(FailedRowsSchema),
        metadata={"description": "Row ranges without outputs (the first 100 ranges)"},
    )
    eta_seconds = fields.Float(allow_none=True, metadata={"description": "At the rate so far"})
    error = fields.Dict(allow_none=True, metadata={"description": "{code, message} of the batch"})
    webhook = fields.Dict(allow_none=True)
    results_url = fields.String(allow_none=True)
    created_at = fields.DateTime()
    started_at = fields.DateTime(allow_none=True)
    finished_at = fields.DateTime(allow_none=True)
    cancel_requested_at = fields.DateTime(allow_none=True)
    schedule_id = fields.UUID(allow_none=True, metadata={"description": "The schedule it runs for"})
    scheduled_for = fields.DateTime(allow_none=True, metadata={"description": "Its tick"})
    output_path = fields.String(
        allow_none=True, metadata={"description": "Where its results are written"}
    )
    exported_at = fields.DateTime(allow_none=True)


def describe(session: Session, batch: Batch) -> dict[str, Any]:
    """The batch with its progress counted from its chunks, ready for BatchSchema."""
    counted = progress(session, batch)
    finished = batch.status not in BATCH_OPEN
    return {
        **{c: getattr(batch, c) for c in (
            "id", "status", "model", "model_version", "input_file_id", "rows", "chunk_rows",
            "created_at", "started_at", "finished_at", "cancel_requested_at", "schedule_id",
            "scheduled_for", "output_path", "exported_at")},
        "rows_done": counted.rows_done,
        "rows_failed": counted.rows_failed,
        "rows_pending": counted.rows_pending,
        "chunks": counted.chunks,
        "failed_rows": counted.failed_rows,
        "eta_seconds": counted.eta_seconds,
        "error": {"code": batch.error_code, "message": batch.error_message}
        if batch.error_code else None,
        "webhook": {"url": batch.webhook_url, "events": batch.webhook_events}
        if batch.webhook_url else None,
        "results_url": f"/batches/{batch.id}/results" if finished else None,
    }  # fmt: skip
