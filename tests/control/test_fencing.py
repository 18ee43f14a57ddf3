"""The control lease and its fence (app.platform.fencing) on real PostgreSQL, and
two real beats of which one sends: the other takes over when the holder dies or
is frozen, and a thawed holder sends nothing and writes nothing."""

from __future__ import annotations

import base64
import json
import os
import signal
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import sqlalchemy as sa

from app.platform.database import Database
from app.platform.fencing import Fenced, Lease
from app.platform.settings import Settings
from tests.conftest import BeatProcess
from tests.control.conftest import plane_env
from tests.support import wait_until

TTL_S = 1.0


def lease_name() -> str:
    return f"test-lease-{uuid.uuid4().hex[:8]}"


def note(database: Database, text: str) -> None:
    """A write of a sweep's: a row in a table of the test's own."""
    with database.unit_of_work() as session:
        session.execute(sa.text("INSERT INTO fence_notes (text) VALUES (:t)"), {"t": text})


@pytest.fixture
def notes(database: Database) -> Iterator[None]:
    with database.engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE IF NOT EXISTS fence_notes (text text)"))
        conn.execute(sa.text("DELETE FROM fence_notes"))
    yield
    with database.engine.begin() as conn:
        conn.execute(sa.text("DROP TABLE fence_notes"))


def written(database: Database) -> list[str]:
    with database.engine.connect() as conn:
        return list(conn.execute(sa.text("SELECT text FROM fence_notes ORDER BY text")).scalars())


def taken_over_after(standby: Lease) -> float:
    """Seconds until `standby` holds the lease, trying every 0.2 s (20 s at most)."""
    started = time.monotonic()
    wait_until(lambda: standby.keep() is not None, "the standby to take over", 20, interval=0.2)
    return time.monotonic() - started


def test_one_holder_at_a_time_and_a_new_term_when_it_lapses(database: Database) -> None:
    name = lease_name()
    first, second = Lease(database.engine, name, TTL_S), Lease(database.engine, name, TTL_S)
    term = first.keep()
    assert term is not None
    assert second.keep() is None, "two holders at once"
    assert first.keep() == term, "a renewal began a new term"
    time.sleep(TTL_S + 0.3)  # the holder stops renewing: its lease lapses
    taken = second.keep()
    assert taken is not None and taken > term
    assert first.keep() is None, "the old holder took it back from the new one"
    second.release()
    assert (again := first.keep()) is not None and again > taken, "a release did not free it"


@pytest.mark.usefixtures("notes")
def test_a_unit_of_an_ended_term_writes_nothing(database: Database) -> None:
    name = lease_name()
    old, new = Lease(database.engine, name, TTL_S), Lease(database.engine, name, TTL_S)
    stale = old.keep()
    with database.fenced(name, stale, TTL_S):
        note(database, "in term")
    time.sleep(TTL_S + 0.3)
    current = new.keep()
    with database.scope(), database.fenced(name, stale, TTL_S), pytest.raises(Fenced):
        note(database, "after the term")
    with database.scope(), database.fenced(name, current, TTL_S):
        note(database, "new term")
    with database.scope(), database.fenced(name, None, TTL_S):
        note(database, "unfenced")  # a sweep sent by hand, or by a beat of before the lease
    assert written(database) == ["in term", "new term", "unfenced"]


def test_a_takeover_waits_for_the_old_terms_unit_to_end(database: Database) -> None:
    """The fence's share lock orders terms: the new holder's term begins after the
    old holder's last unit committed, never while it runs, even once it lapsed."""
    name = lease_name()
    old, new = Lease(database.engine, name, TTL_S), Lease(database.engine, name, TTL_S)
    term = old.keep()
    with database.scope(), database.fenced(name, term, 30.0), database.unit_of_work():
        time.sleep(TTL_S + 0.3)  # the lease lapses while the unit runs
        assert new.keep() is None, "the lease changed hands under a running unit"
    assert (taken := new.keep()) is not None and taken > (term or 0), "not taken after the unit"


def test_a_frozen_holders_open_unit_is_ended_by_postgresql(database: Database) -> None:
    """A holder frozen inside a unit would hold the lease row's share lock forever:
    the unit's idle timeout (one lease) lets PostgreSQL end it, and the standby takes over."""
    name = lease_name()
    frozen, standby = Lease(database.engine, name, TTL_S), Lease(database.engine, name, TTL_S)
    term = frozen.keep()
    entered, thawed = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def holder() -> None:
        try:
            with (
                database.scope(),
                database.fenced(name, term, TTL_S),
                database.unit_of_work() as session,
            ):
                entered.set()
                thawed.wait(30)  # frozen, its transaction open and idle
                session.execute(sa.text("SELECT 1"))
        except BaseException as exc:  # what the thawed holder saw
            errors.append(exc)

    thread = threading.Thread(target=holder)
    thread.start()
    assert entered.wait(10)
    taken_after = taken_over_after(standby)
    thawed.set()
    thread.join(10)
    assert errors and isinstance(errors[0], sa.exc.DBAPIError), errors  # its session was ended
    print(f"standby took the lease {taken_after:.1f}s after the holder froze in a unit")
    assert taken_after < 6 * TTL_S + 2  # a liveness bound, not a speed


