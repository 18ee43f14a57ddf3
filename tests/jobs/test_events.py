"""The API's job event listener on a real PostgreSQL: bounded by what is watched,
and back (its waiters woken) after its connection was killed."""

from __future__ import annotations

import threading
import time
import uuid

import sqlalchemy as sa

from app.jobs.events import LISTEN, EventBus
from app.platform.database import Database
from tests.conftest import TenantAuth, insert_queued_job
from tests.support import wait_until


def notify(database: Database, payloads: list[str]) -> None:
    with database.engine.begin() as conn:
        conn.execute(
            sa.text("SELECT pg_notify('job_events', p) FROM unnest(CAST(:p AS text[])) AS p"),
            {"p": payloads},
        )


def touch(database: Database, job_id: uuid.UUID) -> None:
    """A change of the job: its trigger sends the NOTIFY."""
    with database.engine.begin() as conn:
        conn.execute(sa.text("UPDATE jobs SET attempts = attempts + 1 WHERE id = :id"),
                     {"id": job_id})  # fmt: skip


def listened(database: Database, name: str) -> bool:
    """Whether the connection called `name` is there and has run its LISTEN."""
    query = "SELECT query FROM pg_stat_activity WHERE application_name = :name"
    with database.engine.connect() as conn:
        return conn.execute(sa.text(query), {"name": name}).scalar() == LISTEN


def test_changes_of_unwatched_jobs_leave_no_trace(database: Database) -> None:
    bus = EventBus(database.engine)
    watched = uuid.uuid4()
    with bus.watching(watched) as watch:
        seen = watch.version()
        for _ in range(5):  # 50,000 other jobs go by, as a busy API sees them
            notify(database, [",".join(str(uuid.uuid4()) for _ in range(200))] * 50)
        notify(database, [str(watched)])
        assert watch.wait(seen, 10) != seen
        assert set(bus._changes) == {str(watched)}
    assert bus._changes == {} and bus._watchers == {}


def test_a_killed_listener_reconnects_and_wakes_its_waiters(
    database: Database, tenant: TenantAuth
) -> None:
    name = f"job-events-test-{uuid.uuid4().hex[:8]}"  # this bus's connection, by name

    def own_listener() -> list[int]:
        with database.engine.connect() as conn:
            query = "SELECT pid FROM pg_stat_activity WHERE application_name = :name"
            return list(conn.execute(sa.text(query), {"name": name}).scalars())

    bus = EventBus(database.engine, application_name=name)
    job_id = insert_queued_job(database, tenant.id)
    with bus.watching(job_id) as watch:
        seen = watch.version()
        [pid] = own_listener()
        with database.engine.connect() as conn:
            conn.execute(sa.text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
        wait_until(lambda: pid not in own_listener(), "the listener gone", 5, 0.01)
        touch(database, job_id)  # while nobody listens: its NOTIFY is lost
        started = time.monotonic()
        woken = watch.wait(seen, 15)
        assert woken != seen, "a change made while the listener was down never woke its waiter"
        assert time.monotonic() - started < 10

        # The reconnect's wake-up follows its LISTEN at once (no I/O between): once the
        # new connection has run LISTEN, a short pause lets that wake-up land, so the
        # next wake-up can only be the next change's.
        wait_until(lambda: listened(database, name), "listening again", 10)
        time.sleep(0.3)
        woken = watch.version()
        changing = threading.Event()
        threading.Timer(0.2, lambda: (changing.set(), touch(database, job_id))).start()
        assert watch.wait(woken, 10) != woken, "the next change did not wake the waiter"
        assert changing.is_set(), "woken before the change was made"


def test_every_database_connection_notices_a_silent_peer(database: Database) -> None:
    # A partition, or a server gone while cut off, must end a call within about 30 s
    # (keepalives, and a timeout on unacknowledged sends), not block it for hours.
    with database.engine.connect() as conn:
        dsn = conn.connection.dbapi_connection.get_dsn_parameters()  # type: ignore[union-attr]
    assert dsn["keepalives"] == "1" and dsn["tcp_user_timeout"] == "15000", dsn
