"""tenant quotas, job priorities, per-job compute cost, and a claim index for fair dispatch

Revision ID: b2c4d6e8f0a1
Revises: a1b3c5d7e9f0
Create Date: 2026-11-23 21:10:00

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "b2c4d6e8f0a1"
down_revision: str | Sequence[str] | None = "a1b3c5d7e9f0"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

QUEUED = sa.text("status = 'queued'")
OPEN = sa.text("status IN ('queued', 'running')")


def upgrade() -> None:
    for name, kind in (
        ("max_in_flight", sa.Integer()),
        ("max_submits_per_second", sa.Float()),
        ("max_batch_rows_per_day", sa.BigInteger()),
        ("max_stored_bytes", sa.BigInteger()),
        ("max_priority", sa.SmallInteger()),
    ):
        op.add_column("tenants", sa.Column(name, kind, nullable=True))
    op.add_column(
        "jobs", sa.Column("priority", sa.SmallInteger(), server_default="0", nullable=False)
    )
    op.add_column("jobs", sa.Column("compute_seconds", sa.Float(), nullable=True))
    op.add_column("jobs", sa.Column("batch_share", sa.Float(), nullable=True))
    op.add_column("batches", sa.Column("result_bytes", sa.BigInteger(), nullable=True))
    op.drop_index("ix_jobs_claim", table_name="jobs", postgresql_where=QUEUED)
    op.create_index(
        "ix_jobs_claim",
        "jobs",
        ["model", "tenant_id", sa.text("priority DESC"), "created_at"],
        unique=False,
        postgresql_where=QUEUED,
    )
    op.create_index(
        "ix_jobs_tenant_open", "jobs", ["tenant_id"], unique=False, postgresql_where=OPEN
    )


def downgrade() -> None:
    op.drop_index("ix_jobs_tenant_open", table_name="jobs", postgresql_where=OPEN)
    op.drop_index("ix_jobs_claim", table_name="jobs", postgresql_where=QUEUED)
    op.create_index(
        "ix_jobs_claim", "jobs", ["model", "created_at"], unique=False, postgresql_where=QUEUED
    )
    op.drop_column("batches", "result_bytes")
    for name in ("batch_share", "compute_seconds", "priority"):
        op.drop_column("jobs", name)
    for name in (
        "max_priority",
        "max_stored_bytes",
        "max_batch_rows_per_day",
        "max_submits_per_second",
        "max_in_flight",
    ):
        op.drop_column("tenants", name)
