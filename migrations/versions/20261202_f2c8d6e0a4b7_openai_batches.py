"""batches.openai and jobs.batch_line: batches in OpenAI's Batch format

A batch made through /v1/batches keeps OpenAI's fields (endpoint, input file id,
metadata) on its row; each of its chunk jobs keeps its line's custom_id and,
for a line refused before it ran, how it was refused. Both NULL for every
other batch and job (adding a nullable column rewrites no rows).

Revision ID: f2c8d6e0a4b7
Revises: e1b7c5d9f4a6
Create Date: 2026-12-02 10:00:00

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "f2c8d6e0a4b7"
down_revision: str | Sequence[str] | None = "e1b7c5d9f4a6"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("batches", sa.Column("openai", postgresql.JSONB(), nullable=True))
    op.add_column("jobs", sa.Column("batch_line", postgresql.JSONB(), nullable=True))


def downgrade() -> None:
    op.drop_column("jobs", "batch_line")
    op.drop_column("batches", "openai")
