"""model_states.state may be LOADING: a version a load is checking

A load records LOADING for the versions it brings in (those not serving) before
it checks them with ONNX Runtime, then READY or UNAVAILABLE; the repository's
index shows it meanwhile, and a LOADING version does not serve. Only the check
constraint changes: no row is rewritten.

Revision ID: a3d9e7f1b5c8
Revises: f2c8d6e0a4b7
Create Date: 2026-12-03 10:00:00

"""

from collections.abc import Sequence

from alembic import op

revision: str = "a3d9e7f1b5c8"
down_revision: str | Sequence[str] | None = "f2c8d6e0a4b7"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.drop_constraint("model_states_state_valid", "model_states", type_="check")
    op.create_check_constraint(
        "model_states_state_valid", "model_states", "state IN ('READY', 'UNAVAILABLE', 'LOADING')"
    )


def downgrade() -> None:
    # A load cut short left LOADING: such a version did not serve, so UNAVAILABLE.
    op.execute(
        "UPDATE model_states SET state = 'UNAVAILABLE', reason = 'a load did not finish' "
        "WHERE state = 'LOADING'"
    )
    op.drop_constraint("model_states_state_valid", "model_states", type_="check")
    op.create_check_constraint(
        "model_states_state_valid", "model_states", "state IN ('READY', 'UNAVAILABLE')"
    )
