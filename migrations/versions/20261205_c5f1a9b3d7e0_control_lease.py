"""control_leases: which beat sends the control plane's sweeps, in which term

Every control host runs a beat; the one holding the lease row sends the sweeps,
each message carrying the row's token, and a sweep's units of work check that
token first (app.platform.fencing). A new table: nothing is rewritten.

Revision ID: c5f1a9b3d7e0
Revises: b4e0f8a2c6d9
Create Date: 2026-12-05 10:00:00

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "c5f1a9b3d7e0"
down_revision: str | Sequence[str] | None = "b4e0f8a2c6d9"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "control_leases",
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("holder", sa.String(200), nullable=False),
        sa.Column("token", sa.BigInteger(), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("control_leases")
