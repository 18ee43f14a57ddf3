"""Engine, sessions and the unit of work.

One engine per process. Forked children (Celery prefork, the API server's workers) call
`Database.after_fork()` so they never share the parent's sockets.

Two lifetimes, kept apart:
- a *scope* (an HTTP request, a Celery task, a CLI command, a gRPC call) owns one
  session, made on first use by `session()` and closed when the scope ends, so the
  doors and the operations share it without passing it around;
- a *unit of work* (`unit_of_work()`, or `@transactional` on an operation's method)
  is one transaction on that session: it commits when it ends, rolls back when it
  raises, and a unit opened inside another joins it. It is the only place that
  commits or rolls back: helpers below the operations flush, never commit.
Read-only operations open no unit: they read in the scope's transaction, which ends
with the scope (or with `end_reads()`, before a wait).
"""

from __future__ import annotations

import functools
import re
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Concatenate, ParamSpec, Protocol, TypeVar

from sqlalchemy import Connection, Engine, Result, TextClause, create_engine, event, exc, text
from sqlalchemy.orm import Session, sessionmaker

from app.platform import fencing

# A connection that sat unused this long is pinged before use: PostgreSQL may
# have restarted meanwhile. Busy connections are not, which saves a round trip
# per request (SQLAlchemy's pool_pre_ping pings every checkout).
PING_AFTER_IDLE_S = 5.0


def engine_url(url: str) -> str:
    """Pin the psycopg2 driver: SQLAlchemy 2.1 maps a bare postgresql:// to psycopg 3."""
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg2://" + url[len(prefix) :]
    return url


# libpq settings of every connection (ignored on Unix sockets, which cannot go
# silent): a peer that stops answering (a partition, a server gone while cut off)
# is an error within about 30 s, not a call blocked until the OS gives up (hours).
TCP_CHECKS = {"keepalives": 1, "keepalives_idle": 10, "keepalives_interval": 5,
              "keepalives_count": 3, "tcp_user_timeout": 15_000}  # fmt: skip


class Database:
    def __init__(self, url: str, pool_size: int = 5, *, prepared_statements: bool = True) -> None:
        self.engine: Engine = create_engine(
            engine_url(url),
            pool_size=pool_size,
            max_overflow=10,
            connect_args=dict(TCP_CHECKS),
        )
        event.listen(self.engine, "checkout", _ping_if_idle)
        event.listen(self.engine, "checkin", _note_last_use)
        if not prepared_statements:  # behind a pooler that hands out other sessions
            self.engine.update_execution_options(**{_NO_PREPARE: True})
        self.sessionmaker = sessionmaker(self.engine, expire_on_commit=False)
        self._scoped: ContextVar[Session | None] = ContextVar(f"session-{id(self)}", default=None)
        self._unit: ContextVar[_Unit | None] = ContextVar(f"unit-{id(self)}", default=None)
        self._fence: ContextVar[tuple[str, int, float] | None] = ContextVar(
            f"fence-{id(self)}", default=None
        )

    def session(self) -> Session:
        """The current scope's session, made on first use."""
        session = self._scoped.get()
        if session is None:
            session = self.sessionmaker()
            self._scoped.set(session)
        return session

    def end_scope(self) -> None:
        """Close the current scope's session, if it made one (a request's teardown;
        a task's end): what no unit of work committed is not kept."""
        session = self._scoped.get()
        if session is not None:
            self._scoped.set(None)
            session.close()

    @contextmanager
    def scope(self) -> Iterator[Session]:
        """A scope for code outside a request (tasks, the CLI, a gRPC call): its
        session, closed when it ends (what was not committed is not kept)."""
        outer, outer_unit = self._scoped.get(), self._unit.get()
        self._scoped.set(None)
        self._unit.set(None)
        try:
            yield self.session()
        finally:
            self.end_scope()
            self._scoped.set(outer)
            self._unit.set(outer_unit)

    def unit_of_work(self) -> UnitOfWork:
        """One transaction on the scope's session: committed when it ends, rolled back
        (and the error raised on) when it raises. A unit opened inside another joins
        it: its writes are committed, or rolled back, with the outer one's; an error
        the outer unit catches does not undo what the inner one wrote before it.
        Functions given to `once_committed` run once the outermost unit committed."""
        return UnitOfWork(self)

    @contextmanager
    def fenced(self, lease: str, token: int | None, ttl_s: float) -> Iterator[None]:
        """Units of work opened inside check first that the term `token` of the lease
        named `lease` is current, and raise app.platform.fencing.Fenced before
        writing when it is not (see that module). None: not fenced (sent by hand)."""
        reset = self._fence.set(None if token is None else (lease, token, ttl_s))
        try:
            yield
        finally:
            self._fence.reset(reset)

    def separate_unit_of_work(self) -> AbstractContextManager[Session]:
        """A unit of work on a session of its own, beside the scope's: for a thread
        that writes for many scopes (the job writer's group commit, the lease
        keeper). Committed when it ends, rolled back when it raises; closed either way."""
        return self.sessionmaker.begin()

    def separate_core_unit_of_work(self) -> AbstractContextManager[Connection]:
        """`separate_unit_of_work` on a bare connection, for a writer that needs no ORM
        and runs once per request (the job writer's group commit): a session's
        bookkeeping cost it a tenth of a millisecond a batch."""
        return self.engine.begin()

    def once_committed(self, action: Callable[[], object]) -> None:
        """Run `action` once the current unit of work has committed (a wake-up for
        the workers: they must find the rows); never if it rolls back. Outside a
        unit it runs now."""
        unit = self._unit.get()
        if unit is None:
            action()
        else:
            unit.actions.append(action)

    def end_reads(self) -> None:
        """End the scope's read-only transaction and give its connection back (before
        a wait, so a waiting request holds none); the session reads afresh next time.
        Inside a unit of work it would end the unit's writes too: refused."""
        if self._unit.get() is not None:
            raise RuntimeError("end_reads() inside a unit of work: its writes would be lost")
        session = self._scoped.get()
        if session is not None:
            session.close()

    def after_fork(self) -> None:
        # Drop inherited connections without closing the parent's sockets.
        self.engine.dispose(close=False)

    def ping(self) -> None:
        with self.engine.connect() as conn:
            conn.execute(text("SELECT 1"))


