"""For Python clients that receive our webhooks: verify, then deduplicate.

    from app.webhooks.receiver import Receiver, DuplicateDelivery
    receiver = Receiver(os.environ["WEBHOOK_SECRET"])

    @app.post("/hooks/inference")
    def hook():
        try:
            event = receiver.receive(request.get_data(), request.headers)
        except DuplicateDelivery:
            return "", 204          # already handled: a retry of the same event
        handle(event["type"], event["data"])
        return "", 204

Deliveries are at least once: the same event (same `webhook-id`) can arrive
again after a timeout or a lost acknowledgement, hence the deduplication. The
in-memory store is per process; pass your own (Redis, a table) to share it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from typing import Any, Protocol

from standardwebhooks import Webhook, WebhookVerificationError

__all__ = ["DuplicateDelivery", "Receiver", "SeenStore", "WebhookVerificationError"]


class DuplicateDelivery(Exception):
    """This `webhook-id` was received before."""


class SeenStore(Protocol):
    def add_if_new(self, message_id: str) -> bool: ...


class MemorySeen:
    """The last `capacity` message ids, in memory."""

    def __init__(self, capacity: int = 100_000) -> None:
        self._ids: OrderedDict[str, None] = OrderedDict()
        self._capacity = capacity

    def add_if_new(self, message_id: str) -> bool:
        if message_id in self._ids:
            return False
        self._ids[message_id] = None
        if len(self._ids) > self._capacity:
            self._ids.popitem(last=False)
        return True


class Receiver:
    def __init__(self, secret: str, seen: SeenStore | None = None) -> None:
        self._webhook = Webhook(secret)
        self._seen = seen or MemorySeen()

    def receive(self, body: bytes | str, headers: Mapping[str, str]) -> dict[str, Any]:
        """The event, verified; raises WebhookVerificationError or DuplicateDelivery."""
        lowered = {k.lower(): v for k, v in headers.items()}
        event: dict[str, Any] = self._webhook.verify(body, lowered)
        if not self._seen.add_if_new(lowered["webhook-id"]):
            raise DuplicateDelivery(lowered["webhook-id"])
        return event
