"""Delivering webhook events: one HTTP attempt per task, the schedule in PostgreSQL.

A delivery row is made by the job_events trigger when a subscribed event
happens. The sweep (beat, every second) marks due rows `sending` under a lease
and publishes them to the webhooks queue; a task takes one (`sending` ->
`in_flight`, so a duplicate message does nothing), makes one attempt and writes
the outcome: `delivered`, `pending` again at its next scheduled time, `failed`
(schedule used up, or an unsafe URL: a dead letter) or `disabled`: its URL answered
410 Gone, or every delivery to it failed for WEBHOOK_DISABLE_AFTER_SECONDS (as
Stripe and Svix disable an endpoint); then the URL's pending deliveries stop too.
A worker killed mid-delivery leaves a lease that runs out; the sweep sends the
delivery again, with the same webhook-id. Every time here is PostgreSQL's
`now()`, never the sender's clock: a sender whose clock is off neither parks a
retry nor signs a timestamp a receiver refuses.
"""

from __future__ import annotations

import logging
import random
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

from sqlalchemy import func, select, text
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from app.batches.tables import Batch
from app.jobs.tables import DeadLetter, Job
from app.observability import logs, metrics
from app.platform.settings import Settings
from app.tenancy.tables import Tenant
from app.webhooks import retry_after, signing, transport
from app.webhooks.ssrf import Resolver, UnsafeUrl, check_url, networks
from app.webhooks.tables import DisabledWebhookUrl, WebhookAttempt, WebhookDelivery

logger = logging.getLogger(__name__)

DELIVER_TASK = "webhooks.deliver"
SWEEP_TASK = "webhooks.sweep"


def lease_seconds(settings: Settings) -> float:
    """Longer than any attempt can take (the whole-attempt HTTP budget), with room to
    record it. It starts again when a sender takes the delivery, so time spent in the
    queue does not eat into it."""
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


_TAKE = text(
    """
    UPDATE webhook_deliveries SET status = 'in_flight',
           lease_expires_at = now() + make_interval(secs => :lease)
    WHERE id = :id AND status = 'sending'
    RETURNING attempts, lease_expires_at, now() AS now
    """
)
# Every write after the take names the take it finishes: a sender whose lease ran
# out (and whose delivery another sender took) changes nothing.
_GUARD = "id = :id AND status = 'in_flight' AND attempts = :attempts AND lease_expires_at = :lease"
_FINISH = text(
    f"""
    UPDATE webhook_deliveries SET status = :status, attempts = attempts + :counted,
           lease_expires_at = NULL,
           next_attempt_at = coalesce(now() + make_interval(secs => CAST(:delay AS float8)),
                                      next_attempt_at),
           delivered_at = CASE WHEN CAST(:delivered AS boolean) THEN now() ELSE delivered_at END
    WHERE {_GUARD} RETURNING id
    """
)
_SET_PAYLOAD = text(f"UPDATE webhook_deliveries SET payload = :payload WHERE {_GUARD} RETURNING id")


@dataclass(frozen=True)
class _Taken:
    """What one sender read before its POST, and the take it must name to write."""

    id: int
    attempts: int
    lease: datetime


# The event a delivery sends, as JSON: made by the layer that knows jobs and batches
# (app.dataplane.payloads), so this package imports neither.
Render = Callable[[Session, Settings, WebhookDelivery, datetime], str]


