"""/usage: what the tenant's jobs cost over a period."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from app.web.auth import authenticated, current_tenant
from app.web.blueprint import Blueprint
from app.web.context import services
from app.web.record_schemas import UsageArgsSchema, UsageReportSchema

blp = Blueprint("usage", __name__, url_prefix="/usage", description="What your jobs cost")


@blp.get("")
@authenticated
@blp.arguments(UsageArgsSchema(), location="query")
@blp.response(200, UsageReportSchema)
def get_usage(args: dict[str, Any]) -> dict[str, Any]:
    """Per model: jobs, rows, time queued, time running, ONNX Runtime time (each
    job's share of its micro-batch) and, for generative models, prompt and
    completion tokens, of your jobs created in [from, to). Default:
    the last 24 hours; at most 31 days. `tokens_per_minute`: your token budget
    now (the tokens of the last minute, and when a generation may be submitted
    again if it is spent)."""
    end = args.get("end") or datetime.now(UTC)
    start = args.get("start") or end - timedelta(days=1)
    models = services().webhooks.usage_report(current_tenant(), start, end)
    total = {
        name: sum(getattr(m, name) for m in models)
        for name in (
            "jobs",
            "rows",
            "queued_seconds",
            "running_seconds",
            "compute_seconds",
            "prompt_tokens",
            "completion_tokens",
            "total_tokens",
        )
    }
    tokens = services().tenants.tokens_per_minute(current_tenant())
    return {"tenant": current_tenant().name, "start": start, "end": end, "models": models,
            "total": total, "tokens_per_minute": tokens}  # fmt: skip
