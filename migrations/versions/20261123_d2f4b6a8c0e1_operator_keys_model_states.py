"""operator keys and shared model states

API keys get a kind: `tenant` (job routes, as before) or `operator` (the model
repository routes), which belongs to no tenant. `model_states` holds each model
version's load state (READY / UNAVAILABLE and why), so every API and worker
process, on any machine, serves the same versions.

Revision ID: d2f4b6a8c0e1
Revises: d1f3b5a7c9e2
Create Date: 2026-11-23 18:10:00

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "d2f4b6a8c0e1"
down_revision: str | Sequence[str] | None = "d1f3b5a7c9e2"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "api_keys",
        sa.Column("kind", sa.String(16), server_default="tenant", nullable=False),
    )
    op.alter_column("api_keys", "tenant_id", existing_type=sa.Integer, nullable=True)
    op.create_check_constraint(
        "api_keys_kind_valid",
        "api_keys",
        "(kind = 'tenant' AND tenant_id IS NOT NULL) OR (kind = 'operator' AND tenant_id IS NULL)",
    )
    op.create_table(
        "model_states",
        sa.Column("name", sa.String(100), primary_key=True),
        sa.Column("version", sa.String(50), primary_key=True),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("reason", sa.Text),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.text("now()"),
                  nullable=False),  # fmt: skip
        sa.CheckConstraint(
            "state IN ('READY', 'UNAVAILABLE')", name="model_states_state_valid"
        ),
    )
    op.create_index("ix_model_states_updated", "model_states", ["updated_at"])


def downgrade() -> None:
    op.drop_index("ix_model_states_updated", table_name="model_states")
    op.drop_table("model_states")
    op.execute("DELETE FROM api_keys WHERE kind = 'operator'")
    op.drop_constraint("api_keys_kind_valid", "api_keys", type_="check")
    op.alter_column("api_keys", "tenant_id", existing_type=sa.Integer, nullable=False)
    op.drop_column("api_keys", "kind")