@dataclass
class _Unit:
    """The outermost unit of work of a scope, and what runs once it committed."""

    actions: list[Callable[[], object]] = field(default_factory=list)


class UnitOfWork:
    """`Database.unit_of_work()`: a plain context manager, not a generator one, since
    every claim and finish of a worker opens one (a generator's setup cost the
    worker about 1% of its CPU)."""

    __slots__ = ("_database", "_session", "_token", "_unit")

    def __init__(self, database: Database) -> None:
        self._database = database
        self._unit: _Unit | None = None

    def __enter__(self) -> Session:
        database = self._database
        self._session = database.session()
        if database._unit.get() is None:  # the outermost: this unit ends the transaction
            self._unit = _Unit()
            self._token = database._unit.set(self._unit)
            if (fence := database._fence.get()) is not None:
                self._check(*fence)
        return self._session

    def _check(self, lease: str, token: int, ttl_s: float) -> None:
        try:
            fencing.check(self._session, lease, token, ttl_s)
        except BaseException:
            self._session.rollback()
            self._database._unit.reset(self._token)
            raise

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        unit = self._unit
        if unit is None:  # joined an outer unit: it commits or rolls back
            return
        try:
            if kind is None:
                self._session.commit()
            else:
                self._session.rollback()
        except BaseException:
            self._session.rollback()
            raise
        finally:
            self._database._unit.reset(self._token)
        if kind is None:
            for action in unit.actions:
                action()


class _HasDatabase(Protocol):
    database: Database


P = ParamSpec("P")
R = TypeVar("R")
S = TypeVar("S", bound=_HasDatabase)


def transactional(method: Callable[Concatenate[S, P], R]) -> Callable[Concatenate[S, P], R]:
    """Run an operation's method as one unit of work of its object's `database`:
    the usual way an operation owns its transaction (`Database.unit_of_work`)."""

    @functools.wraps(method)
    def run(self: S, /, *args: P.args, **kwargs: P.kwargs) -> R:
        with self.database.unit_of_work():
            return method(self, *args, **kwargs)

    return run


_NO_PREPARE = "no_prepared_statements"
_BIND = re.compile(r"(?<![:\w]):(\w+)")


