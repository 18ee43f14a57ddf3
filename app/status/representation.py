"""The status as JSON (`GET /status.json`), and its schema for the OpenAPI document."""

from __future__ import annotations

from typing import Any

from marshmallow import Schema, fields

from app.status.board import DEAD_LETTER_CAP, LetterLine, ModelLine, Status
from app.status.streams import StreamLine, StreamTotals


class ModelLineSchema(Schema):
    model = fields.String(
        allow_none=True,
        metadata={"description": "null: the models not open to every tenant, together "
                  "(their names are shown to operators only)"},
    )  # fmt: skip
    queued = fields.Integer()
    oldest_queued_seconds = fields.Float(
        allow_none=True, metadata={"description": "Since the oldest queued job was submitted"}
    )
    running = fields.Integer()
    succeeded = fields.Integer(metadata={"description": "Finished in the window"})
    failed = fields.Integer()
    cancelled = fields.Integer()
    expired = fields.Integer()


class WorkerSchema(Schema):
    hostname = fields.String()
    queues = fields.List(fields.String())


class WorkersSchema(Schema):
    reachable = fields.Boolean(metadata={"description": "false: the broker did not answer"})
    online = fields.Integer(
        metadata={"description": "Workers serving the service's queues that answered a 1 s census"}
    )
    queues = fields.Dict(
        keys=fields.String(),
        values=fields.Integer(),
        metadata={"description": "Workers consuming each of the service's queues"},
    )
    hosts = fields.List(fields.Nested(WorkerSchema), metadata={"description": "Operators only"})


class DeadLetterLineSchema(Schema):
    id = fields.Integer()
    kind = fields.String(metadata={"description": "job: a failed job; webhook: undeliverable"})
    job_id = fields.UUID(allow_none=True)
    batch_id = fields.UUID(allow_none=True)
    tenant = fields.String()
    model = fields.String()
    model_version = fields.String()
    error_code = fields.String()
    error_class = fields.String()
    message = fields.String(metadata={"description": "At most 300 characters"})
    attempts = fields.Integer()
    last_failed_at = fields.DateTime()
    replayed_at = fields.DateTime(allow_none=True)


class StreamTotalsSchema(Schema):
    bindings = fields.Integer(metadata={"description": "Stream bindings of every tenant"})
    lag = fields.Integer(
        metadata={"description": "Entries of their input logs not yet read by the consumers"}
    )
    lag_capped = fields.Boolean(
        metadata={"description": "true: some lag was only counted up to 1000 (Redis 6.2)"}
    )
    lag_seconds = fields.Float(metadata={"description": "Age of the oldest entry not yet read"})
    pending = fields.Integer(metadata={"description": "Read and not yet acknowledged"})
    unpublished = fields.Integer(
        metadata={"description": "Accepted, their result not yet in the output log"}
    )


class StreamLineSchema(Schema):
    id = fields.UUID()
    tenant = fields.String()
    model = fields.String()
    input = fields.String()
    output = fields.String()
    dead_letter = fields.String()
    paused = fields.Boolean()
    lag = fields.Integer(allow_none=True, metadata={"description": "null: not known"})
    lag_capped = fields.Boolean()
    lag_seconds = fields.Float(allow_none=True)
    pending = fields.Integer(allow_none=True)
    unpublished = fields.Integer()


class StatusSchema(Schema):
    """Aggregate numbers for anyone; the newest dead letters and the workers'
    names for an operator (`Authorization: Bearer <operator key>`)."""

    as_of = fields.DateTime()
    window_seconds = fields.Float(metadata={"description": "The window of the finished counts"})
    models = fields.List(fields.Nested(ModelLineSchema))
    totals = fields.Nested(ModelLineSchema)
    dead_letters_open = fields.Integer(
        metadata={"description": f"Not replayed; counted up to {DEAD_LETTER_CAP + 1}"}
    )
    workers = fields.Nested(WorkersSchema)
    links = fields.Dict(keys=fields.String(), values=fields.String(allow_none=True))
    operator = fields.Boolean(metadata={"description": "Whether the operator view is shown"})
    dead_letters = fields.List(
        fields.Nested(DeadLetterLineSchema),
        metadata={"description": "Operators only: the newest 20"},
    )
    streams = fields.Nested(StreamTotalsSchema, metadata={"description": "The stream door"})
    stream_bindings = fields.List(
        fields.Nested(StreamLineSchema),
        metadata={"description": "Operators only: each binding's lag"},
    )


def _line(line: ModelLine) -> dict[str, Any]:
    return {
        "model": line.model,
        "queued": line.queued,
        "oldest_queued_seconds": line.oldest_queued_s,
        "running": line.running,
        **line.finished,
    }


def _letter(letter: LetterLine) -> dict[str, Any]:
    return {name: getattr(letter, name) for name in DeadLetterLineSchema().fields}


def _stream_totals(totals: StreamTotals) -> dict[str, Any]:
    return {
        "bindings": totals.bindings, "lag": totals.lag, "lag_capped": totals.lag_capped,
        "lag_seconds": totals.behind_s, "pending": totals.pending,
        "unpublished": totals.unpublished,
    }  # fmt: skip


def _stream(line: StreamLine) -> dict[str, Any]:
    state = line.state
    return {
        "id": line.binding_id, "tenant": line.tenant, "model": line.model, "input": line.input,
        "output": line.output, "dead_letter": line.dead_letter, "paused": line.paused,
        "lag": state.lag if state else None, "lag_capped": bool(state and state.lag_capped),
        "lag_seconds": state.behind_s if state else None,
        "pending": state.pending if state else None, "unpublished": line.unpublished,
    }  # fmt: skip


def status_dict(status: Status, links: dict[str, str | None]) -> dict[str, Any]:
    snap, census = status.snapshot, status.snapshot.census
    workers: dict[str, Any] = {
        "reachable": census.reachable,
        "online": census.online,
        "queues": {queue: census.serving(queue) for queue in census.queues},
    }
    body: dict[str, Any] = {
        "as_of": snap.at,
        "window_seconds": snap.window_s,
        "models": [_line(line) for line in snap.models],
        "totals": _line(snap.totals),
        "dead_letters_open": snap.open_dead_letters,
        "workers": workers,
        "links": links,
        "operator": status.operator,
        "streams": _stream_totals(snap.stream_totals),
    }
    if status.operator:
        workers["hosts"] = [{"hostname": h, "queues": q} for h, q in census.workers.items()]
        body["dead_letters"] = [_letter(letter) for letter in status.letters]
        body["stream_bindings"] = [_stream(line) for line in snap.streams]
    return body
