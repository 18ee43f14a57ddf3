"""Request and response schemas of jobs (the shared ones too: problems, webhooks,
instants): the API's contract, also its OpenAPI description. Those of the
records kept beside jobs are app.web.record_schemas."""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any, ClassVar

from marshmallow import EXCLUDE, INCLUDE, Schema, ValidationError, fields, missing, validate

from app.operations.jobs import JobSchema
from app.operations.webhooks import DEFAULT_EVENTS, EVENTS
from app.statuses import JobStatus

MAX_CANCEL_AFTER_S = 366 * 24 * 3600


def _real_offset(value: datetime) -> None:
    """Offsets real time zones use: PostgreSQL refuses beyond about ±16 h (a 500)."""
    offset = value.utcoffset()
    if offset is not None and abs(offset) > timedelta(hours=14):
        raise ValidationError("the UTC offset must be between -14:00 and +14:00")


def instant(**kwargs: Any) -> fields.AwareDateTime:
    """An ISO 8601 date and time with a real UTC offset."""
    return fields.AwareDateTime(validate=_real_offset, **kwargs)


class ProblemSchema(Schema):
    """RFC 9457 problem details, the body of every error. Problems carry extension
    members of their own (`errors`, `expected`, `job_id`, `limit`, ...)."""

    class Meta:
        unknown = INCLUDE

    type = fields.String(metadata={"example": "/problems/invalid-input"})
    title = fields.String()
    status = fields.Integer()
    detail = fields.String(metadata={"description": "What was wrong, for a person"})
    instance = fields.String(metadata={"description": "The request path"})
    errors = fields.Raw(metadata={"description": "Field or input name -> what was wrong"})


class WebhookSchema(Schema):
    url = fields.String(
        required=True,
        validate=validate.Length(max=2000),
        metadata={"description": "http(s) URL on a public address; checked again at each delivery"},
    )
    events = fields.List(
        fields.String(validate=validate.OneOf(EVENTS)),
        load_default=list(DEFAULT_EVENTS),
        validate=validate.Length(min=1),
        metadata={"description": f"Any of {', '.join(EVENTS)}; default: the terminal ones"},
    )


class SubmitJobSchema(Schema):
    model = fields.String(
        required=True, metadata={"description": "Model name, see GET /models", "example": "digits"}
    )
    version = fields.String(
        load_default=None, metadata={"description": "Model version; the highest when omitted"}
    )
    inputs = fields.Raw(
        required=True,
        metadata={
            "description": 'Either {"<input name>": <nested list>} or a list of KServe v2 '
            'tensors [{"name", "shape", "datatype", "data"}]. Checked against the model '
            "at submit time: a wrong name, shape or datatype is a 422. BYTES inputs "
            '(text) are lists of strings, e.g. {"text": ["A man is eating food."]}.',
            "example": {"pixels": [[0.0] * 64]},
        },
    )
    parameters = fields.Dict(
        load_default=None,
        metadata={
            "description": "A generative model's sampling parameters: max_tokens, "
            "temperature, top_p, top_k, seed, stop (its card lists them and their limits); "
            "other models take none.",
            "example": {"max_tokens": 64, "temperature": 0},
        },
    )
    webhook = fields.Nested(
        WebhookSchema,
        load_default=None,
        metadata={"description": "Push this job's events, signed per Standard Webhooks"},
    )
    deadline = instant(
        load_default=None,
        metadata={
            "description": "The job expires (status expired) if not finished by then. "
            "The Cancel-After header (seconds) is the relative form."
        },
    )
    priority = fields.Integer(
        load_default=0,
        strict=True,
        validate=validate.Range(min=0, max=9),
        metadata={
            "description": "0-9, higher first among the model's queued jobs, up to your "
            "tenant's allowance (default 5; more is a 422). Tenants take turns within a "
            "priority; sync calls (/v2/models/<m>/infer) run ahead of every job."
        },
    )

    # What fast_load passes on: strings of these lengths (or null) for the first,
    # only null (their load_default) for the second; any other key is left to load().
    _FAST_STRINGS: ClassVar[dict[str, tuple[int, float]]] = {"version": (0, math.inf)}
    _FAST_NULLS: ClassVar[tuple[str, ...]] = ("webhook", "deadline", "parameters")

    def fast_load(self, data: Any) -> dict[str, Any] | None:
        """The usual body (a model, inputs, perhaps a version and a priority) loaded
        without marshmallow's per-field work, a tenth of a submit's API CPU; None for
        any other body, which load() then takes and words its errors for. Where it
        answers it equals load(): tests/api/test_fast_load.py."""
        if type(data) is not dict or self.only or self.exclude or self.partial:
            return None
        model, inputs, priority = data.get("model"), data.get("inputs"), data.get("priority", 0)
        if type(model) is not str or inputs is None or type(priority) is not int:
            return None
        if not 0 <= priority <= 9:
            return None
        loaded = {"model": model, "inputs": inputs, "priority": priority}
        for name, (shortest, longest) in self._FAST_STRINGS.items():
            value = loaded[name] = data.get(name)
            if value is not None and not (type(value) is str and shortest <= len(value) <= longest):
                return None
        for name in self._FAST_NULLS:
            if data.get(name) is not None:
                return None
            loaded[name] = None
        return loaded if data.keys() <= loaded.keys() else None