class Prepared:
    """A hot statement PostgreSQL plans once per connection, not at every call.

    psycopg2 sends every statement as text, and PostgreSQL plans each one again:
    for the claim statement (a recursive CTE) planning cost more than running it,
    0.7 ms a call. So the statement is PREPAREd once on each connection (a
    connection's `info`, which SQLAlchemy clears with the connection, says
    which are) and then EXECUTEd; after five calls PostgreSQL keeps a generic
    plan when it is no worse than the custom ones. A prepared statement outlives
    a rolled-back transaction, so what `info` says stays true. Behind a pooler
    that gives each transaction another server session (PgBouncer's transaction
    mode) set DB_PREPARED_STATEMENTS=false: the same statement is then sent as text.

    `sql` names its parameters `:name`; `types` gives each one's SQL type, in the
    order of the PREPARE.
    """

    def __init__(self, name: str, sql: str, types: Mapping[str, str]) -> None:
        order = {param: i for i, param in enumerate(types, start=1)}
        if missing := set(_BIND.findall(sql)) - set(order):
            raise ValueError(f"{name}: no type for {sorted(missing)}")
        self.name = name
        self.text = text(_BIND.sub(lambda m: f"CAST(:{m.group(1)} AS {types[m.group(1)]})", sql))
        signature = ", ".join(types.values())
        body = _BIND.sub(lambda m: f"${order[m.group(1)]}", sql)
        self.prepare = f"PREPARE {name} ({signature}) AS {body}"
        self.execute_clause: TextClause = text(
            f"EXECUTE {name} ("
            + ", ".join(f"CAST(:{param} AS {kind})" for param, kind in types.items())
            + ")"
        )

    def execute(self, session: Session, params: Mapping[str, Any]) -> Result[Any]:
        connection = session.connection()
        if connection.get_execution_options().get(_NO_PREPARE):
            return session.execute(self.text, params)
        prepared: set[str] = connection.connection.info.setdefault("prepared", set())
        if self.name not in prepared:
            connection.exec_driver_sql(self.prepare, execution_options={"no_parameters": True})
            prepared.add(self.name)
        return session.execute(self.execute_clause, params)


def flush_unique(session: Session, refusal: Callable[[], Exception]) -> None:
    """Write the session's pending changes now: when they break a unique
    constraint, `refusal()` is raised instead (a domain error naming what is
    taken). It is built first: a failed flush leaves the objects it would name
    unreadable. `begin_nested()` flushes what is pending before its SAVEPOINT,
    so a change that breaks the constraint fails outside the savepoint; the
    session is then rolled back (its transaction could not go on), else the
    caller's transaction goes on."""
    refused = refusal()
    try:
        with session.begin_nested():
            session.flush()
    except exc.IntegrityError:
        if not session.is_active:
            session.rollback()
        raise refused from None


def database_unavailable(error: BaseException) -> bool:
    """The database did not answer or dropped the connection (a restart, a failover):
    worth a 503 or a retry, unlike an error in the statement itself. A dropped
    connection can surface as psycopg2's DatabaseError, which SQLAlchemy flags."""
    return isinstance(error, exc.OperationalError | exc.InterfaceError) or (
        isinstance(error, exc.DBAPIError) and error.connection_invalidated
    )


def database_disk_full(error: BaseException) -> bool:
    """PostgreSQL is out of disk space (SQLSTATE 53100: a file it could not extend).
    An OperationalError, so a 503 or a retry like an outage; worth naming, since
    only more space ends it."""
    return getattr(getattr(error, "orig", None), "pgcode", None) == "53100"


def _note_last_use(_dbapi_conn: Any, record: Any) -> None:
    record.info["last_use"] = time.monotonic()


def _ping_if_idle(dbapi_conn: Any, record: Any, _proxy: Any) -> None:
    if time.monotonic() - record.info.get("last_use", 0.0) < PING_AFTER_IDLE_S:
        return
    try:
        with dbapi_conn.cursor() as cursor:
            cursor.execute("SELECT 1")
        dbapi_conn.rollback()  # leave no transaction open (now() would be the ping's)
    except Exception as error:  # any failure: the pool replaces the connection
        raise exc.DisconnectionError() from error
