"""job_steps: each finished step of a pipeline job, with its outputs

A pipeline's job records every step (and every element of a mapped step) as it
finishes, in its own row, so a retried job resumes at its first unfinished step
and no finished step runs again. A row is written once (its key holds the job,
the step and the element; -1 for a whole step) and goes with its job.

Revision ID: e7b3c1d5f9a2
Revises: d6a2b0c4e8f1
Create Date: 2026-12-07 10:00:00

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "e7b3c1d5f9a2"
down_revision: str | Sequence[str] | None = "d6a2b0c4e8f1"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "job_steps",
        sa.Column(
            "job_id",
            postgresql.UUID(as_uuid=True),
            sa.ForeignKey("jobs.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("step", sa.String(100), nullable=False),
        sa.Column("element", sa.Integer(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("outputs", sa.LargeBinary(), nullable=False),
        sa.Column(
            "finished_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.PrimaryKeyConstraint("job_id", "step", "element"),
    )


def downgrade() -> None:
    op.drop_table("job_steps")