def test_a_holder_frozen_between_its_renewal_and_its_commit_is_ended_by_postgresql(
    database: Database,
) -> None:
    """The renewal's UPDATE locks the lease row until its commit: a beat frozen
    between the two would keep every standby out for as long as it stays frozen
    (a fleet run saw 80 s, until PostgreSQL restarted). Its transaction's idle
    timeout (one lease) ends it, and the standby takes over."""
    name = lease_name()
    engine = sa.create_engine(database.engine.url)
    frozen, standby = Lease(engine, name, TTL_S), Lease(database.engine, name, TTL_S)
    assert frozen.keep() is not None
    renewed, thawed = threading.Event(), threading.Event()

    @sa.event.listens_for(engine, "after_cursor_execute")
    def freeze(conn, cursor, statement, parameters, context, executemany):  # type: ignore[no-untyped-def]
        if "INSERT INTO control_leases" in statement and not renewed.is_set():
            renewed.set()
            thawed.wait(30)  # frozen: the row locked, the commit not sent

    tokens: list[int | None] = []
    thread = threading.Thread(target=lambda: tokens.append(frozen.keep()))
    thread.start()
    try:
        assert renewed.wait(10)
        taken_after = taken_over_after(standby)
    finally:
        thawed.set()
        thread.join(10)
        engine.dispose()
    assert tokens == [None], tokens  # the thawed renewal found its session ended
    print(f"standby took the lease {taken_after:.1f}s after the holder froze in a renewal")
    assert taken_after < 6 * TTL_S + 2  # a liveness bound, not a speed


def test_a_unit_waiting_for_a_lock_lets_the_lease_change_hands(
    database: Database, notes: None
) -> None:
    """A fenced unit waiting for a row another host holds (a host cut off from the
    database mid-transaction) holds the lease row's share lock while it waits, and
    no idle timeout applies to a wait: its lock timeout (one lease) ends it, so
    neither beat's renewal is held back for as long as the other host stays away."""
    name = lease_name()
    holder, standby = Lease(database.engine, name, TTL_S), Lease(database.engine, name, TTL_S)
    term = holder.keep()
    note(database, "row")
    errors: list[BaseException] = []

    def sweep() -> None:
        try:
            with (
                database.scope(),
                database.fenced(name, term, TTL_S),
                database.unit_of_work() as session,
            ):
                session.execute(sa.text("UPDATE fence_notes SET text = 'swept'"))
        except BaseException as exc:
            errors.append(exc)

    with database.engine.connect() as away:  # the other host's open transaction
        away.execute(sa.text("UPDATE fence_notes SET text = 'held'"))
        thread = threading.Thread(target=sweep)
        thread.start()
        taken_after = taken_over_after(standby)
        thread.join(10)
        away.rollback()
    assert errors and isinstance(errors[0], sa.exc.DBAPIError), errors  # the wait gave up
    assert written(database) == ["row"]
    print(f"standby took the lease {taken_after:.1f}s after a unit began waiting for a lock")
    assert taken_after < 6 * TTL_S + 2  # a liveness bound, not a speed


def control_messages(client: redis.Redis, queue: str) -> list[tuple[str, int | None]]:
    """(task, fence) of each message waiting on the control queue."""
    found = []
    for raw in client.lrange(queue, 0, -1):
        message = json.loads(raw)
        body = json.loads(base64.b64decode(message["body"]))
        found.append((message["headers"]["task"], body[1].get("fence")))
    return found


@pytest.mark.processes
def test_two_beats_one_sends_and_the_other_takes_over(
    plane: Settings, settings: Settings, database: Database, tmp_path: Path
) -> None:
    """No control worker: each beat's messages stay on the queue, where their fence
    (the term they were sent in) says which beat sent them."""
    env = {**plane_env(plane), "CONTROL_LEASE_SECONDS": "2"}
    client = redis.Redis.from_url(settings.redis_url)
    beats = [BeatProcess(plane, tmp_path, name=f"beat{i}", **env) for i in (1, 2)]
    try:

        def holder_term() -> int | None:
            with database.engine.connect() as conn:
                row = conn.execute(
                    sa.text("SELECT token FROM control_leases "
                            "WHERE name = :n AND expires_at > now()"),
                    {"n": plane.control_queue},
                ).first()  # fmt: skip
            return None if row is None else int(row[0])

        def sent() -> list[tuple[str, int | None]]:
            return control_messages(client, plane.control_queue)

        wait_until(sent, "a sweep sent", 60)
        first = holder_term()
        assert first is not None
        fences = {fence for _, fence in sent()}
        assert fences == {first}, f"sweeps sent in other terms than the holder's: {fences}"
        says = f"holds it, term {first}".encode()
        holding = next(b for b in beats if says in b.log_path.read_bytes())
        other = beats[1 - beats.index(holding)]
        os.kill(holding.proc.pid, signal.SIGSTOP)  # frozen: it neither renews nor releases
        frozen_at = time.monotonic()
        old = Counter(sent())  # its messages stay unconsumed, their pending flags set
        wait_until(lambda: (holder_term() or first) > first, "a takeover", 30, interval=0.1)
        taken_after = time.monotonic() - frozen_at
        second = holder_term()

        def new_terms() -> list[tuple[str, int | None]]:
            return [message for message in sent() if message[1] == second]

        # The old term's flags do not hold the new holder back (one flag per term).
        wait_until(lambda: len(new_terms()) >= 3, "every sweep sent by the new holder", 10)
        os.kill(holding.proc.pid, signal.SIGCONT)  # thawed: it must see it lost the lease
        time.sleep(3)
        after = Counter(sent())
        print(f"took over {taken_after:.1f}s after the holder froze (lease 2 s); sent: {after}")
        assert {fence for _, fence in after} == {first, second}, after
        assert {m: n for m, n in after.items() if m[1] == first} == old, "sent in its old term"
        assert b"stands by" in holding.log_path.read_bytes() or holder_term() == second
        assert b"holds it" in other.log_path.read_bytes()
        assert taken_after < 2 * 5.0, "not within two ticks (SWEEP_INTERVAL_SECONDS 5 by default)"
    finally:
        for beat in beats:
            os.kill(beat.proc.pid, signal.SIGCONT)
            beat.stop()
        client.delete(plane.control_queue)
