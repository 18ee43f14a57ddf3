"""Delivering webhook events: one HTTP attempt per task, the schedule in PostgreSQL.

A delivery row is made by the job_events trigger when a subscribed event
happens. The sweep (beat, every second) marks due rows `sending` under a lease
and publishes them to the webhooks queue; a task takes one (`sending` ->
`in_flight`, so a duplicate message does nothing), makes one attempt and writes
the outcome: `delivered`, `pending` again at its next scheduled time, `failed`
(schedule used up, or an unsafe URL: a dead letter) or `disabled` (410 Gone).
A worker killed mid-delivery leaves a lease that runs out; the sweep sends the
delivery again, with the same webhook-id.
"""

from __future__ import annotations

import json
import logging
import random
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import requests
from sqlalchemy import text
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from app.config import Settings
from app.db.models import (
    Batch,
    DeadLetter,
    DisabledWebhookUrl,
    Job,
    Tenant,
    WebhookAttempt,
    WebhookDelivery,
)
from app.jobs.representation import JobSchema
from app.webhooks import signing
from app.webhooks.ssrf import UnsafeUrl, check_url

logger = logging.getLogger(__name__)

DELIVER_TASK = "webhooks.deliver"
SWEEP_TASK = "webhooks.sweep"


def lease_seconds(settings: Settings) -> float:
    """Longer than any attempt can take (the HTTP timeout), with room to record it."""
    return settings.webhook_timeout_seconds * 2 + 5


def take_due(session: Session, settings: Settings, limit: int = 200) -> list[int]:
    """Due deliveries, and those whose worker died mid-send, marked `sending`."""
    statement = text(
        """
        UPDATE webhook_deliveries SET status = 'sending',
               lease_expires_at = now() + make_interval(secs => :lease)
        WHERE id IN (
            SELECT id FROM webhook_deliveries
            WHERE (status = 'pending' AND next_attempt_at <= now())
               OR (status IN ('sending', 'in_flight') AND lease_expires_at < now())
            ORDER BY next_attempt_at LIMIT :limit FOR UPDATE SKIP LOCKED
        )
        RETURNING id
        """
    )
    ids = [
        r.id for r in session.execute(statement, {"lease": lease_seconds(settings), "limit": limit})
    ]
    session.commit()
    return ids


def _take(session: Session, delivery_id: int) -> WebhookDelivery | None:
    taken = session.execute(
        text("UPDATE webhook_deliveries SET status = 'in_flight' "
             "WHERE id = :id AND status = 'sending' RETURNING id"),
        {"id": delivery_id},
    ).scalar()  # fmt: skip
    session.commit()
    return session.get(WebhookDelivery, delivery_id) if taken else None


def deliver(session: Session, settings: Settings, delivery_id: int) -> str | None:
    """One attempt of one delivery; returns its status afterwards (None: not ours)."""
    delivery = _take(session, delivery_id)
    if delivery is None:
        return None
    now = datetime.now(UTC)
    if session.get(DisabledWebhookUrl, (delivery.tenant_id, delivery.url)) is not None:
        delivery.status, delivery.lease_expires_at = "disabled", None
        note = "not sent: this URL answered 410 Gone before"
        session.add(WebhookAttempt(delivery_id=delivery.id, url=delivery.url, error=note))
        session.commit()
        return delivery.status
    if delivery.payload is None:
        delivery.payload = _payload(session, settings, delivery, now)
    code, error, retry_after, latency_ms = _post(session, settings, delivery)
    delivery.attempts += 1
    delivery.lease_expires_at = None
    session.add(WebhookAttempt(delivery_id=delivery.id, url=delivery.url, status_code=code,
                               error=error, latency_ms=latency_ms))  # fmt: skip
    schedule = settings.webhook_retry_schedule
    if code is not None and 200 <= code < 300:
        delivery.status, delivery.delivered_at = "delivered", now
    elif code == 410:
        delivery.status = "disabled"
        session.execute(insert(DisabledWebhookUrl).values(tenant_id=delivery.tenant_id,
                               url=delivery.url).on_conflict_do_nothing())  # fmt: skip
    elif (error or "").startswith("unsafe URL") or delivery.attempts >= len(schedule):
        delivery.status = "failed"
        _dead_letter(session, delivery, error or f"HTTP {code}")
    else:
        delay = schedule[delivery.attempts] * random.uniform(0.9, 1.1)
        delivery.status = "pending"
        delivery.next_attempt_at = now + timedelta(seconds=max(delay, retry_after or 0))
    session.commit()
    logger.info("webhook %s to %s: %s (%s)", delivery.message_id, delivery.url,
                delivery.status, code or error)  # fmt: skip
    return delivery.status


