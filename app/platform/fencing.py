"""The control plane's lease: one beat sends the sweeps, the others stand by, and
a holder that lost the lease cannot write.

Every beat process (one per control host) keeps trying for one row of
`control_leases`, named by the control queue it sends to; the one whose holder
it names, until `expires_at`, sends the sweeps, each message carrying the
lease's token. The token grows every time the lease changes hands (or lapses),
so it names one term of one holder. The time is
PostgreSQL's own `now()`, never a host's clock: hosts whose clocks disagree still
agree on who holds it.

Fencing: a sweep runs its units of work under `Database.fenced(token)`, and each
unit first reads the lease row `FOR SHARE` where the token is still current and
unexpired; none, and the unit raises `Fenced` before it writes anything. The
share lock holds a taking-over beat's UPDATE back until the unit commits, so a
superseded holder's write is either before the new term or refused. A holder
frozen mid-unit (a host paused, a long GC) would hold that lock: the unit's
`idle_in_transaction_session_timeout` lets PostgreSQL end it after one lease,
and its `lock_timeout` ends a wait for another lock (a row a partitioned host
holds) after one lease too. The same goes for a beat frozen between its renewal
and its commit, which holds the row's update lock: its transaction has the same
timeout.
"""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid
from datetime import datetime

from sqlalchemy import BigInteger, DateTime, String, text
from sqlalchemy.engine import Engine
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Mapped, Session, mapped_column

from app.platform.orm import Base

logger = logging.getLogger(__name__)


class ControlLease(Base):
    """Who sends the control plane's sweeps, until when, in which term (`token`)."""

    __tablename__ = "control_leases"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    holder: Mapped[str] = mapped_column(String(200))
    token: Mapped[int] = mapped_column(BigInteger)
    expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class Fenced(Exception):
    """This unit of work's lease term is over: another holder took it, or it lapsed."""


# Taken when free or lapsed (a new term: the token grows), renewed by its holder
# (the same term). Nothing comes back when another holder's lease runs.
_KEEP = text(
    "INSERT INTO control_leases AS l (name, holder, token, expires_at) "
    "VALUES (:name, :holder, 1, now() + make_interval(secs => :ttl)) "
    "ON CONFLICT (name) DO UPDATE SET holder = EXCLUDED.holder, expires_at = EXCLUDED.expires_at, "
    "token = l.token + CASE WHEN l.holder = EXCLUDED.holder AND l.expires_at > now() "
    "THEN 0 ELSE 1 END "
    "WHERE l.holder = EXCLUDED.holder OR l.expires_at <= now() "
    "RETURNING l.token"
)
_RELEASE = text(
    "UPDATE control_leases SET expires_at = now() WHERE name = :name AND holder = :holder"
)
_CHECK = text(
    "SELECT 1 FROM control_leases WHERE name = :name AND token = :token "
    "AND expires_at > now() FOR SHARE"
)


def _idle_ms(ttl_s: float) -> int:
    """How long a transaction that locks the lease row may sit idle (its process
    frozen) before PostgreSQL ends it: one lease, at least a second."""
    return max(1000, int(ttl_s * 1000))


def holder_name() -> str:
    """Unique per process, and readable: hosts in network namespaces share a hostname."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


class Lease:
    """One process's side of a lease: `keep()` each tick, `held()` before acting."""

    def __init__(self, engine: Engine, name: str, ttl_s: float) -> None:
        self.engine, self.ttl_s, self.name = engine, ttl_s, name
        self.holder = holder_name()
        self.token: int | None = None
        self._until = 0.0  # this process's own clock: when its lease surely ended

    def held(self) -> int | None:
        """The token while the lease surely runs: a process frozen past its lease
        (stopped between a renewal and a send) finds it over when it thaws."""
        return self.token if time.monotonic() < self._until else None

    def keep(self) -> int | None:
        """Take or renew the lease; its token while this process holds it, else None.
        A wait on a unit of the old term (its share lock) gives up after a second:
        the next tick tries again."""
        params = {"name": self.name, "holder": self.holder, "ttl": self.ttl_s}
        asked = time.monotonic()  # the lease runs from no earlier than this
        try:
            with self.engine.begin() as conn:
                conn.exec_driver_sql(
                    f"SET LOCAL lock_timeout = '1s'; "
                    f"SET LOCAL idle_in_transaction_session_timeout = {_idle_ms(self.ttl_s)}"
                )
                token = conn.execute(_KEEP, params).scalar()
        except DBAPIError as exc:  # the database away, or the lock not granted in time
            logger.warning("control lease: could not keep it (%s)", type(exc.orig).__name__)
            token = None
        if token != self.token:
            state = f"holds it, term {token}" if token else "stands by"
            logger.info("control lease: %s %s", self.holder, state)
        self.token, self._until = token, asked + self.ttl_s
        return token

    def release(self) -> None:
        """On a clean stop: a standby takes over at its next tick, not after the TTL."""
        if self.token is None:
            return
        try:
            with self.engine.begin() as conn:
                idle = _idle_ms(self.ttl_s)
                conn.exec_driver_sql(f"SET LOCAL idle_in_transaction_session_timeout = {idle}")
                conn.execute(_RELEASE, {"name": self.name, "holder": self.holder})
        except DBAPIError:
            logger.warning("control lease: could not release it; it lapses by itself")
        self.token = None


def check(session: Session, name: str, token: int, ttl_s: float) -> None:
    """The fence, first in a unit of work: raises Fenced unless `token`'s term is current."""
    # A unit frozen between statements is ended after one lease; one waiting for a
    # lock gives up after one lease: either would otherwise hold the lease row's
    # share lock, and every beat's renewal with it, for as long as it stays.
    bound = _idle_ms(ttl_s)
    session.execute(  # (one round trip for both)
        text(f"SET LOCAL idle_in_transaction_session_timeout = {bound}; "
             f"SET LOCAL lock_timeout = {bound}")
    )  # fmt: skip
    if session.execute(_CHECK, {"name": name, "token": token}).first() is None:
        raise Fenced(f"lease term {token} of {name!r} is over")
