"""A job as clients see it: GET /jobs/<id>, list pages, webhook payloads and the
terminal event of a stream all dump it with this schema, so they never differ.
It lives below the HTTP layer because webhooks and event streams use it too."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from marshmallow import Schema, fields

from app.platform.tables import JOB_STATUSES, Job
from app.runtime.tensors import to_json, unpack


def _seconds(start: datetime | None, end: datetime | None) -> float | None:
    if start is None:
        return None
    return round(((end or datetime.now(UTC)) - start).total_seconds(), 6)


def stored_outputs(job: Job) -> dict[str, Any] | None:
    """The job's outputs as nested lists. They are stored packed in their declared
    datatypes (`output_data`); `outputs` (JSON) is read for rows written before."""
    if job.output_data is not None:
        return to_json(unpack(job.output_data))
    return job.outputs


class JobSchema(Schema):
    id = fields.UUID()
    status = fields.String(metadata={"enum": list(JOB_STATUSES)})
    model = fields.String()
    model_version = fields.String()
    outputs = fields.Method(
        "get_outputs",
        allow_none=True,
        metadata={"description": "Output name -> nested list, once succeeded"},
    )
    error = fields.Method("get_error", metadata={"description": "{code, message} when failed"})
    attempts = fields.Integer()
    max_attempts = fields.Integer()
    deadline_at = fields.DateTime(allow_none=True)
    cancel_requested_at = fields.DateTime(allow_none=True)
    purged_at = fields.DateTime(
        allow_none=True, metadata={"description": "When retention deleted inputs and outputs"}
    )
    webhook = fields.Method("get_webhook", metadata={"description": "{url, events}, if any"})
    created_at = fields.DateTime()
    started_at = fields.DateTime(allow_none=True)
    finished_at = fields.DateTime(allow_none=True)
    queued_seconds = fields.Method(
        "get_queued_seconds", metadata={"description": "Time from submit to start (so far)"}
    )
    running_seconds = fields.Method(
        "get_running_seconds", metadata={"description": "Time from start to finish (so far)"}
    )
    priority = fields.Integer(metadata={"description": "0-9 as asked; 10 for a sync call"})
    compute_seconds = fields.Float(
        allow_none=True,
        metadata={
            "description": "Its share of the ONNX Runtime time of the micro-batch it ran in "
            "(the batch's time times batch_share)"
        },
    )
    batch_share = fields.Float(
        allow_none=True,
        metadata={"description": "Its rows over all rows of the micro-batch it ran in"},
    )

    def get_outputs(self, job: Job) -> dict[str, Any] | None:
        return stored_outputs(job)

    def get_error(self, job: Job) -> dict[str, Any] | None:
        if job.error_code is None:
            return None
        return {"code": job.error_code, "message": job.error_message}

    def get_webhook(self, job: Job) -> dict[str, Any] | None:
        if job.webhook_url is None:
            return None
        return {"url": job.webhook_url, "events": job.webhook_events}

    def get_queued_seconds(self, job: Job) -> float | None:
        return _seconds(job.created_at, job.started_at or job.finished_at)

    def get_running_seconds(self, job: Job) -> float | None:
        return _seconds(job.started_at, job.finished_at)
