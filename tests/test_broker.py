"""The Celery app's guard against kombu's restore at close on a lost connection."""

from __future__ import annotations

from kombu import Connection

from app.platform.broker import keep_unacked_when_the_connection_is_gone
from app.platform.settings import Settings


def test_a_channel_closing_without_a_connection_keeps_its_unacked_messages(
    settings: Settings,
) -> None:
    # As a worker's channel is when Redis went away with a message in hand: its pools
    # gone, its connection let go of, one delivery unacknowledged. Without the guard,
    # kombu raises AttributeError here and the worker exits ("Unrecoverable error").
    keep_unacked_when_the_connection_is_gone()
    with Connection(settings.broker_url) as conn:
        channel = conn.default_channel
        channel.qos._delivered["a-delivery"] = None
        channel._disconnect_pools()
        channel.connection.client = None
        assert channel.qos.restore_unacked() is None
        assert "a-delivery" in channel.qos._delivered  # left for restore_visible
        channel.qos._delivered.clear()
