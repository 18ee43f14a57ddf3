"""Settling a dead worker's sync calls (app.sync.recovery) against real Redis, in
process: each call settled exactly once, whoever settles and whenever a settler
dies. A database of the run's Redis of their own: the run's workers settle every
dead worker they find in theirs, and would race the settlers these tests play."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest
import redis

from app.sync import lane, replies
from app.sync.lane import Entry, Lane
from app.sync.recovery import Recovery

LEASE_S = 0.2


OWN_DB = 13  # (the run's workers use the URL's own, 0 or 15)


@pytest.fixture
def client(redis_url: str) -> Iterator[redis.Redis]:
    pool = redis.Redis.from_url(redis_url).connection_pool
    kwargs = {**pool.connection_kwargs, "db": OWN_DB, "socket_timeout": 5}
    client = redis.Redis(connection_pool=redis.ConnectionPool(pool.connection_class, **kwargs))
    yield client
    client.close()


@pytest.fixture
def queue(client: redis.Redis) -> Iterator[str]:
    queue = f"recovery-{uuid.uuid4().hex[:8]}"
    yield queue
    client.delete(lane.lane_key(queue), lane.serving_key(queue))


def entry(queue: str, channel: str, *, idempotent: bool = True, attempt: int = 1) -> Entry:
    now = time.time()
    return Entry(uuid.uuid4(), 1, "digits", "1", queue, channel, now, now + 30, b"\x00" * 8,
                 1, idempotent, attempt)  # fmt: skip


def died_with(client: redis.Redis, queue: str, entries: list[Entry]) -> str:
    """A worker that took `entries` from the queue's lane, then died (its lease lapsed)."""
    worker = f"dead-{uuid.uuid4().hex[:8]}"
    mine = Lane(client, 100)
    mine.register(worker, [queue], LEASE_S)
    assert mine.push(queue, [lane.encode(e) for e in entries]) == len(entries)
    taken = mine.take(worker, queue, len(entries), 1)
    while len(taken) < len(entries):
        taken += mine.take(worker, queue, len(entries), 1)
    time.sleep(LEASE_S * 2)
    client.delete(lane.serving_key(queue))
    assert worker in mine.dead_workers()
    return worker


def waiting(client: redis.Redis, queue: str) -> list[Entry]:
    return [lane.decode(raw) for raw in client.lrange(lane.lane_key(queue), 0, -1)]  # type: ignore[arg-type]


def test_a_settler_killed_between_its_read_and_its_settling_leaves_the_calls_to_the_next(
    client: redis.Redis, queue: str
) -> None:
    """The old recovery took the list (RENAME) into the settler's memory first:
    a settler killed there lost the calls, and their callers waited out their
    timeouts (504). Now the read holds nothing; the settling is one step."""
    channel = f"test-replies-{uuid.uuid4().hex}"
    calls = [entry(queue, channel), entry(queue, channel, idempotent=False)]
    worker = died_with(client, queue, calls)
    first = Lane(client, 100)
    read = first.taken(worker, queue)  # a settler reads, then is killed before settling
    assert len(read) == 2
    listener = client.pubsub()
    listener.subscribe(channel)
    assert listener.get_message(timeout=5)["type"] == "subscribe"

    assert Recovery(Lane(client, 100)).run() >= 2  # the next settler finds them all
    back = waiting(client, queue)
    assert [e.id for e in back] == [calls[0].id] and back[0].attempt == 2
    message = listener.get_message(timeout=5)
    assert message is not None and message["type"] == "message"
    reply = replies.decode(message["data"])
    assert reply.id == calls[1].id and reply.status == lane.LOST
    assert not client.exists(lane.taken_key(worker, queue))
    assert worker not in Lane(client, 100).dead_workers()
    # The killed settler's read, settled late, does nothing a second time.
    assert not first.settle(worker, queue, read, [calls[0]], [])
    assert [e.id for e in waiting(client, queue)] == [calls[0].id]
    listener.close()


def test_two_settlers_at_once_settle_each_call_once(client: redis.Redis, queue: str) -> None:
    calls = [entry(queue, "nobody-listens") for _ in range(5)]
    worker = died_with(client, queue, calls)
    one, two = Lane(client, 100), Lane(client, 100)
    read_one, read_two = one.taken(worker, queue), two.taken(worker, queue)
    back = [lane.decode(raw) for raw in read_one]
    assert one.settle(worker, queue, read_one, back, [])
    assert not two.settle(worker, queue, read_two, back, [])
    assert sorted(e.id for e in waiting(client, queue)) == sorted(e.id for e in calls)


def test_a_worker_thought_dead_that_answered_after_all_is_not_settled_over(
    client: redis.Redis, queue: str
) -> None:
    """Its lease lapsed (a stall), then it answered (its taken list emptied) and
    took the next call: the list read before is not what is there now."""
    calls = [entry(queue, "nobody-listens")]
    worker = died_with(client, queue, calls)
    settler = Lane(client, 100)
    read = settler.taken(worker, queue)
    alive = Lane(client, 100)
    alive.register(worker, [queue], 5)
    alive.answer(worker, queue, [("nobody-listens", b"answer", b"record")], journal=False)
    later = entry(queue, "nobody-listens")
    alive.push(queue, [lane.encode(later)])
    assert alive.take(worker, queue, 1, 1) == [lane.encode(later)]
    assert not settler.settle(worker, queue, read, [lane.decode(read[0])], [])
    assert waiting(client, queue) == []
    assert settler.taken(worker, queue) == [lane.encode(later)]
    client.delete(lane.alive_key(worker), lane.taken_key(worker, queue))
    client.hdel(lane.WORKERS, worker)


def test_a_call_put_back_for_its_second_attempt_can_still_be_withdrawn(
    client: redis.Redis, queue: str
) -> None:
    """Its caller's time ran out while it waited again: it is taken back unrun
    (the caller is told so), not left for a worker to take and drop."""
    call = entry(queue, "nobody-listens")
    pushed = lane.encode(call)
    worker = died_with(client, queue, [call])
    assert Recovery(Lane(client, 100)).run() == 1
    assert [e.attempt for e in waiting(client, queue)] == [2]
    assert Lane(client, 100).withdraw(queue, pushed)
    assert waiting(client, queue) == []
    assert not Lane(client, 100).withdraw(queue, pushed)
    assert worker not in Lane(client, 100).dead_workers()
