"""/jobs/<id>/deliveries: the webhook delivery log of a job, and redelivery."""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import select

from app.jobs import service
from app.platform.tables import WebhookAttempt, WebhookDelivery
from app.web.auth import authenticated, current_tenant
from app.web.blueprint import Blueprint
from app.web.context import current_session
from app.web.problems import Problem
from app.web.schemas import WebhookDeliveryListSchema, WebhookDeliverySchema
from app.webhooks.delivery import redeliver

blp = Blueprint("deliveries", __name__, url_prefix="/jobs", description="Webhook deliveries")


def _with_logs(deliveries: list[WebhookDelivery]) -> list[dict[str, Any]]:
    """Each delivery with its attempts, read in one query."""
    attempts = (
        current_session()
        .scalars(
            select(WebhookAttempt)
            .where(WebhookAttempt.delivery_id.in_([d.id for d in deliveries]))
            .order_by(WebhookAttempt.id)
        )
        .all()
    )
    fields = [name for name in WebhookDeliverySchema().fields if name != "log"]
    return [
        {**{name: getattr(d, name) for name in fields},
         "log": [a for a in attempts if a.delivery_id == d.id]}
        for d in deliveries
    ]  # fmt: skip


@blp.get("/<uuid:job_id>/deliveries")
@blp.response(200, WebhookDeliveryListSchema)
@blp.alt_response(404, response="NOT_FOUND")
@authenticated
def list_deliveries(job_id: uuid.UUID) -> dict[str, Any]:
    session = current_session()
    service.get(session, current_tenant().id, job_id)
    deliveries = session.scalars(
        select(WebhookDelivery).where(WebhookDelivery.job_id == job_id).order_by(WebhookDelivery.id)
    ).all()
    return {"items": _with_logs(list(deliveries))}


@blp.post("/<uuid:job_id>/deliveries/<int:delivery_id>/redeliver")
@blp.response(202, WebhookDeliverySchema, description="Queued to be sent again (same webhook-id)")
@blp.alt_response(404, response="NOT_FOUND")
@blp.alt_response(409, response="CONFLICT", description="Being sent now, or the URL answered 410")
@authenticated
def redeliver_one(job_id: uuid.UUID, delivery_id: int) -> dict[str, Any]:
    session = current_session()
    service.get(session, current_tenant().id, job_id)
    delivery = session.get(WebhookDelivery, delivery_id)
    if delivery is None or delivery.job_id != job_id:
        raise Problem("not-found", f"job {job_id} has no delivery {delivery_id}")
    if not redeliver(session, [delivery_id]):
        session.rollback()
        raise Problem("conflict", f"delivery {delivery_id} is being sent now, or its URL "
                      "answered 410 Gone and is disabled for your tenant")  # fmt: skip
    session.commit()
    session.refresh(delivery)
    return _with_logs([delivery])[0]
