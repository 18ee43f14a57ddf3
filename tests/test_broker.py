"""The Celery app's guard for kombu channels whose broker connection is gone."""

from __future__ import annotations

import pytest
import redis
from kombu import Connection

from app.platform.broker import closed_channels_raise_connection_errors
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
