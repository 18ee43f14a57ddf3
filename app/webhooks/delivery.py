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
delivery again, with the same webhook-id. The steps (`take_due`; `prepare`,
`send`, `judge`, `record` for one attempt) write nothing they do not own and never
commit: the webhook operations run each database step as a unit of work, and no
transaction is open while the receiver takes its time. Every time here is
PostgreSQL's `now()`, never the sender's clock: a sender whose clock is off neither parks a
retry nor signs a timestamp a receiver refuses.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

from sqlalchemy import func, text
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from app.batches.tables import Batch
from app.jobs.tables import DeadLetter, Job
from app.observability import logs, metrics
from app.platform.settings import Settings
from app.tenancy.tables import Tenant
from app.webhooks import payloads, retry_after, signing, transport
from app.webhooks.ssrf import Network, Resolver, UnsafeUrl, check_url, networks
from app.webhooks.tables import DisabledWebhookUrl, WebhookAttempt, WebhookDelivery

logger = logging.getLogger(__name__)

DELIVER_TASK = "webhooks.deliver"
SWEEP_TASK = "webhooks.sweep"


@dataclass(frozen=True)
class DeliverySettings:
    """What sending webhooks needs of the settings (WEBHOOK_*)."""

    timeout_s: float
    schedule: tuple[float, ...]  # the delay before each attempt after the first
    disable_after_s: float
    allow_private: bool
    allowed: tuple[Network, ...]
    proxy_url: str
    max_payload_bytes: int

    @classmethod
    def of(cls, settings: Settings) -> DeliverySettings:
        return cls(
            settings.webhook_timeout_seconds, tuple(settings.webhook_retry_schedule),
            settings.webhook_disable_after_seconds, settings.webhook_allow_private_networks,
            tuple(networks(settings.webhook_allowed_networks)), settings.webhook_proxy_url,
            settings.webhook_max_payload_bytes,
        )  # fmt: skip

    @property
    def lease_s(self) -> float:
        """Longer than any attempt can take (the whole-attempt HTTP budget), with room to
        record it. It starts again when a sender takes the delivery, so time spent in
        the queue does not eat into it."""
        return self.timeout_s * 2 + 5