def deliver(
    session: Session,
    settings: Settings,
    delivery_id: int,
    render: Render,
    *,
    resolver: Resolver | None = None,
) -> str | None:
    """One attempt of one delivery; returns its status afterwards (None: not ours).

    The payload is rendered once, at the first attempt, and kept. The lease starts
    at the take, and no transaction is open during the POST."""
    row = session.execute(
        _TAKE, {"id": delivery_id, "lease": lease_seconds(settings)}
    ).one_or_none()
    session.commit()
    if row is None:
        return None
    taken = _Taken(delivery_id, row.attempts, row.lease_expires_at)
    delivery = session.get(WebhookDelivery, delivery_id, populate_existing=True)
    assert delivery is not None
    logs.bind(job_id=delivery.job_id)
    now = row.now  # the database's time of the take: the event's and the signature's
    disabled = session.get(DisabledWebhookUrl, (delivery.tenant_id, delivery.url))
    if disabled is not None:
        note = NOT_SENT[disabled.reason]
        return _finish(session, taken, delivery, "disabled", counted=0, error=note)
    payload = delivery.payload
    if payload is None:
        payload = render(session, settings, delivery, now)
        if session.execute(_SET_PAYLOAD, {**_guard(taken), "payload": payload}).first() is None:
            session.rollback()
            return None
    tenant = session.get(Tenant, delivery.tenant_id)
    assert tenant is not None
    headers = signing.headers(tenant, delivery.message_id, payload, now)
    session.commit()  # nothing held while the receiver takes its time
    try:
        answer = _post(settings, delivery.url, payload, headers, resolver)
    except Exception:  # a bug here must still end as a recorded attempt, not a resend loop
        logger.exception("webhook %s: attempt failed", delivery.message_id)
        answer = transport.Answer(None, "delivery error", None, 0.0)
    code, error = answer.status_code, answer.error
    schedule = settings.webhook_retry_schedule
    attempts = taken.attempts + 1
    delay: float | None = None
    if code is not None and 200 <= code < 300:
        status = "delivered"
    elif code == 410:
        status = "disabled"
    elif (error or "").startswith("unsafe URL") or attempts >= len(schedule):
        status = "failed"
    else:
        answered = now + timedelta(milliseconds=answer.latency_ms)  # an HTTP date's "now"
        waited = (
            retry_after.seconds(answer.retry_after, max(schedule), answered)
            if code in (429, 503)
            else None
        )
        status = "pending"
        delay = max(schedule[attempts] * random.uniform(0.9, 1.1), waited or 0)
    return _finish(session, taken, delivery, status, counted=1, error=error, code=code,
                   latency_ms=answer.latency_ms, delay=delay,
                   disable_after=settings.webhook_disable_after_seconds)  # fmt: skip


def _guard(taken: _Taken) -> dict[str, Any]:
    return {"id": taken.id, "attempts": taken.attempts, "lease": taken.lease}


def _finish(
    session: Session, taken: _Taken, delivery: WebhookDelivery, status: str, *, counted: int,
    error: str | None, code: int | None = None, latency_ms: float | None = None,
    delay: float | None = None, disable_after: float = 0,
) -> str | None:  # fmt: skip
    """Write the attempt's outcome, if this sender still holds the delivery; the next
    attempt is due `delay` seconds from now (the database's clock). A failed attempt
    that ends its URL's `disable_after` seconds of failing disables the URL."""
    failing = status in ("pending", "failed") and counted
    if failing and (failed_for := _failing_for(session, delivery)) >= disable_after > 0:
        status, delay = "disabled", None
        error = f"{error or f'HTTP {code}'}; URL disabled: failing for {failed_for:.0f} s"
    values = {**_guard(taken), "status": status, "counted": counted, "delay": delay,
              "delivered": status == "delivered"}  # fmt: skip
    if session.execute(_FINISH, values).first() is None:
        session.rollback()
        logger.warning("webhook %s: lease lost, outcome not written", delivery.message_id)
        return None
    session.add(WebhookAttempt(delivery_id=delivery.id, url=delivery.url, status_code=code,
                               error=error, latency_ms=latency_ms))  # fmt: skip
    if status == "delivered":
        session.execute(_RECOVERED, {"tenant": delivery.tenant_id, "url": delivery.url})
    elif status == "disabled" and counted:
        _disable(session, delivery, "gone" if code == 410 else "failing")
    if status == "failed":
        _dead_letter(session, delivery, taken.attempts + counted, error or f"HTTP {code}")
    session.commit()
    if counted:
        _count_attempt(status, code, error)
    logger.info("webhook %s to %s: %s (%s)", delivery.message_id, _origin(delivery.url), status,
                code or error)  # fmt: skip
    return status


