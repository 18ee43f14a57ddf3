"""Tenants and their API keys. Keys are shown once and stored as SHA-256 hashes.
Nothing here commits: the tenant operations (app.operations.tenants) own the transaction."""

from __future__ import annotations

import base64
import hashlib
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from sqlalchemy import func, or_, select, text, update
from sqlalchemy.orm import Session

from app.tenancy.tables import ApiKey, Tenant

KEY_PREFIX = "ik_"
OPERATOR_KEY_PREFIX = "iko_"
TENANT, OPERATOR = "tenant", "operator"


@dataclass(frozen=True)
class Credentials:
    tenant: str
    api_key: str
    webhook_secret: str
    expires_at: datetime | None = None


def hash_key(api_key: str) -> str:
    return hashlib.sha256(api_key.encode()).hexdigest()


def create_api_key(
    session: Session, tenant_name: str, *, expires_at: datetime | None = None
) -> Credentials:
    """A new key for the tenant, creating the tenant (and its webhook secret) if
    new; with `expires_at` the key stops working then."""
    tenant = session.scalar(select(Tenant).where(Tenant.name == tenant_name))
    if tenant is None:
        tenant = Tenant(name=tenant_name, webhook_secret=_new_secret())
        session.add(tenant)
        session.flush()
    api_key = KEY_PREFIX + secrets.token_urlsafe(32)
    session.add(
        ApiKey(
            tenant_id=tenant.id,
            key_hash=hash_key(api_key),
            prefix=api_key[:10],
            expires_at=expires_at,
        )
    )
    session.flush()
    return Credentials(tenant.name, api_key, tenant.webhook_secret, expires_at)


def create_operator_key(session: Session, *, expires_at: datetime | None = None) -> str:
    """A new operator key: it manages the model repository and belongs to no
    tenant, so it reads no tenant's jobs."""
    api_key = OPERATOR_KEY_PREFIX + secrets.token_urlsafe(32)
    session.add(
        ApiKey(
            kind=OPERATOR, key_hash=hash_key(api_key), prefix=api_key[:10], expires_at=expires_at
        )
    )
    session.flush()
    return api_key


def _new_secret() -> str:
    return "whsec_" + base64.b64encode(secrets.token_bytes(24)).decode()


def rotate_webhook_secret(session: Session, tenant_name: str, overlap_hours: float) -> str:
    """A new signing secret; the old one keeps signing too until the overlap ends."""
    tenant = session.scalar(select(Tenant).where(Tenant.name == tenant_name))
    if tenant is None:
        raise LookupError(f"no tenant named {tenant_name!r}")
    tenant.previous_webhook_secret = tenant.webhook_secret
    tenant.previous_secret_expires_at = datetime.now(UTC) + timedelta(hours=overlap_hours)
    tenant.webhook_secret = _new_secret()
    session.flush()
    return tenant.webhook_secret


@dataclass(frozen=True)
class TenantRef:
    """Who a request comes from: all a request needs of its tenant."""

    id: int
    name: str


@dataclass(frozen=True)
class Caller:
    """A valid key's kind, its tenant (None for an operator key), and when it
    expires (None: never)."""

    kind: str
    tenant: TenantRef | None
    expires_at: datetime | None = None

    def expired(self) -> bool:
        return self.expires_at is not None and self.expires_at <= datetime.now(UTC)


def caller_for_key(session: Session, api_key: str) -> Caller | None:
    """The key's caller; None for an unknown, revoked or expired key."""
    return caller_for_hash(session, hash_key(api_key))


def caller_for_hash(session: Session, key_hash: str) -> Caller | None:
    """As `caller_for_key`, by the key's hash (what the status page's session holds)."""
    row = session.execute(
        select(ApiKey.kind, ApiKey.expires_at, Tenant.id, Tenant.name)
        .outerjoin(Tenant, ApiKey.tenant_id == Tenant.id)
        .where(
            ApiKey.key_hash == key_hash,
            ApiKey.revoked_at.is_(None),
            or_(ApiKey.expires_at.is_(None), ApiKey.expires_at > func.now()),
        )
    ).first()
    if row is None:
        return None
    tenant = TenantRef(row.id, row.name) if row.id is not None else None
    return Caller(row.kind, tenant, row.expires_at)


