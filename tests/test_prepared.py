"""Prepared statements (app.platform.database.Prepared) on a real PostgreSQL:
prepared once per connection, right after a rollback and on a connection that
replaced a dropped one, and sent as plain text where they are turned off."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy import event, exc

from app.platform.database import Database, Prepared
from app.platform.settings import Settings

DOUBLE = Prepared(
    "test_double", "SELECT CAST(:x AS integer) * 2 AS twice, :tag AS tag",
    {"x": "integer", "tag": "text"},
)  # fmt: skip
PAIRS = Prepared(
    "test_pairs", "SELECT * FROM unnest(:ids, :names) AS p(id, name) ORDER BY id",
    {"ids": "integer[]", "names": "text[]"},
)  # fmt: skip


def _database(settings: Settings, **options: Any) -> Iterator[tuple[Database, list[str]]]:
    database = Database(settings.database_url, pool_size=1, **options)
    sent: list[str] = []

    def record(_conn: Any, _cursor: Any, sql: str, *_: Any) -> None:
        sent.append(sql.split()[0].upper())

    event.listen(database.engine, "before_cursor_execute", record)
    yield database, sent
    database.engine.dispose()


@pytest.fixture
def one_connection(settings: Settings) -> Iterator[tuple[Database, list[str]]]:
    """A database of one pooled connection, and the first word of each statement sent."""
    yield from _database(settings)


def test_a_statement_is_prepared_once_per_connection_and_gives_the_same_rows(
    one_connection: tuple[Database, list[str]],
) -> None:
    database, sent = one_connection
    for x in (1, 2, 3):
        with database.sessionmaker() as session:
            row = DOUBLE.execute(session, {"x": x, "tag": f"call {x}"}).one()
            assert (row.twice, row.tag) == (2 * x, f"call {x}")
            rows = PAIRS.execute(session, {"ids": [2, 1], "names": ["b", None]}).all()
            assert [(r.id, r.name) for r in rows] == [(1, None), (2, "b")]
            session.commit()
    assert sent.count("PREPARE") == 2, sent
    assert sent.count("EXECUTE") == 6, sent


def test_a_rolled_back_transaction_keeps_the_statement_prepared(
    one_connection: tuple[Database, list[str]],
) -> None:
    """PREPARE is not undone by a rollback, so the connection's record that it was
    made stays true: the next call does not prepare it again (which would fail)."""
    database, sent = one_connection
    with database.sessionmaker() as session:
        DOUBLE.execute(session, {"x": 1, "tag": "a"})
        with pytest.raises(exc.DataError):
            DOUBLE.execute(session, {"x": "not a number", "tag": "b"})
        session.rollback()
        assert DOUBLE.execute(session, {"x": 4, "tag": "c"}).one().twice == 8
    assert sent.count("PREPARE") == 1, sent


def test_a_connection_that_replaced_a_dropped_one_prepares_again(
    one_connection: tuple[Database, list[str]], database: Database
) -> None:
    """The server ended the connection (a restart, a failover): the pool's new one
    has no prepared statements, and its call prepares it there instead of failing
    with 'prepared statement does not exist'."""
    ours, sent = one_connection
    with ours.sessionmaker() as session:
        DOUBLE.execute(session, {"x": 1, "tag": "a"})
        pid = session.scalar(sa.text("SELECT pg_backend_pid()"))
        session.commit()
    with database.engine.begin() as admin:
        admin.execute(sa.text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
    with ours.sessionmaker() as session, pytest.raises(exc.OperationalError):
        DOUBLE.execute(session, {"x": 2, "tag": "b"})  # the dead connection, found out
    with ours.sessionmaker() as session:
        assert DOUBLE.execute(session, {"x": 3, "tag": "c"}).one().twice == 6
        assert session.scalar(sa.text("SELECT pg_backend_pid()")) != pid
    assert sent.count("PREPARE") == 2, sent


def test_turned_off_the_statement_is_sent_as_text_with_the_same_rows(settings: Settings) -> None:
    for database, sent in _database(settings, prepared_statements=False):
        with database.sessionmaker() as session:
            assert DOUBLE.execute(session, {"x": 5, "tag": "t"}).one().twice == 10
            rows = PAIRS.execute(session, {"ids": [2, 1], "names": ["b", "a"]}).all()
            assert [(r.id, r.name) for r in rows] == [(1, "a"), (2, "b")]
            names = session.scalars(sa.text("SELECT name FROM pg_prepared_statements")).all()
        assert names == [], names
        assert "PREPARE" not in sent and "EXECUTE" not in sent, sent


def test_a_parameter_without_a_type_is_refused_when_the_statement_is_made() -> None:
    with pytest.raises(ValueError, match=r"test_bad: no type for \['y'\]"):
        Prepared("test_bad", "SELECT :x + :y", {"x": "integer"})
