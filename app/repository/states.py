"""Model versions' load states, shared through PostgreSQL.

API and worker processes may run on different machines that share only
PostgreSQL and Redis (and the model repository's folder), so whether a version
serves cannot live in one process's memory. `model_states` holds it; each
process's repository polls the newest `updated_at` at most every
MODEL_STATE_CACHE_SECONDS and, when it moved, reads the states again and
rescans its folder, so a change reaches every process within that time.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.engine import Engine
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from app.repository.tables import ModelState

logger = logging.getLogger(__name__)

READY, UNAVAILABLE = "READY", "UNAVAILABLE"
# A version a load is checking (it was not serving, and does not until READY);
# a serving version keeps serving while a load checks it again, as Triton keeps
# a loaded model serving during a reload.
LOADING = "LOADING"


@dataclass(frozen=True)
class State:
    state: str
    reason: str | None = None


def set_states(session: Session, name: str, versions: dict[str, State]) -> None:
    """Record states of `name`'s versions; every process sees them once committed."""
    if not versions:
        return
    rows = [
        {"name": name, "version": v, "state": s.state, "reason": s.reason}
        for v, s in versions.items()
    ]
    statement = insert(ModelState).values(rows)
    statement = statement.on_conflict_do_update(
        index_elements=[ModelState.name, ModelState.version],
        set_={
            "state": statement.excluded.state,
            "reason": statement.excluded.reason,
            "updated_at": sa.func.clock_timestamp(),
        },
    )
    session.execute(statement)


def forget_states(session: Session, name: str, versions: list[str]) -> None:
    """Forget the states of `name`'s versions removed from the repository."""
    if versions:
        session.execute(
            sa.delete(ModelState).where(ModelState.name == name, ModelState.version.in_(versions))
        )


class SharedStates:
    """This process's copy of `model_states`, read again when the table changed."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._states: dict[tuple[str, str], State] = {}
        self._stamp: tuple[datetime | None, int] | None = None
        self._lock = threading.Lock()

    def poll(self) -> bool:
        """True when the states changed since the last poll (one small query;
        the rows are read only then). A database that does not answer keeps the
        last states: serving goes on."""
        with self._lock:
            try:
                with self.engine.connect() as conn:
                    newest, count = conn.execute(
                        sa.select(sa.func.max(ModelState.updated_at), sa.func.count())
                    ).one()
                    if (newest, count) == self._stamp:
                        return False
                    rows = conn.execute(
                        sa.select(
                            ModelState.name, ModelState.version, ModelState.state,
                            ModelState.reason,
                        )
                    ).all()  # fmt: skip
            except SQLAlchemyError as exc:
                logger.warning("could not read model states, keeping the last ones: %s", exc)
                return False
            self._states = {(r.name, r.version): State(r.state, r.reason) for r in rows}
            self._stamp = (newest, int(count))
            return True

    def get(self, name: str, version: str) -> State | None:
        return self._states.get((name, version))
