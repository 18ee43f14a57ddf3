"""Response (and query) schemas of what the service keeps and reports beside jobs:
model metadata, configuration and statistics, dead letters, webhook deliveries
and usage."""

from __future__ import annotations

from marshmallow import Schema, fields, validate

from app.web.schemas import instant


class TensorMetadataSchema(Schema):
    name = fields.String()
    datatype = fields.String()
    shape = fields.List(fields.Integer())


class ModelMetadataSchema(Schema):
    """KServe v2 model metadata."""

    name = fields.String()
    versions = fields.List(fields.String())
    platform = fields.String()
    inputs = fields.List(fields.Nested(TensorMetadataSchema))
    outputs = fields.List(fields.Nested(TensorMetadataSchema))


class ConfigTensorSchema(Schema):
    name = fields.String()
    data_type = fields.String(metadata={"example": "TYPE_FP32"})
    dims = fields.List(fields.Integer(), metadata={"description": "without the batch dimension"})


class ModelConfigSchema(Schema):
    """Triton's model configuration (its protobuf message as JSON)."""

    name = fields.String()
    platform = fields.String()
    backend = fields.String()
    max_batch_size = fields.Integer()
    input = fields.List(fields.Nested(ConfigTensorSchema))
    output = fields.List(fields.Nested(ConfigTensorSchema))
    dynamic_batching = fields.Dict()
    model_transaction_policy = fields.Dict(
        metadata={"description": "`decoupled: true` for generative models"}
    )
    ensemble_scheduling = fields.Dict(
        metadata={"description": "a pipeline's steps (platform `ensemble`): each step's "
                  "`model_name`, `model_version` and `input_map`/`output_map` of tensors"}
    )  # fmt: skip
    version_policy = fields.Dict(
        metadata={
            "description": 'which versions serve: `{"all": {}}`, `{"latest": {"num_versions": '
            'N}}` or `{"specific": {"versions": [1, 3]}}`'
        }
    )
    parameters = fields.Dict(
        metadata={"description": '`{"<name>": {"string_value": "..."}}`, as a load set them'}
    )


class DurationSchema(Schema):
    count = fields.Integer()
    ns = fields.Integer(metadata={"description": "cumulative nanoseconds"})


class InferStatisticsSchema(Schema):
    success = fields.Nested(DurationSchema)
    fail = fields.Nested(DurationSchema)
    queue = fields.Nested(DurationSchema)
    compute_input = fields.Nested(DurationSchema)
    compute_infer = fields.Nested(DurationSchema)
    compute_output = fields.Nested(DurationSchema)
    cache_hit = fields.Nested(DurationSchema)
    cache_miss = fields.Nested(DurationSchema)


class ModelStatSchema(Schema):
    """One model version's statistics, from your own jobs."""

    name = fields.String()
    version = fields.String()
    last_inference = fields.Integer(metadata={"description": "ms since the epoch; 0: none"})
    inference_count = fields.Integer()
    execution_count = fields.Integer()
    inference_stats = fields.Nested(InferStatisticsSchema)
    response_stats = fields.Dict()
    batch_stats = fields.List(fields.Dict())
    memory_usage = fields.List(fields.Dict())


class ModelStatisticsSchema(Schema):
    """Triton's statistics extension's answer."""

    model_stats = fields.List(fields.Nested(ModelStatSchema))


class ModelSummarySchema(Schema):
    name = fields.String()
    version = fields.String()
    versions = fields.List(fields.String())
    platform = fields.String()
    description = fields.String()
    inputs = fields.List(fields.Nested(TensorMetadataSchema))
    outputs = fields.List(fields.Nested(TensorMetadataSchema))
    labels = fields.List(fields.String())
    metrics = fields.Dict()


class ModelListSchema(Schema):
    models = fields.List(fields.Nested(ModelSummarySchema))


class DeadLetterSchema(Schema):
    id = fields.Integer()
    job_id = fields.UUID()
    model = fields.String()
    model_version = fields.String()
    error_code = fields.String()
    error_class = fields.String()
    message = fields.String()
    traceback = fields.Constant(
        None, metadata={"description": "Shown to operators only: GET /dead-letters/<id>/traceback"}
    )
    attempts = fields.Integer()
    first_failed_at = fields.DateTime()
    last_failed_at = fields.DateTime()
    created_at = fields.DateTime()
    replayed_at = fields.DateTime(allow_none=True)


class TracebackSchema(Schema):
    id = fields.Integer()
    tenant_id = fields.Integer()
    traceback = fields.String(allow_none=True)


class DeadLetterFiltersSchema(Schema):
    model = fields.String()
    error_code = fields.String()
    since = instant(metadata={"description": "Created at or after"})
    until = instant(metadata={"description": "Created before"})
    replayed = fields.Boolean()