def _post(
    session: Session, settings: Settings, delivery: WebhookDelivery
) -> tuple[int | None, str | None, float | None, float | None]:
    """(status code, error, Retry-After seconds, latency ms) of one POST."""
    try:
        check_url(delivery.url, allow_private=settings.webhook_allow_private_networks)
    except UnsafeUrl as exc:
        return None, f"unsafe URL: {exc}", None, None
    tenant = session.get(Tenant, delivery.tenant_id)
    assert tenant is not None and delivery.payload is not None
    headers = signing.headers(tenant, delivery.message_id, delivery.payload)
    started = time.perf_counter()
    try:
        response = requests.post(
            delivery.url, data=delivery.payload.encode(), headers=headers,
            timeout=settings.webhook_timeout_seconds, allow_redirects=False,
        )  # fmt: skip
    except requests.RequestException as exc:
        return None, f"{type(exc).__name__}: {exc}", None, _ms(started)
    code = response.status_code
    error = None if 200 <= code < 300 else f"HTTP {code}"
    if 300 <= code < 400:
        location = response.headers.get("Location")
        error = f"HTTP {code} redirect to {location!r} (redirects are not followed)"
    retry_after = None
    if code in (429, 503):
        header = response.headers.get("Retry-After", "")
        retry_after = float(header) if header.strip().isdigit() else None
    return code, error, retry_after, _ms(started)


def _ms(started: float) -> float:
    return round((time.perf_counter() - started) * 1000, 1)


def _payload(session: Session, settings: Settings, delivery: WebhookDelivery, now: datetime) -> str:
    """The event as sent on every attempt: the job as GET /jobs/<id> shows it. Outputs
    that would make it larger than WEBHOOK_MAX_PAYLOAD_BYTES are replaced by a link."""
    if delivery.batch_id is not None:  # a batch's event: the batch as GET /batches/<id> shows it
        from app.batches.representation import BatchSchema, describe

        batch = session.get(Batch, delivery.batch_id)
        assert batch is not None
        body = {"type": delivery.event_type, "timestamp": now.isoformat(),
                "data": BatchSchema().dump(describe(session, batch))}  # fmt: skip
        return json.dumps(body)
    job = session.get(Job, delivery.job_id)
    data: dict[str, Any] = JobSchema().dump(job)
    body = {"type": delivery.event_type, "timestamp": now.isoformat(), "data": data}
    encoded = json.dumps(body)
    if len(encoded) > settings.webhook_max_payload_bytes:
        data["outputs"] = None
        data["outputs_url"] = f"/jobs/{delivery.job_id}"
        encoded = json.dumps(body)
    return encoded


def _dead_letter(session: Session, delivery: WebhookDelivery, error: str) -> None:
    subject: Batch | Job | None = (
        session.get(Batch, delivery.batch_id) if delivery.batch_id else None
    ) or session.get(Job, delivery.job_id)
    assert subject is not None
    session.add(
        DeadLetter(
            job_id=delivery.job_id, batch_id=delivery.batch_id, tenant_id=subject.tenant_id,
            model=subject.model, model_version=subject.model_version,
            error_code="webhook_undeliverable",
            error_class="WebhookDelivery",
            message=f"{delivery.event_type} to {delivery.url}: {error}",
            attempts=delivery.attempts, first_failed_at=delivery.created_at,
            last_failed_at=datetime.now(UTC), delivery_id=delivery.id,
        )
    )  # fmt: skip


def redeliver(session: Session, ids: list[int]) -> list[int]:
    """Send deliveries again from the start of the schedule (same webhook-id)."""
    statement = text(
        """
        UPDATE webhook_deliveries d SET status = 'pending', attempts = 0,
               next_attempt_at = now(), lease_expires_at = NULL
        WHERE d.id = ANY(:ids) AND d.status IN ('delivered', 'failed', 'pending')
          AND NOT EXISTS (SELECT 1 FROM disabled_webhook_urls u
                          WHERE u.tenant_id = d.tenant_id AND u.url = d.url)
        RETURNING d.id
        """
    )
    return [r.id for r in session.execute(statement, {"ids": ids})]
