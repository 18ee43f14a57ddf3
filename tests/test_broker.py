"""The Celery app's broker: its guard for kombu channels whose connection is gone,
and the transport options it gives kombu."""

from __future__ import annotations

import contextlib

import pytest
import redis
from kombu import Connection

from app.platform.broker import closed_channels_raise_connection_errors, make_celery
from app.platform.settings import Settings


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
