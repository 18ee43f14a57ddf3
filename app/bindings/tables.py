"""Stream bindings and the record of each input entry that became a job."""

from __future__ import annotations

import uuid
from datetime import datetime

from sqlalchemy import (
    Boolean,
    DateTime,
    ForeignKey,
    Index,
    String,
    UniqueConstraint,
    false,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import UUID
from sqlalchemy.orm import Mapped, mapped_column

from app.platform.orm import Base


class StreamBinding(Base):
    """A tenant's model bound to an input log and an output log (the stream door):
    entries appended to `input` become jobs, each result is appended to `output`,
    entries that cannot become a job go to `dead_letter`. The names are the full
    log names (`<STREAMS_PREFIX>:<tenant>:<name>`), kept as they were made, so a
    later change of STREAMS_PREFIX never moves an existing binding's logs."""

    __tablename__ = "stream_bindings"
    __mapper_args__ = {"eager_defaults": True}
    __table_args__ = (UniqueConstraint("input", name="uq_stream_bindings_input"),)

    id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True)
    tenant_id: Mapped[int] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    model: Mapped[str] = mapped_column(String(100))
    # None: the newest serving version, looked up for each batch of entries.
    model_version: Mapped[str | None] = mapped_column(String(50))
    input: Mapped[str] = mapped_column(String(300))
    output: Mapped[str] = mapped_column(String(300))
    dead_letter: Mapped[str] = mapped_column(String(300))
    paused: Mapped[bool] = mapped_column(Boolean, server_default=false())
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


class StreamEntry(Base):
    """An input entry that became a job, and the outbox of its result.

    Written in the transaction that inserts the job, keyed by the entry's id in its
    log: a redelivered entry finds its job here instead of making a second one.
    `published_at` is set once the result was appended to the output log."""

    __tablename__ = "stream_entries"
    __table_args__ = (
        # The publisher's sweep and the unpublished count per binding.
        Index(
            "ix_stream_entries_unpublished",
            "binding_id",
            "created_at",
            postgresql_where=text("published_at IS NULL"),
        ),
        # The publisher's look-up of the jobs a NOTIFY named, and a job's deletion
        # (its entries go with it: the cascade finds them here).
        Index("ix_stream_entries_job", "job_id"),
        # Retention deletes old rows by age: a BRIN index costs next to nothing to keep.
        Index("ix_stream_entries_created", "created_at", postgresql_using="brin"),
    )

    binding_id: Mapped[uuid.UUID] = mapped_column(
        UUID(as_uuid=True), ForeignKey("stream_bindings.id", ondelete="CASCADE"), primary_key=True
    )
    entry_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    # The caller's own id of the request (the entry's `id` field).
    request_id: Mapped[str] = mapped_column(String(200))
    # Deferred: the entry is inserted first (ON CONFLICT DO NOTHING decides which
    # entries are new), then the jobs of the new ones, in the same transaction.
    job_id: Mapped[uuid.UUID] = mapped_column(
        UUID(as_uuid=True),
        ForeignKey("jobs.id", ondelete="CASCADE", deferrable=True, initially="DEFERRED"),
    )
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    published_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
