"""Fault scenarios 15 and 16: one worker cut off from PostgreSQL, or from Redis,
for longer than the lease, then healed.

The cut worker reaches that server through a proxy on loopback that the test
controls (tests.faults.proxy): a cut drops nothing and resets nothing, it stops
forwarding, as a partition does. The API, beat, the control worker (the sweeps)
and a second worker talk to the servers directly, so the sweep takes back the
jobs whose lease ran out and the second worker runs them again while the first
is cut off. When the link heals, the cut worker's writes for those jobs arrive
late, from an attempt that no longer owns them: the `finish` guard must refuse
them. With it off they land on results already written.

A late write of the same job's result is a result written over a result even
where its bytes are the same (the `slow` model's are): the job's finish is
recorded twice and the late attempt's compute time is added to its usage. The
suite's trigger logs only changes of status, attempt or output, so these
scenarios also log every write that finishes a job (`finish_log`) and count
finishes beyond one per job as duplicate results.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
import sqlalchemy as sa

from tests.faults.harness import FaultStack, Tally
from tests.faults.proxy import Proxy
from tests.faults.scenarios import GUARD, check, slow

pytestmark = [pytest.mark.faults, pytest.mark.processes]

PARTITION_S = 6.0  # four leases of 1.5 s
JOBS, JOB_S = 12, 0.5
AFTER = 4  # run by the cut worker alone, once healed
REFUSED = b"not written (the job moved on)"  # the runner's line for a refused finish

FINISH_LOG = """
CREATE TABLE finish_log (
    id bigserial PRIMARY KEY, job_id uuid, status text, attempts int,
    at timestamptz DEFAULT clock_timestamp()
);
CREATE FUNCTION log_finish() RETURNS trigger AS $$ BEGIN
    INSERT INTO finish_log (job_id, status, attempts) VALUES (NEW.id, NEW.status, NEW.attempts);
    RETURN NEW;
END $$ LANGUAGE plpgsql;
CREATE TRIGGER jobs_finish_log AFTER UPDATE ON jobs FOR EACH ROW
    WHEN (NEW.status IN ('succeeded', 'failed', 'cancelled', 'expired')
          AND NEW.finished_at IS DISTINCT FROM OLD.finished_at)
    EXECUTE FUNCTION log_finish();
"""


@pytest.fixture
def make_proxy() -> Iterator[Callable[[Path], Proxy]]:
    """`make_proxy(upstream)`: a proxy on loopback, closed after the test."""
    proxies: list[Proxy] = []

    def make(upstream: Path) -> Proxy:
        proxies.append(Proxy(upstream))
        return proxies[-1]

    yield make
    for proxy in proxies:
        proxy.close()


def postgres_through(stack: FaultStack, make_proxy: Callable[[Path], Proxy]) -> tuple[Proxy, str]:
    """A proxy to the stack's PostgreSQL (its unix socket), and the URL that goes
    through it; the server still sees a local connection, so no password."""
    url = urlsplit(stack.database_url)
    folder = Path(parse_qs(url.query)["host"][0])
    socket = next(p for p in folder.glob(".s.PGSQL.*") if p.suffix != ".lock")
    proxy = make_proxy(socket)
    return proxy, f"postgresql://{url.username}@127.0.0.1:{proxy.port}{url.path}"


def redis_through(stack: FaultStack, make_proxy: Callable[[Path], Proxy]) -> tuple[Proxy, str]:
    """A proxy to the stack's Redis (its unix socket), and the URL through it."""
    proxy = make_proxy(Path(stack.env["REDIS_URL"].removeprefix("unix://")))
    return proxy, f"redis://127.0.0.1:{proxy.port}/0"


