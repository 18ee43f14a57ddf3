"""A job as clients see it: GET /jobs/<id>, list pages, webhook payloads and the
terminal event of a stream all dump it with this schema, so they never differ.
It lives below the HTTP layer because webhooks and event streams use it too."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from marshmallow import Schema, fields

from app.jobs.tables import Job
from app.observability import tracing
from app.runtime.tensors import to_json, unpack
from app.statuses import JobStatus


def _seconds(start: datetime | None, end: datetime | None) -> float | None:
    if start is None:
        return None
    return round(((end or datetime.now(UTC)) - start).total_seconds(), 6)


def stored_outputs(job: Job) -> dict[str, Any] | None:
    """The job's outputs as nested lists. They are stored packed in their declared
    datatypes (`output_data`); `outputs` (JSON) is read for rows written before; a
    running generation's text so far, where the operations looked it up."""
    if job.output_data is not None:
        return to_json(unpack(job.output_data))
    if job.outputs is None:  # a running generation's text so far (JobOperations)
        so_far: dict[str, Any] | None = getattr(job, "so_far", None)
        return so_far
    return job.outputs


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


def _number(kind: Callable[[Any], Any], value: Any) -> Any:
    return None if value is None else kind(value)


class JobSchema(Schema):
    id = fields.UUID()
    status = fields.String(metadata={"enum": [s.value for s in JobStatus]})
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
    trace_id = fields.Method(
        "get_trace_id",
        metadata={"description": "The W3C trace id its spans share (the request's "
                  "`traceparent`), if it came with one"},
    )  # fmt: skip

    def dump(self, obj: Any, *, many: bool | None = None) -> Any:
        """One Job written field by field: marshmallow's generic dump of it was a
        twentieth of a submit's API CPU. It equals Schema.dump, which still serves
        a subclass, a list and any `only` or `exclude` (tests/api/test_fast_load.py)."""
        plain = type(self) is JobSchema and not (many or self.many or self.only or self.exclude)
        if not plain or not isinstance(obj, Job):
            return super().dump(obj, many=many)
        return {
            "id": None if obj.id is None else str(obj.id),
            "status": _text(obj.status),
            "model": _text(obj.model),
            "model_version": _text(obj.model_version),
            "outputs": self.get_outputs(obj),
            "error": self.get_error(obj),
            "attempts": _number(int, obj.attempts),
            "max_attempts": _number(int, obj.max_attempts),
            "deadline_at": _iso(obj.deadline_at),
            "cancel_requested_at": _iso(obj.cancel_requested_at),
            "purged_at": _iso(obj.purged_at),
            "webhook": self.get_webhook(obj),
            "created_at": _iso(obj.created_at),
            "started_at": _iso(obj.started_at),
            "finished_at": _iso(obj.finished_at),
            "queued_seconds": self.get_queued_seconds(obj),
            "running_seconds": self.get_running_seconds(obj),
            "priority": _number(int, obj.priority),
            "compute_seconds": _number(float, obj.compute_seconds),
            "batch_share": _number(float, obj.batch_share),
            "trace_id": self.get_trace_id(obj),
        }

    def get_outputs(self, job: Job) -> dict[str, Any] | None:
        return stored_outputs(job)

    def get_error(self, job: Job) -> dict[str, Any] | None:
        if job.error_code is None:
            return None
        return {"code": job.error_code, "message": job.error_message}

    def get_trace_id(self, job: Job) -> str | None:
        return tracing.trace_id(job.traceparent)

    def get_webhook(self, job: Job) -> dict[str, Any] | None:
        if job.webhook_url is None:
            return None
        return {"url": job.webhook_url, "events": job.webhook_events}

    def get_queued_seconds(self, job: Job) -> float | None:
        return _seconds(job.created_at, job.started_at or job.finished_at)

    def get_running_seconds(self, job: Job) -> float | None:
        return _seconds(job.started_at, job.finished_at)