_TAKE_DUE = text(
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


def take_due(session: Session, lease_s: float, limit: int = 200) -> list[int]:
    """Due deliveries, and those whose worker died mid-send, marked `sending`."""
    return [r.id for r in session.execute(_TAKE_DUE, {"lease": lease_s, "limit": limit})]


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


class LeaseLost(Exception):
    """Another sender took the delivery (this one's lease ran out): nothing this
    sender wrote in its unit of work may stay."""


@dataclass(frozen=True)
class Ready:
    """One attempt, taken and prepared: the take its writes must name, the delivery,
    and what to send (or, for a disabled URL, why nothing is sent)."""

    id: int
    attempts: int
    lease: datetime
    now: datetime  # the database's time of the take: the event's and the signature's
    delivery: WebhookDelivery
    payload: str = ""
    headers: dict[str, str] | None = None
    not_sent: str | None = None
    traceparent: str | None = None  # its job's trace (app.observability.tracing)

    @property
    def guard(self) -> dict[str, Any]:
        return {"id": self.id, "attempts": self.attempts, "lease": self.lease}


def prepare(session: Session, delivery_id: int, settings: DeliverySettings) -> Ready | None:
    """Take a delivery the sweep marked `sending` (`sending` -> `in_flight`, so a
    duplicate message does nothing; None then) and make its request: the payload,
    rendered at the first attempt and kept, and its signature."""
    row = session.execute(_TAKE, {"id": delivery_id, "lease": settings.lease_s}).one_or_none()
    if row is None:
        return None
    delivery = session.get(WebhookDelivery, delivery_id, populate_existing=True)
    assert delivery is not None
    logs.bind(job_id=delivery.job_id)
    ready = Ready(delivery_id, row.attempts, row.lease_expires_at, row.now, delivery)
    disabled = session.get(DisabledWebhookUrl, (delivery.tenant_id, delivery.url))
    if disabled is not None:
        return replace(ready, not_sent=NOT_SENT[disabled.reason])
    payload = delivery.payload
    if payload is None:
        payload = payloads.render(session, delivery, ready.now, settings.max_payload_bytes)
        if session.execute(_SET_PAYLOAD, {**ready.guard, "payload": payload}).first() is None:
            raise LeaseLost(delivery.message_id)
    tenant = session.get(Tenant, delivery.tenant_id)
    assert tenant is not None
    headers = signing.headers(tenant, delivery.message_id, payload, ready.now)
    job = session.get(Job, delivery.job_id) if delivery.job_id is not None else None
    traceparent = job.traceparent if job is not None else None
    return replace(ready, payload=payload, headers=headers, traceparent=traceparent)


def send(settings: DeliverySettings, ready: Ready, resolver: Resolver | None) -> transport.Answer:
    """The attempt's POST: the URL checked (resolved once), then POSTed to the
    address that was checked. Any failure is an answer, never an exception: a bug
    here must still end as a recorded attempt, not a resend loop."""
    try:
        return _post(settings, ready, resolver)
    except Exception:
        logger.exception("webhook %s: attempt failed", ready.delivery.message_id)
        return transport.Answer(None, "delivery error", None, 0.0)


def _post(settings: DeliverySettings, ready: Ready, resolver: Resolver | None) -> transport.Answer:
    url, headers = ready.delivery.url, ready.headers or {}
    try:
        target = check_url(
            url, allow_private=settings.allow_private, allowed=settings.allowed,
            resolver=resolver, resolve=not settings.proxy_url,
        )  # fmt: skip
    except UnsafeUrl as exc:
        return transport.Answer(None, f"unsafe URL: {exc}", None, 0.0)
    answer = transport.post(target, ready.payload.encode(), headers, settings.timeout_s,
                            settings.proxy_url)  # fmt: skip
    if answer.status_code is not None and not 200 <= answer.status_code < 300:
        code = answer.status_code
        error = "redirect not followed" if 300 <= code < 400 else f"HTTP {code}"
        return transport.Answer(code, error, answer.retry_after, answer.latency_ms)
    return answer


@dataclass(frozen=True)
class Attempted:
    """What an attempt came to: the delivery's status after it, whether it counts as
    an attempt, and (`pending`) when the next one is due, in seconds from now."""

    status: str
    counted: int
    error: str | None
    code: int | None = None
    latency_ms: float | None = None
    delay: float | None = None


def judge(settings: DeliverySettings, ready: Ready, answer: transport.Answer) -> Attempted:
    """The delivery's status after this answer: `delivered` (2xx), `disabled` (410
    Gone), `failed` (an unsafe URL, or the schedule used up), else `pending` again
    at its next scheduled time, or later where a 429 or 503 asked so."""
    code, error, schedule = answer.status_code, answer.error, settings.schedule
    attempts = ready.attempts + 1
    delay: float | None = None
    if code is not None and 200 <= code < 300:
        status = "delivered"
    elif code == 410:
        status = "disabled"
    elif (error or "").startswith("unsafe URL") or attempts >= len(schedule):
        status = "failed"
    else:
        answered = ready.now + timedelta(milliseconds=answer.latency_ms)  # an HTTP date's "now"
        waited = (
            retry_after.seconds(answer.retry_after, max(schedule), answered)
            if code in (429, 503)
            else None
        )
        status = "pending"
        delay = max(schedule[attempts] * random.uniform(0.9, 1.1), waited or 0)
    return Attempted(status, 1, error, code, answer.latency_ms, delay)


def record(session: Session, ready: Ready, attempted: Attempted, settings: DeliverySettings) -> str:
    """Write the attempt's outcome; LeaseLost if this sender no longer holds the
    delivery. A failed attempt that ends its URL's WEBHOOK_DISABLE_AFTER_SECONDS
    of failing disables the URL. Returns the delivery's status."""
    delivery = ready.delivery
    status, error, delay, code = attempted.status, attempted.error, attempted.delay, attempted.code
    failing = status in ("pending", "failed") and attempted.counted
    disable_after = settings.disable_after_s
    if failing and (failed_for := _failing_for(session, delivery)) >= disable_after > 0:
        status, delay = "disabled", None
        error = f"{error or f'HTTP {code}'}; URL disabled: failing for {failed_for:.0f} s"
    values = {**ready.guard, "status": status, "counted": attempted.counted, "delay": delay,
              "delivered": status == "delivered"}  # fmt: skip
    if session.execute(_FINISH, values).first() is None:
        raise LeaseLost(delivery.message_id)
    session.add(WebhookAttempt(delivery_id=delivery.id, url=delivery.url, status_code=code,
                               error=error, latency_ms=attempted.latency_ms))  # fmt: skip
    if status == "delivered":
        session.execute(RECOVERED, {"tenant": delivery.tenant_id, "url": delivery.url})
    elif status == "disabled" and attempted.counted:
        _disable(session, delivery, "gone" if code == 410 else "failing")
    if status == "failed":
        _dead_letter(session, delivery, ready.attempts + attempted.counted, error or f"HTTP {code}")
    session.flush()
    return status


def recorded(ready: Ready, status: str, attempted: Attempted) -> None:
    """After the outcome was committed: the attempt's metrics and log line."""
    if attempted.counted:
        _count_attempt(status, attempted.code, attempted.error)
    logger.info("webhook %s to %s: %s (%s)", ready.delivery.message_id,
                _origin(ready.delivery.url), status, attempted.code or attempted.error)  # fmt: skip


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
RECOVERED = text("DELETE FROM failing_webhook_urls WHERE tenant_id = :tenant AND url = :url")
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


def _origin(url: str) -> str:
    """What a log may say of a webhook URL: scheme, host and port. Its path and
    query often carry a token (Slack-style hooks), and logs travel further."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.hostname}{f':{parts.port}' if parts.port else ''}/..."
