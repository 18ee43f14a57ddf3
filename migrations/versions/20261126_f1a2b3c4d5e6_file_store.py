"""file store: uploads and batch results kept as objects, PostgreSQL keeps metadata

`files.store_key` names an upload's object in the file store (FILE_STORE_URL);
files uploaded before keep their bytes in `file_parts` (key NULL) and are read
from there, so nothing is copied at upgrade. `jobs.input_key` names the object a
chunk reads its rows from (an upload, from `input_offset`, or the chunk's own
inputs cut from a text or Parquet file); `jobs.output_bytes` is the size of a
chunk's result part in the store (NULL: outputs in `output_data`, as before).
`batches.purged_at` records that retention deleted a batch's objects.

Revision ID: f1a2b3c4d5e6
Revises: e7c1a3f5b9d2
Create Date: 2026-11-26 10:00:00

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "f1a2b3c4d5e6"
down_revision: str | Sequence[str] | None = "e7c1a3f5b9d2"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("files", sa.Column("store_key", sa.Text))
    op.add_column("jobs", sa.Column("input_key", sa.Text))
    op.add_column("jobs", sa.Column("output_bytes", sa.BigInteger))
    op.add_column("batches", sa.Column("purged_at", sa.DateTime(timezone=True)))
    op.create_index("ix_batches_to_purge", "batches", ["finished_at"],
                    postgresql_where=sa.text("purged_at IS NULL AND finished_at IS NOT NULL"))  # fmt: skip


def downgrade() -> None:
    op.drop_index("ix_batches_to_purge", table_name="batches")
    op.drop_column("batches", "purged_at")
    op.drop_column("jobs", "output_bytes")
    op.drop_column("jobs", "input_key")
    op.drop_column("files", "store_key")
