"""Webhooks and usage: a tenant's delivery log, redelivery and disabled URLs, what
its jobs cost; and the senders' side, each step of an attempt its own unit of
work, with no transaction open while the receiver takes its time."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from datetime import datetime

from app.errors import Conflict, NotFound
from app.jobs import reads, usage
from app.jobs.usage import ModelUsage
from app.observability import tracing
from app.platform.database import Database, transactional
from app.tenancy.keys import TenantRef
from app.webhooks import delivery, log
from app.webhooks.delivery import (
    DELIVER_TASK,
    SWEEP_TASK,
    Attempted,
    DeliverySettings,
    LeaseLost,
    Ready,
)
from app.webhooks.log import Logged
from app.webhooks.ssrf import DEFAULT_EVENTS, EVENTS, Resolver
from app.webhooks.tables import DisabledWebhookUrl

__all__ = [
    "DEFAULT_EVENTS",
    "DELIVER_TASK",
    "EVENTS",
    "SWEEP_TASK",
    "DisabledWebhookUrl",
    "Logged",
    "ModelUsage",
    "WebhookOperations",
]

logger = logging.getLogger(__name__)


class WebhookOperations:
    def __init__(self, database: Database, settings: DeliverySettings) -> None:
        self.database, self.settings = database, settings

    # -- a tenant's side -----------------------------------------------------------

    def deliveries(self, tenant: TenantRef, job_id: uuid.UUID) -> list[Logged]:
        """The job's webhook deliveries, each with its attempts."""
        session = self.database.session()
        reads.get(session, tenant.id, job_id)
        return log.log_of(session, job_id)

    @transactional
    def redeliver(self, tenant: TenantRef, job_id: uuid.UUID, delivery_id: int) -> Logged:
        """Send a delivery again from the start of its schedule (same webhook-id),
        enabling its URL if it was disabled for failing; Conflict while it is being
        sent, or when its URL answered 410 Gone (enable that first)."""
        session = self.database.session()
        reads.get(session, tenant.id, job_id)
        if not log.log_of(session, job_id, delivery_id):
            raise NotFound(f"job {job_id} has no delivery {delivery_id}")
        if not log.redeliver(session, [delivery_id]):
            raise Conflict(
                f"delivery {delivery_id} is being sent now, or its URL answered 410 Gone and "
                "is disabled for your tenant: DELETE /webhook-urls/disabled?url=... enables it"
            )
        [logged] = log.log_of(session, job_id, delivery_id)
        return logged

    def disabled_urls(self, tenant: TenantRef) -> list[DisabledWebhookUrl]:
        """The tenant's disabled webhook URLs, each with why and since when."""
        return log.disabled_urls(self.database.session(), tenant.id)

    @transactional
    def enable_url(self, tenant: TenantRef, url: str) -> None:
        """Send to a disabled URL again (a 410's or a failing one's); NotFound if it
        is not disabled for the tenant."""
        if not log.enable(self.database.session(), tenant.id, url):
            raise NotFound(f"{url} is not a disabled webhook URL of your tenant")

    def usage_report(self, tenant: TenantRef, start: datetime, end: datetime) -> list[ModelUsage]:
        """Per model, the tenant's jobs created in [start, end) and what they cost."""
        return usage.report(self.database.session(), tenant.id, start, end)

    # -- the senders' side ---------------------------------------------------------

    def send_due(self, send: Callable[[int], object]) -> list[int]:
        """Mark due deliveries (and those whose sender died) `sending`, then hand
        each to `send` (a message to the webhook senders); the ids handed over."""
        due = self._take_due()
        for delivery_id in due:
            send(delivery_id)
        return due

    @transactional
    def _take_due(self) -> list[int]:
        return delivery.take_due(self.database.session(), self.settings.lease_s)

    def deliver(self, delivery_id: int, resolver: Resolver | None = None) -> str | None:
        """One attempt of one delivery; its status afterwards (None: not this
        sender's, or its lease ran out meanwhile)."""
        try:
            ready = self._prepare(delivery_id)
            if ready is None:
                return None
            if ready.not_sent is not None:
                return self._record(ready, Attempted("disabled", 0, ready.not_sent))
            with tracing.span("webhook delivery", ready.traceparent,
                              event=ready.delivery.event_type, attempt=ready.attempts):  # fmt: skip
                answer = delivery.send(self.settings, ready, resolver)
            return self._record(ready, delivery.judge(self.settings, ready, answer))
        except LeaseLost as lost:
            logger.warning("webhook %s: lease lost, outcome not written", lost)
            return None

    @transactional
    def _prepare(self, delivery_id: int) -> Ready | None:
        return delivery.prepare(self.database.session(), delivery_id, self.settings)

    def _record(self, ready: Ready, attempted: Attempted) -> str:
        with self.database.unit_of_work() as session:
            status = delivery.record(session, ready, attempted, self.settings)
        delivery.recorded(ready, status, attempted)
        return status
