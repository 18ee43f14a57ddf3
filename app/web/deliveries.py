"""/jobs/<id>/deliveries: the webhook delivery log of a job, and redelivery;
/webhook-urls/disabled: the tenant's disabled webhook URLs, and enabling one."""

from __future__ import annotations

import uuid
from typing import Any

from app.operations.webhooks import Logged
from app.web.auth import authenticated, current_tenant
from app.web.blueprint import Blueprint, link
from app.web.context import services
from app.web.record_schemas import (
    DisabledWebhookUrlListSchema,
    WebhookDeliveryListSchema,
    WebhookDeliverySchema,
    WebhookUrlArgsSchema,
)

blp = Blueprint("deliveries", __name__, url_prefix="/jobs", description="Webhook deliveries")
urls_blp = Blueprint(
    "webhook_urls", __name__, url_prefix="/webhook-urls",
    description="Webhook URLs nothing is sent to: one that answered 410 Gone, or whose "
    "deliveries all failed for WEBHOOK_DISABLE_AFTER_SECONDS",
)  # fmt: skip


def _with_logs(logged: Logged) -> dict[str, Any]:
    """A delivery with its attempts, as the schema shows it."""
    row, attempts = logged
    fields = [name for name in WebhookDeliverySchema().fields if name != "log"]
    return {**{name: getattr(row, name) for name in fields}, "log": attempts}


@blp.get("/<uuid:job_id>/deliveries")
@blp.response(200, WebhookDeliveryListSchema, links={
    "Redeliver": link("post", "/jobs/{job_id}/deliveries/{delivery_id}/redeliver",
                      job_id="$request.path.job_id", delivery_id="$response.body#/items/0/id"),
})  # fmt: skip
@blp.alt_response(404, response="NOT_FOUND")
@authenticated
def list_deliveries(job_id: uuid.UUID) -> dict[str, Any]:
    return {
        "items": [
            _with_logs(logged)
            for logged in services().webhooks.deliveries(current_tenant(), job_id)
        ]
    }


@blp.post("/<uuid:job_id>/deliveries/<int:delivery_id>/redeliver")
@blp.response(202, WebhookDeliverySchema, description="Queued to be sent again (same webhook-id)")
@blp.alt_response(404, response="NOT_FOUND")
@blp.alt_response(409, response="CONFLICT", description="Being sent now, or the URL answered 410")
@authenticated
def redeliver_one(job_id: uuid.UUID, delivery_id: int) -> dict[str, Any]:
    """Send the delivery again from the start of its schedule, same webhook-id and
    body. A URL disabled for failing is enabled again by this (the receiver is taken
    to be back); one that answered 410 Gone is not: enable it first."""
    return _with_logs(services().webhooks.redeliver(current_tenant(), job_id, delivery_id))


@urls_blp.get("/disabled")
@urls_blp.response(200, DisabledWebhookUrlListSchema)
@authenticated
def list_disabled() -> dict[str, Any]:
    return {"items": services().webhooks.disabled_urls(current_tenant())}


@urls_blp.delete("/disabled")
@authenticated
@urls_blp.arguments(WebhookUrlArgsSchema(), location="query")
@urls_blp.response(204, description="Enabled: new deliveries are sent to it")
@urls_blp.alt_response(404, response="NOT_FOUND", description="Not disabled for your tenant")
def enable_url(args: dict[str, Any]) -> None:
    """Enable a disabled URL, whatever the reason (the only way for one that answered
    410 Gone). Its disabled deliveries stay so: redeliver those still wanted."""
    services().webhooks.enable_url(current_tenant(), args["url"])
