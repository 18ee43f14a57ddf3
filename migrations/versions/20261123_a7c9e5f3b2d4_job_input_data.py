"""jobs.input_data: inputs as bytes of their declared datatype, not JSON

Revision ID: a7c9e5f3b2d4
Revises: f6b8d4e2a1c3
Create Date: 2026-11-23 12:10:00

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "a7c9e5f3b2d4"
down_revision: str | Sequence[str] | None = "f6b8d4e2a1c3"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("jobs", sa.Column("input_data", sa.LargeBinary(), nullable=True))


def downgrade() -> None:
    op.drop_column("jobs", "input_data")
