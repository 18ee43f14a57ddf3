"""the delivery sweep's lease branch: an index on sends whose lease may run out

Revision ID: f4b6d8a0c2e5
Revises: d2f4b6a8c0e1
Create Date: 2026-11-23 19:00:00

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "f4b6d8a0c2e5"
down_revision: str | Sequence[str] | None = "d2f4b6a8c0e1"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

WHERE = sa.text("status IN ('sending', 'in_flight')")


def upgrade() -> None:
    op.create_index(
        "ix_webhook_deliveries_lease",
        "webhook_deliveries",
        ["lease_expires_at"],
        unique=False,
        postgresql_where=WHERE,
    )


def downgrade() -> None:
    op.drop_index(
        "ix_webhook_deliveries_lease", table_name="webhook_deliveries", postgresql_where=WHERE
    )
