"""Tenants and their API keys."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    DateTime,
    Float,
    ForeignKey,
    Integer,
    SmallInteger,
    String,
    func,
)
from sqlalchemy.orm import Mapped, mapped_column

from app.platform.orm import Base


class Tenant(Base):
    __tablename__ = "tenants"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(100), unique=True)
    # Standard Webhooks signing secret (`whsec_...`). It must be readable to sign with.
    webhook_secret: Mapped[str] = mapped_column(String(100))
    # During a rotation's overlap, deliveries are signed with both secrets.
    previous_webhook_secret: Mapped[str | None] = mapped_column(String(100))
    previous_secret_expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    # Quotas (app.tenancy.quotas), set with `manage.py tenants set`; NULL: the TENANT_*
    # setting's default. Jobs queued or running at once; submits a second (every
    # door); batch rows in 24 h; bytes of uploads and batch results kept; the highest
    # `priority` its jobs may ask for; tokens its generations take a minute.
    max_in_flight: Mapped[int | None] = mapped_column(Integer)
    max_submits_per_second: Mapped[float | None] = mapped_column(Float)
    max_batch_rows_per_day: Mapped[int | None] = mapped_column(BigInteger)
    max_stored_bytes: Mapped[int | None] = mapped_column(BigInteger)
    max_priority: Mapped[int | None] = mapped_column(SmallInteger)
    max_tokens_per_minute: Mapped[int | None] = mapped_column(BigInteger)


API_KEY_KINDS = ("tenant", "operator")


class ApiKey(Base):
    """A tenant's key (job routes) or an operator's (the model repository routes).
    An operator key belongs to no tenant, so it can never read a tenant's jobs."""

    __tablename__ = "api_keys"
    __table_args__ = (
        CheckConstraint(
            "(kind = 'tenant' AND tenant_id IS NOT NULL) OR "
            "(kind = 'operator' AND tenant_id IS NULL)",
            name="api_keys_kind_valid",
        ),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    tenant_id: Mapped[int | None] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    kind: Mapped[str] = mapped_column(String(16), server_default="tenant")
    # SHA-256 of the key: keys are 256-bit random tokens, so a fast hash is safe and
    # keeps the per-request lookup an index probe.
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    # The first characters of the key, so a person can tell keys apart.
    prefix: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # A key given a lifetime stops working at this time (NULL: until revoked).
    expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
