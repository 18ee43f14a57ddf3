"""jobs.prompt_tokens and jobs.completion_tokens: a generation's token counts

Written when a generative model's job finishes (with its text), so GET /usage
sums tokens per model from the rows, as it sums compute seconds, and keeps them
after the outputs themselves are purged. NULL for one-shot models.

Revision ID: c9f5a3b7d2e4
Revises: b8e4f2a6c1d3
Create Date: 2026-11-29 10:00:00

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "c9f5a3b7d2e4"
down_revision: str | Sequence[str] | None = "b8e4f2a6c1d3"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("jobs", sa.Column("prompt_tokens", sa.Integer(), nullable=True))
    op.add_column("jobs", sa.Column("completion_tokens", sa.Integer(), nullable=True))


def downgrade() -> None:
    op.drop_column("jobs", "completion_tokens")
    op.drop_column("jobs", "prompt_tokens")
