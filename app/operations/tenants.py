"""Tenants and keys: who a key belongs to, and the operator's commands on tenants
(keys, quotas, the webhook secret). Each command is one unit of work."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from app.errors import NotFound
from app.platform.database import Database, transactional
from app.tenancy import keys
from app.tenancy.keys import OPERATOR, Caller, Credentials, KeyCache, TenantRef, hash_key
from app.tenancy.quotas import Quotas

__all__ = ["OPERATOR", "Caller", "Credentials", "TenantOperations", "TenantRef", "hash_key"]


class TenantOperations:
    def __init__(self, database: Database, cache: KeyCache, quotas: Quotas) -> None:
        self.database, self._cache, self._quotas = database, cache, quotas

    def authenticate(self, api_key: str) -> Caller | None:
        """The caller of an API key (its kind and tenant); None for an unknown,
        revoked or expired key. Cached per process for API_KEY_CACHE_SECONDS."""
        return self._cache.caller(self.database.session(), api_key)

    def authenticate_hash(self, key_hash: str) -> Caller | None:
        """As `authenticate`, by the key's hash (what a signed-in page keeps)."""
        return self._cache.caller_by_hash(self.database.session(), key_hash)

    def find(self, name: str) -> TenantRef:
        """The tenant named `name` (the CLI names tenants); NotFound if none is."""
        found = keys.tenant_named(self.database.session(), name)
        if found is None:
            raise NotFound(f"no tenant named {name!r}")
        return found

    def tokens_per_minute(self, tenant: TenantRef) -> dict[str, Any]:
        """The tenant's token budget (None: no limit), the tokens its generations
        took in the last minute, and the seconds until a generation may be
        submitted again (0: now)."""
        limit = self._quotas.limits(self.database.session(), tenant.id).tokens_per_minute
        window = self._quotas.tokens.window(tenant.id, limit)
        return {"limit": limit, "used": window.used, "retry_after": window.retry_after}

    def has_tenants(self) -> bool:
        return keys.has_tenants(self.database.session())

    @transactional
    def create_api_key(self, tenant: str, expires_at: datetime | None = None) -> Credentials:
        """A new key for `tenant`, made with its webhook secret if it is new."""
        return keys.create_api_key(self.database.session(), tenant, expires_at=expires_at)

    @transactional
    def first_key(self) -> Credentials | None:
        """A key for the tenant `default` when there is no tenant yet (`make run` on a
        fresh machine); None when there are tenants already."""
        session = self.database.session()
        if keys.has_tenants(session):
            return None
        return keys.create_api_key(session, "default")

    @transactional
    def create_operator_key(self, expires_at: datetime | None = None) -> str:
        return keys.create_operator_key(self.database.session(), expires_at=expires_at)

    @transactional
    def revoke_api_keys(self, *, prefix: str | None, tenant: str | None) -> list[str]:
        """ValueError unless a key (its prefix) or a tenant is named."""
        return keys.revoke_api_keys(self.database.session(), prefix=prefix, tenant=tenant)

    def list_api_keys(self, tenant: str | None = None) -> list[dict[str, object]]:
        return keys.list_api_keys(self.database.session(), tenant)

    def describe(self, name: str | None = None) -> list[dict[str, object]]:
        """Each tenant (or `name`) with its own quotas."""
        return keys.describe_tenants(self.database.session(), name)

    @transactional
    def set_quotas(self, name: str, changes: dict[str, float | None]) -> dict[str, object]:
        """LookupError for an unknown tenant, ValueError for an unknown or bad quota."""
        return keys.set_quotas(self.database.session(), name, changes)

    @transactional
    def rotate_webhook_secret(self, name: str, overlap_hours: float) -> str:
        return keys.rotate_webhook_secret(self.database.session(), name, overlap_hours)