# Why a delivery to a disabled URL was not sent, by the URL's reason.
NOT_SENT = {
    "gone": "not sent: this URL answered 410 Gone before",
    "failing": "not sent: this URL was disabled after failing for WEBHOOK_DISABLE_AFTER_SECONDS",
}
_FAILED = text(
    """
    INSERT INTO failing_webhook_urls (tenant_id, url) VALUES (:tenant, :url)
    ON CONFLICT (tenant_id, url) DO UPDATE SET failing_since = failing_webhook_urls.failing_since
    RETURNING extract(epoch FROM now() - failing_since) AS failing_for
    """
)
_RECOVERED = text("DELETE FROM failing_webhook_urls WHERE tenant_id = :tenant AND url = :url")
_STOP_PENDING = text(
    """
    WITH stopped AS (
        UPDATE webhook_deliveries SET status = 'disabled', lease_expires_at = NULL
        WHERE tenant_id = :tenant AND url = :url AND status = 'pending'
        RETURNING id, url
    )
    INSERT INTO webhook_attempts (delivery_id, url, error)
    SELECT id, url, :note FROM stopped
    """
)


def _failing_for(session: Session, delivery: WebhookDelivery) -> float:
    """Record a failure to the delivery's URL: seconds since the first failure after
    its last success (0 for this one, when it is the first)."""
    values = {"tenant": delivery.tenant_id, "url": delivery.url}
    return float(session.execute(_FAILED, values).scalar_one())


def _disable(session: Session, delivery: WebhookDelivery, reason: str) -> None:
    """Disable the delivery's URL for its tenant; its pending deliveries stop, each
    with a line in its log saying why (they stay redeliverable)."""
    session.execute(
        insert(DisabledWebhookUrl)
        .values(tenant_id=delivery.tenant_id, url=delivery.url, reason=reason)
        .on_conflict_do_nothing()
    )
    values = {"tenant": delivery.tenant_id, "url": delivery.url, "note": NOT_SENT[reason]}
    session.execute(_STOP_PENDING, values)


def _count_attempt(status: str, code: int | None, error: str | None) -> None:
    """Attempts by the delivery's state after them; those that did not deliver by why."""
    metrics.WEBHOOK_ATTEMPTS.labels("retry" if status == "pending" else status).inc()
    if status == "delivered":
        return
    if code is not None:
        reason = "redirect" if 300 <= code < 400 else f"http_{code // 100}xx"
    else:
        reason = "unsafe_url" if (error or "").startswith("unsafe URL") else "network"
    metrics.WEBHOOK_FAILURES.labels(reason).inc()


def _post(
    settings: Settings, url: str, payload: str, headers: dict[str, str], resolver: Resolver | None
) -> transport.Answer:
    """Check the URL (resolving it once), then POST to the address that was checked."""
    try:
        target = check_url(
            url, allow_private=settings.webhook_allow_private_networks,
            allowed=networks(settings.webhook_allowed_networks), resolver=resolver,
            resolve=not settings.webhook_proxy_url,
        )  # fmt: skip
    except UnsafeUrl as exc:
        return transport.Answer(None, f"unsafe URL: {exc}", None, 0.0)
    answer = transport.post(target, payload.encode(), headers, settings.webhook_timeout_seconds,
                            settings.webhook_proxy_url)  # fmt: skip
    if answer.status_code is not None and not 200 <= answer.status_code < 300:
        code = answer.status_code
        error = "redirect not followed" if 300 <= code < 400 else f"HTTP {code}"
        return transport.Answer(code, error, answer.retry_after, answer.latency_ms)
    return answer


def _dead_letter(session: Session, delivery: WebhookDelivery, attempts: int, error: str) -> None:
    subject: Batch | Job | None = (
        session.get(Batch, delivery.batch_id) if delivery.batch_id else None
    ) or session.get(Job, delivery.job_id)
    assert subject is not None
    metrics.DEAD_LETTERS.labels(subject.model, "webhook").inc()
    session.add(
        DeadLetter(
            job_id=delivery.job_id, batch_id=delivery.batch_id, tenant_id=subject.tenant_id,
            model=subject.model, model_version=subject.model_version,
            error_code="webhook_undeliverable",
            error_class="WebhookDelivery",
            message=f"{delivery.event_type} to {delivery.url}: {error}",
            attempts=attempts, first_failed_at=delivery.created_at,
            last_failed_at=func.now(), delivery_id=delivery.id,
        )
    )  # fmt: skip


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
    session.execute(_RECOVERED, values)
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


def _origin(url: str) -> str:
    """What a log may say of a webhook URL: scheme, host and port. Its path and
    query often carry a token (Slack-style hooks), and logs travel further."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.hostname}{f':{parts.port}' if parts.port else ''}/..."
