"""Batches and the uploaded files they read."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, UUID
from sqlalchemy.orm import Mapped, mapped_column

from app.platform.orm import Base
from app.statuses import BATCH_OPEN_SQL, BatchStatus, sql_list


class File(Base):
    """An uploaded input file (`.npy`, `.jsonl`, `.csv`, `.parquet`). Its bytes are
    the file store's object `store_key`; files uploaded before the store keep
    theirs in `file_parts` (`store_key` NULL)."""

    __tablename__ = "files"
    __table_args__ = (Index("ix_files_tenant_created", "tenant_id", "created_at"),)

    id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True)
    tenant_id: Mapped[int] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    filename: Mapped[str] = mapped_column(String(255))
    format: Mapped[str] = mapped_column(String(8))
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    sha256: Mapped[str] = mapped_column(String(64))
    parts: Mapped[int] = mapped_column(Integer)
    store_key: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


class FilePart(Base):
    __tablename__ = "file_parts"

    file_id: Mapped[uuid.UUID] = mapped_column(
        UUID(as_uuid=True), ForeignKey("files.id", ondelete="CASCADE"), primary_key=True
    )
    seq: Mapped[int] = mapped_column(Integer, primary_key=True)
    data: Mapped[bytes] = mapped_column(LargeBinary)


class Batch(Base):
    """Many rows for one model, run as chunk jobs (`jobs.batch_id`). Progress is
    counted from the chunks; the batch row holds what the chunks cannot say."""

    __tablename__ = "batches"
    __mapper_args__ = {"eager_defaults": True}
    __table_args__ = (
        CheckConstraint(
            f"status IN ({sql_list(BatchStatus)})",
            name="batches_status_valid",
        ),
        Index("ix_batches_tenant_created", "tenant_id", text("created_at DESC"), text("id DESC")),
        Index(
            "ix_batches_open", "split_at", postgresql_where=text(f"status IN ({BATCH_OPEN_SQL})")
        ),
        Index(
            "ix_batches_schedule_run",
            "schedule_id",
            "scheduled_for",
            unique=True,
            postgresql_where=text("schedule_id IS NOT NULL"),
        ),
        Index(
            "ix_batches_to_purge",
            "finished_at",
            postgresql_where=text("purged_at IS NULL AND finished_at IS NOT NULL"),
        ),
        # Retention deletes finished batches oldest first, with their chunks.
        Index(
            "ix_batches_finished", "finished_at", postgresql_where=text("finished_at IS NOT NULL")
        ),
        Index(
            "ix_batches_to_export",
            "finished_at",
            postgresql_where=text("output_path IS NOT NULL AND exported_at IS NULL"),
        ),
    )

    id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True)
    tenant_id: Mapped[int] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    model: Mapped[str] = mapped_column(String(100))
    model_version: Mapped[str] = mapped_column(String(50))
    # queued: its file is being cut into chunks; running: every chunk exists.
    status: Mapped[str] = mapped_column(String(24), server_default=BatchStatus.QUEUED.value)
    input_file_id: Mapped[uuid.UUID | None] = mapped_column(
        UUID(as_uuid=True), ForeignKey("files.id", ondelete="SET NULL")
    )
    chunk_rows: Mapped[int] = mapped_column(Integer)
    rows: Mapped[int | None] = mapped_column(BigInteger)  # known once split
    # Bytes of its chunks' stored outputs, counted when it finished (storage quota).
    result_bytes: Mapped[int | None] = mapped_column(BigInteger)
    chunks: Mapped[int | None] = mapped_column(Integer)
    # Rows cut into chunks so far, and when: a split that stopped resumes from here.
    split_rows: Mapped[int] = mapped_column(BigInteger, server_default="0")
    split_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    max_attempts: Mapped[int] = mapped_column(Integer, server_default="3")
    error_code: Mapped[str | None] = mapped_column(String(64))
    error_message: Mapped[str | None] = mapped_column(Text)
    webhook_url: Mapped[str | None] = mapped_column(Text)
    webhook_events: Mapped[list[str] | None] = mapped_column(ARRAY(String(32)))
    cancel_requested_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # Set when retention deleted its objects (chunk inputs, results) from the file store.
    purged_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # A schedule's run: which tick it is, and where its results are written.
    schedule_id: Mapped[uuid.UUID | None] = mapped_column(
        UUID(as_uuid=True), ForeignKey("schedules.id", ondelete="SET NULL")
    )
    scheduled_for: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    output_path: Mapped[str | None] = mapped_column(Text)
    exported_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # A batch made through /v1/batches, in OpenAI's Batch format: its `endpoint`,
    # `input_file_id` (as OpenAI's clients name it) and `metadata`; NULL otherwise.
    openai: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
