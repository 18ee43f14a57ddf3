"""Indexes for deleting finished jobs and batches (JOB_RETENTION_SECONDS)

The purge deletes finished jobs outside batches oldest first (ix_jobs_finished),
and finished batches with their chunks (ix_batches_finished). Deleting a job
cascades to every table that references it, each by an index on its job id:
idempotency_keys had none, and stream_entries' covered unpublished entries only,
so each deleted job would have scanned those tables whole.

Revision ID: b4e0f8a2c6d9
Revises: a3d9e7f1b5c8
Create Date: 2026-12-04 10:00:00

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "b4e0f8a2c6d9"
down_revision: str | Sequence[str] | None = "a3d9e7f1b5c8"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index("ix_jobs_finished", "jobs", ["finished_at"],
                    postgresql_where=sa.text("finished_at IS NOT NULL AND batch_id IS NULL"))  # fmt: skip
    op.create_index("ix_batches_finished", "batches", ["finished_at"],
                    postgresql_where=sa.text("finished_at IS NOT NULL"))  # fmt: skip
    op.create_index("ix_idempotency_keys_job_id", "idempotency_keys", ["job_id"])
    op.drop_index("ix_stream_entries_job", table_name="stream_entries")
    op.create_index("ix_stream_entries_job", "stream_entries", ["job_id"])


def downgrade() -> None:
    op.drop_index("ix_stream_entries_job", table_name="stream_entries")
    op.create_index("ix_stream_entries_job", "stream_entries", ["job_id"],
                    postgresql_where=sa.text("published_at IS NULL"))  # fmt: skip
    op.drop_index("ix_idempotency_keys_job_id", table_name="idempotency_keys")
    op.drop_index("ix_batches_finished", table_name="batches")
    op.drop_index("ix_jobs_finished", table_name="jobs")
