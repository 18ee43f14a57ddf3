"""Verifying the service's webhooks (Standard Webhooks), with the reference
`standardwebhooks` package, imported only when a webhook is verified."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from inference_client.errors import WebhookVerificationError


def verify_webhook(payload: bytes | str, headers: Mapping[str, str], secret: str) -> dict[str, Any]:
    """The event (`{"type", "timestamp", "data"}`) once its signature verifies with
    `secret` (the tenant's `whsec_...`) and its timestamp is within five minutes.

    Pass the body exactly as received (before any JSON parsing). During a secret
    rotation the service sends a signature per secret: either secret verifies.
    Deliveries are at least once: deduplicate on the `webhook-id` header.
    Raises WebhookVerificationError."""
    from standardwebhooks import Webhook
    from standardwebhooks import WebhookVerificationError as Refused

    lowered = {name.lower(): value for name, value in headers.items()}
    try:
        event = Webhook(secret).verify(payload, lowered)
    except Refused as exc:
        raise WebhookVerificationError(str(exc)) from exc
    except ValueError as exc:  # a malformed signature (bad base64 included), a non-UTF-8 body
        raise WebhookVerificationError(f"malformed webhook: {exc}") from exc
    if not isinstance(event, dict):
        raise WebhookVerificationError("the webhook's body is not a JSON object")
    return event