class KeyCache:
    """Callers by API key hash, kept `ttl_s` seconds, so a busy client costs one
    key query per few seconds rather than one per request. A revoked key keeps
    working at most that long. Unknown keys are never cached (a client trying
    random keys cannot fill memory); the cache holds at most `max_keys`. `clock`
    (seconds) times the entries."""

    def __init__(
        self,
        ttl_s: float = 5.0,
        max_keys: int = 10_000,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ttl_s, self.max_keys, self.clock = ttl_s, max_keys, clock
        self._entries: dict[str, tuple[float, Caller]] = {}
        self._lock = threading.Lock()

    def lookup(self, session: Session, api_key: str) -> TenantRef | None:
        """The key's tenant; None for an unknown key or an operator's."""
        caller = self.caller(session, api_key)
        return caller.tenant if caller is not None else None

    def caller(self, session: Session, api_key: str) -> Caller | None:
        return self.caller_by_hash(session, hash_key(api_key))

    def caller_by_hash(self, session: Session, digest: str) -> Caller | None:
        """The caller of the key whose hash is `digest`, cached as `caller`."""
        now = self.clock()
        entry = self._entries.get(digest)
        if entry is not None and entry[0] > now and not entry[1].expired():
            return entry[1]
        ref = caller_for_hash(session, digest)
        if ref is None:
            self._entries.pop(digest, None)
            return None
        with self._lock:
            if len(self._entries) >= self.max_keys:
                self._entries = {k: v for k, v in self._entries.items() if v[0] > now}
                if len(self._entries) >= self.max_keys:
                    self._entries.clear()
            self._entries[digest] = (now + self.ttl_s, ref)
        return ref


def revoke_api_keys(session: Session, *, prefix: str | None, tenant: str | None) -> list[str]:
    """Revoke the key starting with `prefix` (its first 10 characters are shown
    beside it), or every key of `tenant`; returns the prefixes revoked. API
    processes stop accepting them within API_KEY_CACHE_SECONDS."""
    query = update(ApiKey).where(ApiKey.revoked_at.is_(None)).values(revoked_at=func.now())
    if prefix is not None:
        if len(prefix) < 10:
            raise ValueError("give at least the key's first 10 characters")
        query = query.where(ApiKey.prefix == prefix[:10])
    elif tenant is not None:
        owner = select(Tenant.id).where(Tenant.name == tenant).scalar_subquery()
        query = query.where(ApiKey.tenant_id == owner)
    else:
        raise ValueError("name a key (its prefix) or a tenant")
    return list(session.scalars(query.returning(ApiKey.prefix)))


def list_api_keys(session: Session, tenant: str | None = None) -> list[dict[str, object]]:
    """Every key (never the key itself): prefix, kind, tenant, created, expiry, revocation."""
    query = (
        select(
            ApiKey.prefix,
            ApiKey.kind,
            Tenant.name,
            ApiKey.created_at,
            ApiKey.expires_at,
            ApiKey.revoked_at,
        )
        .outerjoin(Tenant, ApiKey.tenant_id == Tenant.id)
        .order_by(ApiKey.created_at)
    )
    if tenant is not None:
        query = query.where(Tenant.name == tenant)
    return [
        {
            "prefix": r.prefix,
            "kind": r.kind,
            "tenant": r.name,
            "created_at": r.created_at.isoformat(),
            "expires_at": r.expires_at.isoformat() if r.expires_at else None,
            "revoked_at": r.revoked_at.isoformat() if r.revoked_at else None,
        }
        for r in session.execute(query)
    ]


QUOTAS = (
    "max_in_flight", "max_submits_per_second", "max_batch_rows_per_day", "max_stored_bytes",
    "max_priority", "max_tokens_per_minute",
)  # fmt: skip


def describe_tenants(session: Session, name: str | None = None) -> list[dict[str, object]]:
    """Each tenant's name and own quotas (None: the TENANT_* setting applies)."""
    query = select(Tenant).order_by(Tenant.name)
    if name is not None:
        query = query.where(Tenant.name == name)
    return [
        {
            "tenant": t.name,
            "created_at": t.created_at.isoformat(),
            **{q: getattr(t, q) for q in QUOTAS},
        }
        for t in session.scalars(query)
    ]


def set_quotas(session: Session, name: str, changes: dict[str, float | None]) -> dict[str, object]:
    """Set (a number) or clear (None: back to the setting's default) quotas of a
    tenant; running API processes apply them within a few seconds."""
    tenant = session.scalar(select(Tenant).where(Tenant.name == name))
    if tenant is None:
        raise LookupError(f"no tenant named {name!r}")
    for quota, value in changes.items():
        if quota not in QUOTAS:
            raise ValueError(f"unknown quota {quota!r}; one of {', '.join(QUOTAS)}")
        if value is not None and value < 0:
            raise ValueError(f"{quota} must be 0 or more (0: nothing allowed)")
        if quota == "max_priority" and value is not None and value > 9:
            raise ValueError("max_priority is at most 9")
        is_float = quota == "max_submits_per_second"
        setattr(tenant, quota, value if value is None or is_float else int(value))
    session.flush()
    [described] = describe_tenants(session, name)
    return described


def has_tenants(session: Session) -> bool:
    return session.scalar(select(Tenant.id).limit(1)) is not None


def tenant_named(session: Session, name: str) -> TenantRef | None:
    row = session.execute(select(Tenant.id, Tenant.name).where(Tenant.name == name)).first()
    return TenantRef(row.id, row.name) if row is not None else None


def forget_previous_secrets(session: Session) -> int:
    """A rotated-out webhook secret signs nothing after its overlap: it is erased
    then, so a later leak of the database does not carry it. How many were."""
    statement = text(
        "UPDATE tenants SET previous_webhook_secret = NULL, previous_secret_expires_at = NULL "
        "WHERE previous_secret_expires_at < now() RETURNING id"
    )
    return len(session.execute(statement).all())