class SubmitHeadersSchema(Schema):
    class Meta:
        unknown = EXCLUDE

    cancel_after = fields.Float(
        data_key="Cancel-After",
        validate=validate.Range(min=0, min_inclusive=False, max=MAX_CANCEL_AFTER_S),
        metadata={
            "description": "Seconds (at most a year): the job expires if not finished by then"
        },
    )
    prefer = fields.String(
        data_key="Prefer",
        metadata={
            "description": "RFC 7240. `wait=N`: wait up to N seconds (capped by "
            "MAX_WAIT_SECONDS) for the job to finish; 200 with the finished job, or 202 "
            "with the job as it stands when the time is up. Preference-Applied says so."
        },
    )
    idempotency_key = fields.String(
        data_key="Idempotency-Key",
        validate=validate.Length(min=1, max=255),
        metadata={
            "description": "Makes a retried POST safe. Scoped to your tenant and kept 24 "
            "hours: the same key with the same model, version and inputs returns the job "
            "the first request created (202 again); with a different request it is a 422; "
            "while the first request is still being processed, a repeat is a 409 with "
            "Retry-After."
        },
    )

    def fast_load(self, data: Mapping[str, Any]) -> dict[str, Any] | None:
        """Most submits send none of these headers: nothing to load (as load() finds)."""
        keys = ("Cancel-After", "Prefer", "Idempotency-Key")
        return {} if all(data.get(key, missing) is missing for key in keys) else None


MAX_BULK_JOBS = 1000  # a bulk's jobs: one INSERT; bounded like MAX_REQUEST_BYTES bounds bytes


class BulkJobSchema(SubmitJobSchema):
    """A job of a bulk: a POST /jobs body, with its headers as fields."""

    idempotency_key = fields.String(
        load_default=None,
        validate=validate.Length(min=1, max=255),
        metadata={
            "description": "As the Idempotency-Key header of POST /jobs: this item's job "
            "is made once; a retried bulk gets it again in this item's place"
        },
    )
    cancel_after = fields.Float(
        load_default=None,
        validate=validate.Range(min=0, min_inclusive=False, max=MAX_CANCEL_AFTER_S),
        metadata={"description": "As the Cancel-After header of POST /jobs (seconds)"},
    )

    _FAST_STRINGS: ClassVar[dict[str, tuple[int, float]]] = {
        **SubmitJobSchema._FAST_STRINGS,
        "idempotency_key": (1, 255),
    }
    _FAST_NULLS = (*SubmitJobSchema._FAST_NULLS, "cancel_after")


