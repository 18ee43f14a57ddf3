"""jobs.batch_rows: rows a job adds to a micro-batch, so claims fill batches by rows

Revision ID: f6b8d4e2a1c3
Revises: e5a7c3d1f0b2
Create Date: 2026-11-23 12:00:00

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "f6b8d4e2a1c3"
down_revision: str | Sequence[str] | None = "e5a7c3d1f0b2"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "jobs", sa.Column("batch_rows", sa.Integer(), server_default="1", nullable=False)
    )


def downgrade() -> None:
    op.drop_column("jobs", "batch_rows")
