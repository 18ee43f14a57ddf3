"""The unit of work (app.platform.database) on a real PostgreSQL: an operation's
transaction commits when it ends, leaves nothing when it raises, and a unit opened
inside another joins it; what waits for the commit runs after it, and never after
a rollback. Each test writes tenants of its own names and reads them back over a
connection of its own, as another process would."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from app.platform.database import Database, transactional
from app.platform.settings import Settings


@pytest.fixture
def db(settings: Settings) -> Iterator[Database]:
    database = Database(settings.database_url, pool_size=2)
    yield database
    database.engine.dispose()


def _name() -> str:
    return f"uow-{uuid.uuid4().hex[:12]}"


def _add(session: sa.orm.Session, name: str) -> None:
    session.execute(
        sa.text("INSERT INTO tenants (name, webhook_secret) VALUES (:name, 'whsec_x')"),
        {"name": name},
    )


def _seen(database: Database, name: str) -> bool:
    """Whether another connection sees the tenant: committed, not merely written."""
    with database.engine.connect() as conn:
        found = conn.execute(sa.text("SELECT 1 FROM tenants WHERE name = :n"), {"n": name})
        return found.first() is not None


def test_a_unit_commits_when_it_ends(db: Database) -> None:
    name = _name()
    with db.scope():
        with db.unit_of_work() as session:
            _add(session, name)
            assert not _seen(db, name)
        assert _seen(db, name)


def test_a_unit_that_raises_leaves_nothing_written(db: Database) -> None:
    name = _name()
    with db.scope():
        with pytest.raises(ValueError, match="refused"), db.unit_of_work() as session:
            _add(session, name)
            session.flush()
            raise ValueError("refused")
        assert not _seen(db, name)
        # The scope's session goes on: the next unit writes as usual.
        with db.unit_of_work() as session:
            _add(session, name)
        assert _seen(db, name)


def test_a_nested_unit_joins_the_outer_transaction(db: Database) -> None:
    outer, inner = _name(), _name()
    with db.scope():
        with db.unit_of_work() as session:
            _add(session, outer)
            with db.unit_of_work() as joined:
                assert joined is session
                _add(joined, inner)
            assert not _seen(db, inner), "the inner unit's end commits nothing"
        assert _seen(db, outer) and _seen(db, inner)


def test_an_outer_unit_that_raises_undoes_the_inner_one_too(db: Database) -> None:
    outer, inner = _name(), _name()
    with db.scope():
        with pytest.raises(RuntimeError), db.unit_of_work() as session:
            _add(session, outer)
            with db.unit_of_work() as joined:
                _add(joined, inner)
            raise RuntimeError("after the inner unit ended")
        assert not _seen(db, outer) and not _seen(db, inner)


def test_once_committed_runs_once_the_outermost_unit_committed(db: Database) -> None:
    name, ran = _name(), []
    with db.scope(), db.unit_of_work() as session:
        _add(session, name)
        with db.unit_of_work():
            db.once_committed(lambda: ran.append(("inner", _seen(db, name))))
        db.once_committed(lambda: ran.append(("outer", _seen(db, name))))
        assert ran == []
    assert ran == [("inner", True), ("outer", True)]


def test_once_committed_never_runs_after_a_rollback(db: Database) -> None:
    ran: list[str] = []
    with db.scope():
        with pytest.raises(KeyError), db.unit_of_work():
            db.once_committed(lambda: ran.append("woken"))
            raise KeyError("nothing kept")
        db.once_committed(lambda: ran.append("outside a unit: at once"))
    assert ran == ["outside a unit: at once"]


def test_a_scope_inside_a_unit_has_units_of_its_own(db: Database) -> None:
    """A task run inside another's scope (a test, a CLI command calling a task) does
    not join the caller's transaction: its own unit commits on its own."""
    outer, own = _name(), _name()
    with db.scope(), db.unit_of_work() as session:
        _add(session, outer)
        with db.scope(), db.unit_of_work() as inner:
            assert inner is not session
            _add(inner, own)
        assert _seen(db, own) and not _seen(db, outer)


def test_transactional_runs_a_method_as_one_unit(db: Database) -> None:
    class Operations:
        def __init__(self, database: Database) -> None:
            self.database = database

        @transactional
        def create(self, name: str, *, fail: bool = False) -> str:
            _add(self.database.session(), name)
            if fail:
                raise LookupError(name)
            return name

    ops, kept, lost = Operations(db), _name(), _name()
    with db.scope():
        assert ops.create(kept) == kept
        with pytest.raises(LookupError):
            ops.create(lost, fail=True)
    assert _seen(db, kept) and not _seen(db, lost)


def test_a_separate_unit_commits_apart_from_the_scope(db: Database) -> None:
    in_scope, apart, failed = _name(), _name(), _name()
    with db.scope(), db.unit_of_work() as session:
        _add(session, in_scope)
        with db.separate_unit_of_work() as own:
            assert own is not session
            _add(own, apart)
        assert _seen(db, apart) and not _seen(db, in_scope)
        with pytest.raises(ZeroDivisionError), db.separate_unit_of_work() as own:
            _add(own, failed)
            own.flush()
            _ = 1 / 0
    assert not _seen(db, failed)


def test_end_reads_gives_the_connection_back_and_refuses_inside_a_unit(db: Database) -> None:
    with db.scope() as session:
        session.execute(sa.text("SELECT 1"))
        assert db.engine.pool.checkedout() == 1
        db.end_reads()
        assert db.engine.pool.checkedout() == 0
        assert session.execute(sa.text("SELECT 2")).scalar() == 2, "it reads afresh"
        with pytest.raises(RuntimeError, match="unit of work"), db.unit_of_work():
            db.end_reads()
