"""batches and files: uploaded inputs in PostgreSQL, batches split into chunk jobs

A batch's rows are cut into chunks; each chunk is an ordinary job (so it is
claimed, leased, retried and dead-lettered like one) that carries `batch_id`,
its place in the batch and its first row, and keeps its outputs packed in
`output_data` rather than as JSON. Uploaded files live in `file_parts`, in
parts of about a MiB, so API and workers on different machines need nothing
but PostgreSQL. Webhook deliveries and dead letters may now concern a batch
instead of a job.

Revision ID: c9e1a7b5d3f6
Revises: b8d0f6a4c3e5
Create Date: 2026-11-23 18:00:00

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "c9e1a7b5d3f6"
down_revision: str | Sequence[str] | None = "b8d0f6a4c3e5"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_UUID = postgresql.UUID(as_uuid=True)
_NOW = sa.text("now()")


def upgrade() -> None:
    op.create_table(
        "files",
        sa.Column("id", _UUID, primary_key=True),
        sa.Column("tenant_id", sa.Integer, sa.ForeignKey("tenants.id", ondelete="CASCADE"),
                  nullable=False),  # fmt: skip
        sa.Column("filename", sa.String(255), nullable=False),
        sa.Column("format", sa.String(8), nullable=False),
        sa.Column("size_bytes", sa.BigInteger, nullable=False),
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("parts", sa.Integer, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=_NOW, nullable=False),
    )
    op.create_index("ix_files_tenant_created", "files", ["tenant_id", "created_at"])
    op.create_table(
        "file_parts",
        sa.Column("file_id", _UUID, sa.ForeignKey("files.id", ondelete="CASCADE"),
                  primary_key=True),  # fmt: skip
        sa.Column("seq", sa.Integer, primary_key=True),
        sa.Column("data", sa.LargeBinary, nullable=False),
    )
    # Parts are mostly numbers that do not compress: skip TOAST's attempt.
    op.execute("ALTER TABLE file_parts ALTER COLUMN data SET STORAGE EXTERNAL")
    op.create_table(
        "batches",
        sa.Column("id", _UUID, primary_key=True),
        sa.Column("tenant_id", sa.Integer, sa.ForeignKey("tenants.id", ondelete="CASCADE"),
                  nullable=False),  # fmt: skip
        sa.Column("model", sa.String(100), nullable=False),
        sa.Column("model_version", sa.String(50), nullable=False),
        sa.Column("status", sa.String(24), server_default="queued", nullable=False),
        sa.Column("input_file_id", _UUID, sa.ForeignKey("files.id", ondelete="SET NULL")),
        sa.Column("chunk_rows", sa.Integer, nullable=False),
        sa.Column("rows", sa.BigInteger),
        sa.Column("chunks", sa.Integer),
        sa.Column("split_rows", sa.BigInteger, server_default="0", nullable=False),
        sa.Column("split_at", sa.DateTime(timezone=True)),
        sa.Column("max_attempts", sa.Integer, server_default="3", nullable=False),
        sa.Column("error_code", sa.String(64)),
        sa.Column("error_message", sa.Text),
        sa.Column("webhook_url", sa.Text),
        sa.Column("webhook_events", postgresql.ARRAY(sa.String(32))),
        sa.Column("cancel_requested_at", sa.DateTime(timezone=True)),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=_NOW, nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True)),
        sa.Column("finished_at", sa.DateTime(timezone=True)),
        sa.CheckConstraint(
            "status IN ('queued', 'running', 'succeeded', 'partially_succeeded', 'failed', "
            "'cancelled')",
            name="batches_status_valid",
        ),
    )
    op.create_index(
        "ix_batches_tenant_created", "batches",
        ["tenant_id", sa.text("created_at DESC"), sa.text("id DESC")],
    )  # fmt: skip
    op.create_index(
        "ix_batches_open", "batches", ["split_at"],
        postgresql_where=sa.text("status IN ('queued', 'running')"),
    )  # fmt: skip
    op.add_column("jobs", sa.Column("batch_id", _UUID,
                                    sa.ForeignKey("batches.id", ondelete="CASCADE")))  # fmt: skip
    op.add_column("jobs", sa.Column("batch_index", sa.Integer))
    op.add_column("jobs", sa.Column("first_row", sa.BigInteger))
    op.add_column("jobs", sa.Column("output_data", sa.LargeBinary))
    # A chunk of an .npy file already laid out as the model wants: its rows are read
    # from the file's parts at `input_offset`, never copied (input_data: the header).
    op.add_column("jobs", sa.Column("input_file_id", _UUID,
                                    sa.ForeignKey("files.id", ondelete="SET NULL")))  # fmt: skip
    op.add_column("jobs", sa.Column("input_offset", sa.BigInteger))
    # A chunk's packed tensors are a MiB or so: pglz compressing them cost PostgreSQL
    # more CPU than the model's run (a 1M-row batch took 2.3x as long). Jobs' own
    # small tensors stay inline either way.
    op.execute(
        "ALTER TABLE jobs ALTER COLUMN input_data SET STORAGE EXTERNAL, "
        "ALTER COLUMN output_data SET STORAGE EXTERNAL"
    )
    op.create_index(
        "ix_jobs_batch_chunk", "jobs", ["batch_id", "batch_index"], unique=True,
        postgresql_where=sa.text("batch_id IS NOT NULL"),
    )  # fmt: skip
    # Whether a batch has chunks left: one probe, whatever its size (see settle).
    op.create_index(
        "ix_jobs_batch_open", "jobs", ["batch_id"],
        postgresql_where=sa.text("batch_id IS NOT NULL AND status IN ('queued', 'running')"),
    )  # fmt: skip
    for table in ("webhook_deliveries", "dead_letters"):
        op.alter_column(table, "job_id", nullable=True)
        op.add_column(table, sa.Column("batch_id", _UUID,
                                       sa.ForeignKey("batches.id", ondelete="CASCADE")))  # fmt: skip
        op.create_check_constraint(
            f"{table}_subject", table, "job_id IS NOT NULL OR batch_id IS NOT NULL"
        )
    op.create_index("ix_webhook_deliveries_batch", "webhook_deliveries", ["batch_id", "id"])


def downgrade() -> None:
    op.drop_index("ix_webhook_deliveries_batch", "webhook_deliveries")
    for table in ("webhook_deliveries", "dead_letters"):
        op.execute(f"DELETE FROM {table} WHERE job_id IS NULL")
        op.drop_constraint(f"{table}_subject", table)
        op.drop_column(table, "batch_id")
        op.alter_column(table, "job_id", nullable=False)
    op.drop_index("ix_jobs_batch_open", "jobs")
    op.drop_index("ix_jobs_batch_chunk", "jobs")
    for column in ("input_offset", "input_file_id", "output_data", "first_row", "batch_index",
                   "batch_id"):  # fmt: skip
        op.drop_column("jobs", column)
    op.drop_table("batches")
    op.drop_table("file_parts")
    op.drop_table("files")
