"""Webhook deliveries, their attempts, and the URLs disabled or failing."""

from __future__ import annotations

import uuid
from datetime import datetime

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import UUID
from sqlalchemy.orm import Mapped, mapped_column

from app.platform.orm import Base


class WebhookDelivery(Base):
    """One event to push to one URL; retried on its schedule, kept as a log."""

    __tablename__ = "webhook_deliveries"
    __table_args__ = (
        Index("ix_webhook_deliveries_job", "job_id", "id"),
        Index(
            "ix_webhook_deliveries_due",
            "next_attempt_at",
            postgresql_where=text("status IN ('pending', 'sending')"),
        ),
        # The delivery sweep's other branch: sends whose worker died (lease run out).
        Index(
            "ix_webhook_deliveries_lease",
            "lease_expires_at",
            postgresql_where=text("status IN ('sending', 'in_flight')"),
        ),
        Index("ix_webhook_deliveries_batch", "batch_id", "id"),
        CheckConstraint(
            "job_id IS NOT NULL OR batch_id IS NOT NULL", name="webhook_deliveries_subject"
        ),
    )

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    # The job the event is about, or the batch (batch.* events).
    job_id: Mapped[uuid.UUID | None] = mapped_column(
        UUID(as_uuid=True), ForeignKey("jobs.id", ondelete="CASCADE")
    )
    batch_id: Mapped[uuid.UUID | None] = mapped_column(
        UUID(as_uuid=True), ForeignKey("batches.id", ondelete="CASCADE")
    )
    tenant_id: Mapped[int] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    event_type: Mapped[str] = mapped_column(String(32))
    # The Standard Webhooks message id: the same on every attempt of this event.
    message_id: Mapped[str] = mapped_column(String(64), unique=True)
    url: Mapped[str] = mapped_column(Text)
    # Fixed at the first attempt, so every retry sends the same body.
    payload: Mapped[str | None] = mapped_column(Text)
    status: Mapped[str] = mapped_column(String(16), server_default="pending")
    attempts: Mapped[int] = mapped_column(Integer, server_default="0")
    next_attempt_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), server_default=func.now()
    )
    lease_expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    delivered_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))


class WebhookAttempt(Base):
    """One HTTP attempt of a delivery: the delivery log clients read."""

    __tablename__ = "webhook_attempts"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    delivery_id: Mapped[int] = mapped_column(
        BigInteger, ForeignKey("webhook_deliveries.id", ondelete="CASCADE"), index=True
    )
    at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    url: Mapped[str] = mapped_column(Text)
    status_code: Mapped[int | None] = mapped_column(Integer)
    error: Mapped[str | None] = mapped_column(Text)
    latency_ms: Mapped[float | None] = mapped_column()


DISABLE_REASONS = ("gone", "failing")


class DisabledWebhookUrl(Base):
    """A URL nothing more is sent to for the tenant: it answered 410 Gone (`gone`), or
    every delivery to it failed for WEBHOOK_DISABLE_AFTER_SECONDS (`failing`)."""

    __tablename__ = "disabled_webhook_urls"
    __table_args__ = (
        CheckConstraint(
            "reason IN (" + ", ".join(f"'{r}'" for r in DISABLE_REASONS) + ")",
            name="disabled_webhook_urls_reason_valid",
        ),
    )

    tenant_id: Mapped[int] = mapped_column(
        ForeignKey("tenants.id", ondelete="CASCADE"), primary_key=True
    )
    url: Mapped[str] = mapped_column(Text, primary_key=True)
    disabled_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), server_default=func.now()
    )
    reason: Mapped[str] = mapped_column(String(16), server_default="gone")


class FailingWebhookUrl(Base):
    """A tenant's URL whose deliveries have all failed since `failing_since` (its first
    failure after its last success): the row goes at the next success."""

    __tablename__ = "failing_webhook_urls"

    tenant_id: Mapped[int] = mapped_column(
        ForeignKey("tenants.id", ondelete="CASCADE"), primary_key=True
    )
    url: Mapped[str] = mapped_column(Text, primary_key=True)
    failing_since: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), server_default=func.now()
    )
