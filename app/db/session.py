"""Engine and sessions.

One engine per process. Forked children (Celery prefork, gunicorn) call
`Database.after_fork()` so they never share the parent's sockets. A request or
a task gets one session, bound to the Flask app context and closed when the
context ends; services own their transactions (they commit), callers never do.
"""

from __future__ import annotations

from sqlalchemy import Engine, create_engine, text
from sqlalchemy.orm import Session, sessionmaker


def engine_url(url: str) -> str:
    """Pin the psycopg2 driver: SQLAlchemy 2.1 maps a bare postgresql:// to psycopg 3."""
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg2://" + url[len(prefix) :]
    return url


class Database:
    def __init__(self, url: str, pool_size: int = 5) -> None:
        self.engine: Engine = create_engine(
            engine_url(url),
            pool_pre_ping=True,
            pool_size=pool_size,
            max_overflow=10,
        )
        self.sessionmaker = sessionmaker(self.engine, expire_on_commit=False)

    def after_fork(self) -> None:
        # Drop inherited connections without closing the parent's sockets.
        self.engine.dispose(close=False)

    def ping(self) -> None:
        with self.engine.connect() as conn:
            conn.execute(text("SELECT 1"))


def current_session() -> Session:
    """The session of the current app context (request or task), created on first use."""
    from flask import current_app, g

    session: Session | None = g.get("_db_session")
    if session is None:
        database: Database = current_app.extensions["database"]
        session = database.sessionmaker()
        g._db_session = session
    return session


def close_session(_exc: BaseException | None = None) -> None:
    from flask import g

    session: Session | None = g.pop("_db_session", None)
    if session is not None:
        session.close()