class EachOnItsOwn(fields.List):
    """A list whose items load one by one: a bad item becomes its own
    ValidationError in the list, so one bad job never refuses the others."""

    def _deserialize(self, value: Any, attr: Any, data: Any, **kwargs: Any) -> list[Any]:
        if not isinstance(value, list):
            raise self.make_error("invalid")
        loaded: list[Any] = []
        fast = getattr(getattr(self.inner, "schema", None), "fast_load", None)
        for item in value:
            try:
                quick = fast(item) if fast is not None else None
                if quick is None:
                    quick = self.inner.deserialize(item, **kwargs)
                loaded.append(quick)
            except ValidationError as exc:
                loaded.append(exc)
        return loaded


class BulkSubmitSchema(Schema):
    jobs = EachOnItsOwn(
        fields.Nested(BulkJobSchema),
        required=True,
        validate=validate.Length(min=1, max=MAX_BULK_JOBS),
        metadata={
            "description": f"1 to {MAX_BULK_JOBS} job requests, each as a POST /jobs body "
            "(with `idempotency_key` and `cancel_after` in place of those headers). Each is "
            "checked on its own: a bad one is refused alone."
        },
    )


class JobOrProblem(fields.Field):
    """A bulk's item: its job, or the problem object that refused it."""

    def _serialize(self, value: Any, attr: Any, obj: Any, **kwargs: Any) -> Any:
        return value if isinstance(value, dict) else JobSchema().dump(value)


class BulkSubmittedSchema(Schema):
    jobs = fields.List(
        JobOrProblem(
            metadata={
                "anyOf": [
                    {"$ref": "#/components/schemas/Job"},
                    {"$ref": "#/components/schemas/Problem"},
                ]
            }
        ),
        metadata={
            "description": "In request order: the accepted job (as POST /jobs answers it; "
            "an Idempotency-Key's earlier job), or an RFC 9457 problem object saying why "
            "that item alone was refused (its `status` a number, its `index` its place)"
        },
    )
    accepted = fields.Integer(metadata={"description": "Items answered with a job"})
    refused = fields.Integer(metadata={"description": "Items answered with a problem"})


class GetJobArgsSchema(Schema):
    wait = fields.Float(
        load_default=0,
        validate=validate.Range(min=0),
        metadata={
            "description": "Seconds (at most 30) to wait for the job's next change "
            "while it is unfinished, instead of polling"
        },
    )


class EventStreamArgsSchema(Schema):
    last_event_id = fields.Integer(
        validate=validate.Range(min=0),
        metadata={"description": "Resume after this event (the Last-Event-ID header wins)"},
    )


class JobErrorSchema(Schema):
    code = fields.String()
    message = fields.String()


class JobListItemSchema(JobSchema):
    """A job in a list: its outputs only when the list was asked for them
    (`include=outputs`); otherwise they are never read from the database."""

    outputs = fields.Method(
        "get_outputs",
        allow_none=True,
        metadata={"description": "With ?include=outputs; else null (GET /jobs/<id> has them)"},
    )

    def get_outputs(self, job: Any) -> Any:
        if "output_data" not in job.__dict__:  # a deferred column not loaded is not in __dict__
            return None
        return super().get_outputs(job)


class JobPageSchema(Schema):
    items = fields.List(fields.Nested(JobListItemSchema))
    next_cursor = fields.String(
        allow_none=True, metadata={"description": "Pass as ?cursor= for the next page"}
    )


class ListJobsArgsSchema(Schema):
    status = fields.String(validate=validate.OneOf([s.value for s in JobStatus]))
    model = fields.String()
    limit = fields.Integer(load_default=50, validate=validate.Range(min=1, max=200))
    cursor = fields.String()
    include = fields.String(
        validate=validate.OneOf(["outputs"]),
        metadata={"description": "`outputs` to have each job's outputs in the list"},
    )
