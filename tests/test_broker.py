"""The Celery app's broker: its guard for kombu channels whose connection is gone,
and the transport options it gives kombu."""

from __future__ import annotations

import contextlib
import threading
from urllib.parse import urlsplit

import pytest
import redis
from kombu import Connection

from app.execution.dispatch import Dispatcher
from app.platform.broker import closed_channels_raise_connection_errors, make_celery
from app.platform.settings import Settings
from tests.faults.proxy import Proxy
from tests.support import redis_over_tcp

SILENT_QUEUE = "test-silent-broker"
LIVENESS_S = 120  # many times the broker's socket timeout and Celery's retries


def test_a_channel_without_its_connection_raises_a_connection_error(settings: Settings) -> None:
    # As a worker's channel is when Redis went away with messages in hand: its pools
    # gone, its connection let go of. Putting the unacknowledged message back, or
    # acknowledging a task that finished after the loss, raised AttributeError there,
    # and Celery's worker exited ("Unrecoverable error"); a connection error it handles.
    closed_channels_raise_connection_errors()
    with Connection(settings.broker_url) as conn:
        channel = conn.default_channel
        assert redis.exceptions.ConnectionError in conn.connection_errors
        channel.qos._delivered["a-delivery"] = None
        channel._disconnect_pools()
        channel.connection.client = None
        with pytest.raises(redis.exceptions.ConnectionError):
            channel.qos.restore_unacked()  # the restore at close
        with pytest.raises(redis.exceptions.ConnectionError):
            channel.qos.ack("a-delivery")  # a late acknowledgement
        channel.qos._delivered.clear()


def test_workers_put_back_overdue_messages_every_restore_interval(settings: Settings) -> None:
    # BROKER_RESTORE_INTERVAL_SECONDS is the period of kombu's scan for messages past
    # their visibility timeout: its interval, and a scan at every tick (not every 10th).
    tuned = settings.with_overrides(broker_restore_interval_seconds=3.0)
    celery = make_celery(tuned, contextlib.nullcontext, {}, object())
    with celery.connection_for_write() as conn:
        channel = conn.default_channel
        assert channel.unacked_restore_interval == 3.0
        assert channel.unacked_restore_throttle == 1
        assert channel.visibility_timeout == tuned.broker_visibility_timeout_seconds


@pytest.mark.processes
def test_a_wake_up_to_a_broker_gone_silent_gives_up_and_works_again_once_healed(
    settings: Settings,
) -> None:
    """Redis stops answering without closing the connection (a partition; a failover
    behind a NAT). A publish waits for Redis's reply: with no socket timeout it waited
    for ever, and the process's job writer with it, so every later submit of that API
    process hung. Now the wake-up gives up (its jobs are left to the sweep: about
    20 s, a socket timeout for each of Celery's publish retries) and,
    once the network heals, the next one is sent. On a Redis of its own over TCP
    (the one a run is given may be a unix socket), reached through a proxy it cuts."""
    with redis_over_tcp() as url:
        redis_url = urlsplit(url)
        assert redis_url.hostname and redis_url.port
        proxy = Proxy((redis_url.hostname, redis_url.port))
        try:
            through = settings.with_overrides(
                redis_url=redis_url._replace(netloc=f"127.0.0.1:{proxy.port}").geturl()
            )
            celery = make_celery(through, contextlib.nullcontext, {}, object())
            dispatcher = Dispatcher(celery, url, SILENT_QUEUE)
            queue = redis.Redis.from_url(url)
            assert dispatcher.wake("digits", force=True)  # the pooled connection is made
            proxy.cut()
            woken: list[bool] = []
            waker = threading.Thread(
                target=lambda: woken.append(dispatcher.wake("digits", force=True))
            )
            waker.start()
            waker.join(LIVENESS_S)
            assert not waker.is_alive(), f"the wake-up still waits after {LIVENESS_S} s"
            assert woken == [False]
            proxy.heal()
            assert dispatcher.wake("digits", force=True)
            assert queue.llen(SILENT_QUEUE) >= 2  # the first wake-up and the one after healing
        finally:
            proxy.close()
