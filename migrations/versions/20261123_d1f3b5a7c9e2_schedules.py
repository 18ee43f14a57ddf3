"""schedules: cron schedules in PostgreSQL whose runs are batches

A schedule names a model, an input (an uploaded file, or a path in the
tenant's data area) and where its results go. `next_run_at` is the one tick
due next: the run that fires it moves it on in the same transaction that
creates the run's batch, under a row lock, so two beats never fire a tick
twice, and a schedule that missed ticks while everything was down fires once.

Revision ID: d1f3b5a7c9e2
Revises: c9e1a7b5d3f6
Create Date: 2026-11-23 19:00:00

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "d1f3b5a7c9e2"
down_revision: str | Sequence[str] | None = "c9e1a7b5d3f6"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_UUID = postgresql.UUID(as_uuid=True)
_NOW = sa.text("now()")


def upgrade() -> None:
    op.create_table(
        "schedules",
        sa.Column("id", _UUID, primary_key=True),
        sa.Column("tenant_id", sa.Integer, sa.ForeignKey("tenants.id", ondelete="CASCADE"),
                  nullable=False),  # fmt: skip
        sa.Column("name", sa.String(100), nullable=False),
        sa.Column("cron", sa.String(120), nullable=False),
        sa.Column("timezone", sa.String(64), nullable=False),
        sa.Column("model", sa.String(100), nullable=False),
        sa.Column("model_version", sa.String(50)),
        sa.Column("input_file_id", _UUID, sa.ForeignKey("files.id", ondelete="RESTRICT")),
        sa.Column("input_path", sa.Text),
        sa.Column("output_path", sa.Text),
        sa.Column("paused", sa.Boolean, server_default=sa.false(), nullable=False),
        sa.Column("next_run_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_run_at", sa.DateTime(timezone=True)),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=_NOW, nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=_NOW, nullable=False),
        sa.CheckConstraint(
            "(input_file_id IS NULL) <> (input_path IS NULL)", name="schedules_one_input"
        ),
        sa.UniqueConstraint("tenant_id", "name", name="uq_schedules_tenant_name"),
    )
    op.create_index(
        "ix_schedules_due", "schedules", ["next_run_at"], postgresql_where=sa.text("NOT paused")
    )
    op.add_column("batches", sa.Column("schedule_id", _UUID,
                                       sa.ForeignKey("schedules.id", ondelete="SET NULL")))  # fmt: skip
    op.add_column("batches", sa.Column("scheduled_for", sa.DateTime(timezone=True)))
    op.add_column("batches", sa.Column("output_path", sa.Text))
    op.add_column("batches", sa.Column("exported_at", sa.DateTime(timezone=True)))
    op.create_index(
        "ix_batches_schedule_run", "batches", ["schedule_id", "scheduled_for"], unique=True,
        postgresql_where=sa.text("schedule_id IS NOT NULL"),
    )  # fmt: skip
    op.create_index(
        "ix_batches_to_export", "batches", ["finished_at"],
        postgresql_where=sa.text("output_path IS NOT NULL AND exported_at IS NULL"),
    )  # fmt: skip


def downgrade() -> None:
    op.drop_index("ix_batches_to_export", "batches")
    op.drop_index("ix_batches_schedule_run", "batches")
    for column in ("exported_at", "output_path", "scheduled_for", "schedule_id"):
        op.drop_column("batches", column)
    op.drop_index("ix_schedules_due", "schedules")
    op.drop_table("schedules")