class DeadLetterListArgsSchema(DeadLetterFiltersSchema):
    limit = fields.Integer(load_default=50, validate=validate.Range(min=1, max=200))
    cursor = fields.Integer(metadata={"description": "next_cursor of the previous page"})


class DeadLetterPageSchema(Schema):
    items = fields.List(fields.Nested(DeadLetterSchema))
    next_cursor = fields.Integer(allow_none=True)


class BulkReplaySchema(DeadLetterFiltersSchema):
    limit = fields.Integer(load_default=100, validate=validate.Range(min=1, max=1000))


class ReplayResultSchema(Schema):
    replayed = fields.Integer()
    job_ids = fields.List(fields.UUID())


class WebhookAttemptSchema(Schema):
    at = fields.DateTime()
    url = fields.String()
    status_code = fields.Integer(allow_none=True)
    error = fields.String(allow_none=True)
    latency_ms = fields.Float(allow_none=True)


class WebhookDeliverySchema(Schema):
    id = fields.Integer()
    event_type = fields.String()
    message_id = fields.String(metadata={"description": "The webhook-id header"})
    url = fields.String()
    status = fields.String(
        metadata={"enum": ["pending", "sending", "in_flight", "delivered", "failed", "disabled"]}
    )
    attempts = fields.Integer()
    next_attempt_at = fields.DateTime()
    delivered_at = fields.DateTime(allow_none=True)
    log = fields.List(fields.Nested(WebhookAttemptSchema))


class WebhookDeliveryListSchema(Schema):
    items = fields.List(fields.Nested(WebhookDeliverySchema))


class DisabledWebhookUrlSchema(Schema):
    url = fields.String()
    reason = fields.String(
        metadata={
            "enum": ["gone", "failing"],
            "description": "`gone`: it answered 410 Gone; `failing`: every delivery to it failed "
            "for WEBHOOK_DISABLE_AFTER_SECONDS (a redeliver to it enables it again)",
        }
    )
    disabled_at = fields.DateTime()


class DisabledWebhookUrlListSchema(Schema):
    items = fields.List(fields.Nested(DisabledWebhookUrlSchema))


class WebhookUrlArgsSchema(Schema):
    url = fields.String(required=True, metadata={"description": "The webhook URL, exactly"})


class UsageArgsSchema(Schema):
    start = instant(data_key="from", metadata={"description": "Default: `to` less 24 hours"})
    end = instant(data_key="to", metadata={"description": "Default: now"})


class ModelUsageSchema(Schema):
    model = fields.String()
    jobs = fields.Integer(metadata={"description": "Jobs created in the period (with chunks)"})
    batch_chunks = fields.Integer(metadata={"description": "Of which chunks of batches"})
    succeeded = fields.Integer()
    failed = fields.Integer(metadata={"description": "Failed or expired"})
    cancelled = fields.Integer()
    unfinished = fields.Integer(metadata={"description": "Still queued or running"})
    rows = fields.Integer(metadata={"description": "Rows along the model's batch axis"})
    queued_seconds = fields.Float(metadata={"description": "Sum of time from submit to start"})
    running_seconds = fields.Float(metadata={"description": "Sum of time from start to finish"})
    compute_seconds = fields.Float(
        metadata={"description": "Sum of each job's share of its micro-batch's ONNX Runtime time"}
    )
    prompt_tokens = fields.Integer(metadata={"description": "A generative model's prompt tokens"})
    completion_tokens = fields.Integer(metadata={"description": "Tokens it generated"})
    total_tokens = fields.Integer()


class UsageTotalSchema(Schema):
    jobs = fields.Integer()
    rows = fields.Integer()
    queued_seconds = fields.Float()
    running_seconds = fields.Float()
    compute_seconds = fields.Float()
    prompt_tokens = fields.Integer()
    completion_tokens = fields.Integer()
    total_tokens = fields.Integer()


class TokenWindowSchema(Schema):
    limit = fields.Integer(
        allow_none=True,
        metadata={"description": "Tokens a minute your generations may take (null: no limit)"},
    )
    used = fields.Integer(metadata={"description": "Tokens they took in the last 60 seconds"})
    retry_after = fields.Integer(
        metadata={"description": "Seconds until a generation may be submitted (0: now)"}
    )


class UsageReportSchema(Schema):
    tenant = fields.String()
    start = fields.DateTime(data_key="from")
    end = fields.DateTime(data_key="to")
    models = fields.List(fields.Nested(ModelUsageSchema))
    total = fields.Nested(UsageTotalSchema)
    tokens_per_minute = fields.Nested(TokenWindowSchema)
