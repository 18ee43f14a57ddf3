"""The model versions' load states, shared by every process."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import (
    CheckConstraint,
    DateTime,
    Index,
    String,
    Text,
    func,
)
from sqlalchemy.orm import Mapped, mapped_column

from app.platform.orm import Base

MODEL_STATES = ("READY", "UNAVAILABLE", "LOADING")


class ModelState(Base):
    """A model version's load state, shared by every API and worker process (which
    may run on other machines): a version with no row serves if its files are in
    the repository; UNAVAILABLE (unloaded, or failed its check) does not, nor does
    LOADING (a load is checking it; app.operations.models).
    Processes notice changes by the newest `updated_at` (app.repository.states)."""

    __tablename__ = "model_states"
    __table_args__ = (
        CheckConstraint(
            "state IN (" + ", ".join(f"'{s}'" for s in MODEL_STATES) + ")",
            name="model_states_state_valid",
        ),
        Index("ix_model_states_updated", "updated_at"),
    )

    name: Mapped[str] = mapped_column(String(100), primary_key=True)
    version: Mapped[str] = mapped_column(String(50), primary_key=True)
    state: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str | None] = mapped_column(Text)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
