"""The delivery log a tenant reads (each delivery with its attempts), and what a
tenant may do with it: send a delivery again, see and enable its disabled URLs.
Nothing here commits: the webhook operations own the transaction."""

from __future__ import annotations

import uuid

from sqlalchemy import select, text
from sqlalchemy.orm import Session

from app.webhooks.delivery import RECOVERED
from app.webhooks.tables import DisabledWebhookUrl, WebhookAttempt, WebhookDelivery

_REDELIVERABLE = "('delivered', 'failed', 'pending', 'disabled')"
# Asking to send again is the tenant's word that the receiver is back: a URL
# disabled for failing is enabled, its failing streak forgotten. A 410's stays.
_ENABLE_FAILING = text(
    f"""
    WITH enabled AS (
        DELETE FROM disabled_webhook_urls u USING webhook_deliveries d
        WHERE d.id = ANY(:ids) AND d.status IN {_REDELIVERABLE} AND u.reason = 'failing'
          AND u.tenant_id = d.tenant_id AND u.url = d.url
        RETURNING u.tenant_id, u.url
    )
    DELETE FROM failing_webhook_urls f USING enabled e
    WHERE f.tenant_id = e.tenant_id AND f.url = e.url
    """
)
_REDELIVER = text(
    f"""
    UPDATE webhook_deliveries d SET status = 'pending', attempts = 0,
           next_attempt_at = now(), lease_expires_at = NULL
    WHERE d.id = ANY(:ids) AND d.status IN {_REDELIVERABLE}
      AND NOT EXISTS (SELECT 1 FROM disabled_webhook_urls u
                      WHERE u.tenant_id = d.tenant_id AND u.url = d.url)
    RETURNING d.id
    """
)


def redeliver(session: Session, ids: list[int]) -> list[int]:
    """Send deliveries again from the start of the schedule (same webhook-id),
    enabling URLs disabled for failing; not those being sent now, nor to a URL that
    answered 410 Gone (until its tenant enables it: `enable`)."""
    session.execute(_ENABLE_FAILING, {"ids": ids})
    return [r.id for r in session.execute(_REDELIVER, {"ids": ids})]


def disabled_urls(session: Session, tenant_id: int) -> list[DisabledWebhookUrl]:
    """A tenant's disabled URLs, newest first."""
    query = select(DisabledWebhookUrl).where(DisabledWebhookUrl.tenant_id == tenant_id)
    return list(session.scalars(query.order_by(DisabledWebhookUrl.disabled_at.desc())))


def enable(session: Session, tenant_id: int, url: str) -> bool:
    """Enable a tenant's disabled URL (whatever the reason); whether it was disabled.
    Its disabled deliveries stay as they are: redeliver those wanted."""
    values = {"tenant": tenant_id, "url": url}
    gone = session.execute(
        text("DELETE FROM disabled_webhook_urls WHERE tenant_id = :tenant AND url = :url "
             "RETURNING url"), values,
    ).first()  # fmt: skip
    session.execute(RECOVERED, values)
    return gone is not None


Logged = tuple[WebhookDelivery, list[WebhookAttempt]]


def log_of(session: Session, job_id: uuid.UUID, delivery_id: int | None = None) -> list[Logged]:
    """A job's deliveries (or one of them), each with its attempts, in two queries."""
    query = select(WebhookDelivery).where(WebhookDelivery.job_id == job_id)
    if delivery_id is not None:
        query = query.where(WebhookDelivery.id == delivery_id)
    deliveries = list(session.scalars(query.order_by(WebhookDelivery.id)))
    attempts = session.scalars(
        select(WebhookAttempt)
        .where(WebhookAttempt.delivery_id.in_([d.id for d in deliveries]))
        .order_by(WebhookAttempt.id)
    ).all()
    return [(d, [a for a in attempts if a.delivery_id == d.id]) for d in deliveries]
