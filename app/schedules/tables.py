"""Schedules: cron runs of a model, each run a batch."""

from __future__ import annotations

import uuid
from datetime import datetime

from sqlalchemy import (
    Boolean,
    CheckConstraint,
    DateTime,
    ForeignKey,
    Index,
    String,
    Text,
    UniqueConstraint,
    false,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import UUID
from sqlalchemy.orm import Mapped, mapped_column

from app.platform.orm import Base


class Schedule(Base):
    """A cron schedule whose every run is a batch (`batches.schedule_id`)."""

    __tablename__ = "schedules"
    __mapper_args__ = {"eager_defaults": True}
    __table_args__ = (
        CheckConstraint(
            "(input_file_id IS NULL) <> (input_path IS NULL)", name="schedules_one_input"
        ),
        UniqueConstraint("tenant_id", "name", name="uq_schedules_tenant_name"),
        Index("ix_schedules_due", "next_run_at", postgresql_where=text("NOT paused")),
    )

    id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True)
    tenant_id: Mapped[int] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(100))
    cron: Mapped[str] = mapped_column(String(120))
    timezone: Mapped[str] = mapped_column(String(64))
    model: Mapped[str] = mapped_column(String(100))
    model_version: Mapped[str | None] = mapped_column(String(50))
    # The input: an uploaded file, or a file or folder in the tenant's data area.
    input_file_id: Mapped[uuid.UUID | None] = mapped_column(
        UUID(as_uuid=True), ForeignKey("files.id", ondelete="RESTRICT")
    )
    input_path: Mapped[str | None] = mapped_column(Text)
    # A folder of the tenant's data area each run's results are written to, if any.
    output_path: Mapped[str | None] = mapped_column(Text)
    paused: Mapped[bool] = mapped_column(Boolean, server_default=false())
    # The one tick due next; firing it moves it on (see app.schedules.service.fire_due).
    next_run_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    last_run_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
