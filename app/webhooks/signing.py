"""Standard Webhooks signatures, with the reference implementation.

During a secret rotation's overlap both signatures are sent, space-separated,
so receivers that still know only the old secret keep verifying.
"""

from __future__ import annotations

from datetime import UTC, datetime

from standardwebhooks import Webhook

from app.tenancy.tables import Tenant


def headers(
    tenant: Tenant, message_id: str, body: str, now: datetime | None = None
) -> dict[str, str]:
    now = now or datetime.now(UTC)
    secrets = [tenant.webhook_secret]
    if (
        tenant.previous_webhook_secret
        and tenant.previous_secret_expires_at
        and (tenant.previous_secret_expires_at > now)
    ):
        secrets.append(tenant.previous_webhook_secret)
    signatures = " ".join(Webhook(secret).sign(message_id, now, body) for secret in secrets)
    return {
        "webhook-id": message_id,
        "webhook-timestamp": str(int(now.timestamp())),
        "webhook-signature": signatures,
        "content-type": "application/json",
        "user-agent": "inference-jobs-webhooks/1",
    }
