"""Sync calls' answers over Redis: the worker publishes after its commit, the
waiting process answers without reading PostgreSQL, and falls back to reading
it when a reply is lost."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import numpy as np
import pytest
import redis
from flask import Flask
from sqlalchemy import text

from app.cards import ModelCard
from app.execution import runs
from app.platform.broker import redis_client
from app.platform.database import Database
from app.runtime.tensors import pack, unpack
from app.sync import calls as sync
from app.sync import replies
from app.sync.replies import Replies, Reply
from app.web.context import services
from tests.conftest import TenantAuth, insert_queued_job, load_job
from tests.support import execute

PIXELS = [[float(i % 16) / 16 for i in range(64)]]


@pytest.fixture
def ctx(app: Flask) -> Iterator[None]:
    with app.app_context():
        yield


@pytest.fixture
def hub_name() -> str:
    """The hub's connection's name in CLIENT LIST, so a test can cut it."""
    return f"test-replies-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def hub(ctx: None, hub_name: str) -> Replies:
    url = services().settings.redis_url
    return Replies(lambda: redis.Redis.from_url(url, client_name=hub_name, socket_timeout=5))


@pytest.fixture
def client(ctx: None) -> redis.Redis:
    return redis_client(services().settings.redis_url)


def digits() -> ModelCard:
    return services().parts.repository.resolve("digits")


def real_outputs(card: ModelCard) -> dict[str, np.ndarray]:
    arrays = {"pixels": np.asarray(PIXELS, dtype=np.float32)}
    [ran] = runs.run_card(services().parts.runner.sessions, card, [arrays])
    assert isinstance(ran, runs.Ran), ran
    return ran.outputs


def call(card: ModelCard, job_id: uuid.UUID, timeout_s: float = 30.0) -> sync.Call:
    return sync.Call(card, job_id, timeout_s, time.monotonic() + timeout_s)


def finished_within(calls: sync.Calls, seconds: float) -> list[tuple[sync.Call, sync.Ended]]:
    give_up = time.monotonic() + seconds
    while time.monotonic() < give_up:
        if ended := calls.finished(0.2):
            return ended
    return []


def test_a_reply_round_trips_with_and_without_outputs() -> None:
    outputs = pack({"label": np.array([7]), "probabilities": np.ones((1, 10), np.float32)})
    done = Reply(uuid.uuid4(), "succeeded", None, None, outputs)
    failed = Reply(uuid.uuid4(), "failed", "inference_error", "bad\nrow", None)
    assert replies.decode(replies.encode(done)) == done
    assert replies.decode(replies.encode(failed)) == failed


def test_a_call_is_answered_from_redis_without_its_row(
    hub: Replies, client: redis.Redis, database: Database, tenant: TenantAuth
) -> None:
    """No row exists for this job: only the reply can answer it."""
    card = digits()
    outputs = real_outputs(card)
    job_id = uuid.uuid4()
    calls = sync.Calls(database.engine, hub.follow(), tenant.id)
    calls.add(call(card, job_id))
    replies.publish(client, [(hub.channel, Reply(job_id, "succeeded", None, None, pack(outputs)))])
    [(done, answer)] = finished_within(calls, 10)
    assert done.job_id == job_id and isinstance(answer, sync.Answer)
    assert answer.job_id == job_id
    for name, array in outputs.items():
        np.testing.assert_array_equal(answer.outputs[name], array)
    calls.close()


def test_a_failed_job_s_reply_is_the_caller_s_error(
    hub: Replies, client: redis.Redis, database: Database, tenant: TenantAuth
) -> None:
    job_id = uuid.uuid4()
    calls = sync.Calls(database.engine, hub.follow(), tenant.id)
    calls.add(call(digits(), job_id))
    failed = Reply(job_id, "failed", "non_finite_output", "NaN in probabilities", None)
    replies.publish(client, [(hub.channel, failed)])
    [(_, error)] = finished_within(calls, 10)
    assert isinstance(error, sync.InferenceFailed)
    assert error.extra["error_code"] == "non_finite_output" and str(job_id) in error.detail
    calls.close()


def test_a_reply_before_its_call_is_followed_is_kept_for_it(
    hub: Replies, client: redis.Redis, database: Database, tenant: TenantAuth
) -> None:
    """The job can finish between its commit and `add`: its reply waits for the call."""
    card = digits()
    job_id = uuid.uuid4()
    calls = sync.Calls(database.engine, hub.follow(), tenant.id)  # subscribed
    replies.publish(
        client, [(hub.channel, Reply(job_id, "succeeded", None, None, pack(real_outputs(card))))]
    )
    time.sleep(0.3)  # heard by the hub, followed by nobody yet
    calls.add(call(card, job_id))
    [(done, answer)] = calls.finished(0.1) or finished_within(calls, 0.5)
    assert done.job_id == job_id and isinstance(answer, sync.Answer)
    calls.close()


def test_a_lost_reply_is_read_from_postgresql(
    hub: Replies, database: Database, tenant: TenantAuth
) -> None:
    """A job that ended without a reply (sent nowhere) still answers its caller."""
    job_id = insert_queued_job(database, tenant.id, {"pixels": PIXELS}, model="digits")
    calls = sync.Calls(database.engine, hub.follow(), tenant.id)
    calls.add(call(digits(), job_id))
    execute(services(), [job_id])  # no reply_to on this row: no reply
    started = time.monotonic()
    [(_, answer)] = finished_within(calls, 10)
    assert isinstance(answer, sync.Answer)
    assert time.monotonic() - started < 10 * replies.CHECK_S  # read, not timed out
    calls.close()


def test_the_worker_publishes_a_sync_job_s_answer_after_its_commit(
    ctx: None, client: redis.Redis, database: Database, tenant: TenantAuth
) -> None:
    channel = replies.CHANNEL_PREFIX + uuid.uuid4().hex
    answered = insert_queued_job(database, tenant.id, {"pixels": PIXELS}, model="digits")
    silent = insert_queued_job(database, tenant.id, {"pixels": PIXELS}, model="digits")
    with database.engine.begin() as conn:
        conn.execute(
            text("UPDATE jobs SET reply_to = :channel WHERE id = :id"),
            {"channel": channel, "id": answered},
        )
    pubsub = client.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(channel)
    pubsub.get_message(timeout=1)  # the subscription's confirmation
    execute(services(), [answered, silent])
    messages = []
    give_up = time.monotonic() + 10
    while time.monotonic() < give_up and not messages:
        if (message := pubsub.get_message(timeout=0.5)) is not None:
            messages.append(replies.decode(message["data"]))
    assert pubsub.get_message(timeout=0.5) is None, "one reply, for the sync job only"
    pubsub.close()
    [reply] = messages
    job = load_job(database, answered)
    assert reply.id == answered and reply.status == job.status == "succeeded"
    assert reply.output_data == job.output_data, "the answer is the committed record"
    assert set(unpack(reply.output_data)) == {"label", "probabilities"}


def test_the_hub_hears_replies_again_after_its_connection_is_killed(
    hub: Replies, hub_name: str, client: redis.Redis, database: Database, tenant: TenantAuth
) -> None:
    card = digits()
    outputs = pack(real_outputs(card))
    calls = sync.Calls(database.engine, hub.follow(), tenant.id)
    [subscriber] = [line for line in client.client_list() if line["name"] == hub_name]
    assert int(subscriber["sub"]) == 1
    client.client_kill_filter(_id=subscriber["id"])  # the hub must subscribe again
    job_id = uuid.uuid4()
    calls.add(call(card, job_id))
    give_up = time.monotonic() + 20
    ended: list[tuple[sync.Call, sync.Ended]] = []
    while time.monotonic() < give_up and not ended:
        replies.publish(client, [(hub.channel, Reply(job_id, "succeeded", None, None, outputs))])
        ended = calls.finished(0.5)
    assert [done.job_id for done, _ in ended] == [job_id]
    assert isinstance(ended[0][1], sync.Answer)
    calls.close()


def test_replies_nobody_waits_for_are_bounded(hub: Replies) -> None:
    """Answers of callers that gave up (or of another process's jobs) cannot grow
    the process: at most EARLY_MAX are kept, for at most EARLY_S."""
    for _ in range(replies.EARLY_MAX + 500):
        hub._deliver(Reply(uuid.uuid4(), "succeeded", None, None, b"x" * 100))
    assert len(hub._early) == replies.EARLY_MAX
    kept = next(iter(hub._early))
    hub._early[kept] = (time.monotonic() - replies.EARLY_S - 1, hub._early[kept][1])
    hub._deliver(Reply(uuid.uuid4(), "failed", "x", "y", None))
    assert kept not in hub._early, "an old one goes when a new one comes"
