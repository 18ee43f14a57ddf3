"""disabled_webhook_urls.reason and failing_webhook_urls: disabling a failing URL

A URL whose deliveries have all failed for WEBHOOK_DISABLE_AFTER_SECONDS is
disabled like one that answered 410 Gone; `reason` tells them apart (`gone`,
`failing`), since a redeliver re-enables only a failing one. Rows written before
are all 410s. `failing_webhook_urls` holds when each failing streak began.

Revision ID: b8e4f2a6c1d3
Revises: a7d3e9f1c2b4
Create Date: 2026-11-28 10:00:00

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "b8e4f2a6c1d3"
down_revision: str | Sequence[str] | None = "a7d3e9f1c2b4"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "disabled_webhook_urls",
        sa.Column("reason", sa.String(16), server_default="gone", nullable=False),
    )
    op.create_check_constraint(
        "disabled_webhook_urls_reason_valid", "disabled_webhook_urls",
        "reason IN ('gone', 'failing')",
    )  # fmt: skip
    op.create_table(
        "failing_webhook_urls",
        sa.Column("tenant_id", sa.Integer(), nullable=False),
        sa.Column("url", sa.Text(), nullable=False),
        sa.Column("failing_since", sa.DateTime(timezone=True), server_default=sa.text("now()"),
                  nullable=False),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("tenant_id", "url"),
    )  # fmt: skip


def downgrade() -> None:
    op.drop_table("failing_webhook_urls")
    op.execute("DELETE FROM disabled_webhook_urls WHERE reason <> 'gone'")
    op.drop_constraint("disabled_webhook_urls_reason_valid", "disabled_webhook_urls")
    op.drop_column("disabled_webhook_urls", "reason")