def partition(
    stack: FaultStack, proxy: Proxy, scenario: str, guarded: bool, **cut_env: str
) -> tuple[Tally, int, int]:
    """Two workers of two processes each, one of them (`cut_env`) through `proxy`;
    slow jobs until all four processes run one, then the proxy cut for PARTITION_S
    and healed. Then the other worker stops and new jobs must be run by the one
    that was cut off: it came back. The tally; how many jobs the sweep took back,
    and how many of the cut worker's writes were refused."""
    stack.start_api()
    stack.start_beat()
    cut = stack.start_worker("worker-cut", 2, **cut_env)
    other = stack.start_worker("worker-other", 2)
    with stack.engine.begin() as conn:
        conn.exec_driver_sql(FINISH_LOG)
    ids = stack.submit([slow(JOB_S) for _ in range(JOBS)])
    deadline = time.monotonic() + 30
    while list(stack.statuses(ids).values()).count("running") < 4:  # two are the cut one's
        assert time.monotonic() < deadline, stack.statuses(ids)
        time.sleep(0.02)
    proxy.cut()
    time.sleep(PARTITION_S)
    proxy.heal()
    healed = time.monotonic()
    done = stack.wait_terminal(ids, timeout=60 if guarded else 30)
    recovery = None if done is None else round(time.monotonic() - healed, 1)
    time.sleep(2.0)  # the cut worker's late writes land now, if they land at all
    other.stop()
    after = stack.submit([slow(JOB_S) for _ in range(AFTER)])
    came_back = stack.wait_terminal(after, timeout=60)
    ids += after
    tally = stack.tally(scenario, "on" if guarded else "off: finish", ids, JOBS + AFTER)
    tally.recovery_s = recovery
    with stack.engine.connect() as conn:
        finishes = conn.execute(
            sa.text("SELECT count(*) - count(DISTINCT job_id) FROM finish_log "
                    "WHERE job_id::text = ANY(:ids)"), {"ids": ids},
        ).scalar()  # fmt: skip
        taken_back = conn.execute(
            sa.text("SELECT count(DISTINCT job_id) FROM fault_log WHERE old_status = 'running' "
                    "AND new_status = 'queued' AND job_id::text = ANY(:ids)"), {"ids": ids},
        ).scalar()  # fmt: skip
    tally.duplicate_results = max(tally.duplicate_results, int(finishes or 0))
    refused = cut.log_path.read_bytes().count(REFUSED)
    tally.notes.append(
        f"cut off {PARTITION_S:g} s (lease 1.5 s); {taken_back} jobs taken back by the sweep "
        f"and run again; {refused} late writes of the cut worker refused; then it alone ran "
        f"{AFTER} new jobs" + ("" if came_back is not None else " (it did not)")
    )
    return tally, int(taken_back or 0), refused


@GUARD
def test_15_a_worker_cut_off_from_postgres_longer_than_the_lease(
    make_stack: Callable[..., FaultStack], make_proxy: Callable[[Path], Proxy], guarded: bool
) -> None:
    stack = make_stack("" if guarded else "finish")
    proxy, url = postgres_through(stack, make_proxy)
    tally, taken_back, refused = partition(
        stack, proxy, "15. A worker cut off from PostgreSQL longer than the lease, healed",
        guarded, DATABASE_URL=url,
    )  # fmt: skip
    check(tally, guarded, lambda t: t.duplicate_results > 0 or t.lost > 0)
    assert taken_back > 0 and (refused > 0 or not guarded), tally


@GUARD
def test_16_a_worker_cut_off_from_redis_longer_than_the_lease(
    make_stack: Callable[..., FaultStack], make_proxy: Callable[[Path], Proxy], guarded: bool
) -> None:
    stack = make_stack("" if guarded else "finish")
    proxy, url = redis_through(stack, make_proxy)
    # A long drain: each process of the cut worker goes on claiming jobs from
    # PostgreSQL, which it still reaches, and wakes the others for the rest
    # (Redis) before it runs what it claimed.
    tally, taken_back, refused = partition(
        stack, proxy, "16. A worker cut off from Redis longer than the lease, healed",
        guarded, REDIS_URL=url, DRAIN_SECONDS="60",
    )  # fmt: skip
    check(tally, guarded, lambda t: t.duplicate_results > 0 or t.lost > 0)
    assert taken_back > 0 and (refused > 0 or not guarded), tally
