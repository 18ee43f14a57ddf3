"""claims by model: an index on each model's queued jobs, oldest first

Revision ID: e5a7c3d1f0b2
Revises: d4f2a1b8c9e0
Create Date: 2026-11-23 12:00:00

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "e5a7c3d1f0b2"
down_revision: str | Sequence[str] | None = "d4f2a1b8c9e0"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index(
        "ix_jobs_claim",
        "jobs",
        ["model", "created_at"],
        unique=False,
        postgresql_where=sa.text("status = 'queued'"),
    )


def downgrade() -> None:
    op.drop_index("ix_jobs_claim", table_name="jobs", postgresql_where=sa.text("status = 'queued'"))
