"""Per-tenant quotas: jobs in flight, submits a second, batch rows a day, bytes
stored, the highest priority a job may ask for, and tokens a minute (a
generative model's; counted by app.tenancy.tokens). Stored on the tenant row
(`manage.py tenants set`), with the TENANT_* settings as defaults; beyond one,
a request gets 429 quota-exceeded naming the limit, and nothing of it is kept.

Cost on the submit path: a tenant's limits are read at most every `ttl_s`; its
jobs in flight are counted (ix_jobs_tenant_open) at most every `count_ttl_s`
and this process's own admissions are added in between, like the model queue's
bound (app.jobs.admission), so the count is approximate by what one process
admits in that time. The rate is a per-second counter in Redis, shared by every
API process; it is only touched for tenants that have a rate limit.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import redis
from sqlalchemy import func, select, text
from sqlalchemy.orm import Session

from app.batches.tables import Batch, File
from app.errors import InvalidRequest, QuotaExceeded, TenantGone
from app.jobs.tables import SYNC_PRIORITY
from app.platform.broker import redis_client
from app.platform.settings import Settings
from app.statuses import OPEN_SQL
from app.tenancy.tables import Tenant
from app.tenancy.tokens import TokenMeter, namespace

logger = logging.getLogger(__name__)

DAY = timedelta(days=1)


@dataclass(frozen=True)
class QuotaSettings:
    """The TENANT_* defaults (a tenant's own quota, when set, wins; 0: no limit), the
    Redis the submit rate is counted in, and RETENTION_SECONDS (batch results count
    toward the stored bytes until retention deletes them)."""

    in_flight: int
    submits_per_second: float
    batch_rows_per_day: int
    stored_bytes: int
    max_priority: int
    tokens_per_minute: int
    redis_url: str
    retention_s: float
    database: str  # (the token counts' namespace)

    @classmethod
    def of(cls, settings: Settings) -> QuotaSettings:
        return cls(
            settings.tenant_max_in_flight, settings.tenant_max_submits_per_second,
            settings.tenant_max_batch_rows_per_day, settings.tenant_max_stored_bytes,
            settings.tenant_max_priority, settings.tenant_max_tokens_per_minute,
            settings.redis_url, settings.retention_seconds, namespace(settings.database_url),
        )  # fmt: skip


@dataclass(frozen=True)
class Limits:
    """A tenant's quotas; None: no limit."""

    in_flight: int | None
    submits_per_second: float | None
    batch_rows_per_day: int | None
    stored_bytes: int | None
    max_priority: int
    tokens_per_minute: int | None = None

    @classmethod
    def of(cls, tenant: Tenant, defaults: QuotaSettings) -> Limits:
        def pick(own: float | None, default: float) -> float | None:
            value = own if own is not None else default
            return value if value > 0 else None

        in_flight = pick(tenant.max_in_flight, defaults.in_flight)
        rows = pick(tenant.max_batch_rows_per_day, defaults.batch_rows_per_day)
        stored = pick(tenant.max_stored_bytes, defaults.stored_bytes)
        priority = tenant.max_priority
        tokens = pick(tenant.max_tokens_per_minute, defaults.tokens_per_minute)
        return cls(
            in_flight=None if in_flight is None else int(in_flight),
            submits_per_second=pick(tenant.max_submits_per_second, defaults.submits_per_second),
            batch_rows_per_day=None if rows is None else int(rows),
            stored_bytes=None if stored is None else int(stored),
            max_priority=defaults.max_priority if priority is None else priority,
            tokens_per_minute=None if tokens is None else int(tokens),
        )


def check_priority(priority: int, limits: Limits) -> None:
    """InvalidRequest for a priority above the tenant's allowance (a sync call's
    own priority excepted). A door that admits many requests at once checks each
    request's priority with this before admitting them together."""
    if priority > limits.max_priority and priority != SYNC_PRIORITY:
        raise InvalidRequest(
            f"priority {priority} is above this tenant's allowance of "
            f"{limits.max_priority}; ask for 0 to {limits.max_priority}",
            errors={"priority": [f"at most {limits.max_priority}"]},
        )


@dataclass
class _Count:
    value: int
    at: float


class Quotas:
    """One per process: the tenants' limits and in-flight counts, cached (timed by
    `clock`, in seconds; the submit rate counts wall-clock seconds, shared in Redis)."""

    def __init__(
        self,
        settings: QuotaSettings,
        *,
        ttl_s: float = 5.0,
        count_ttl_s: float = 0.5,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings, self.ttl_s, self.count_ttl_s = settings, ttl_s, count_ttl_s
        self.clock = clock
        self._limits: dict[int, tuple[float, Limits]] = {}
        self._counts: dict[int, _Count] = {}
        self._lock = threading.Lock()
        self._redis: redis.Redis | None = None
        self.tokens = TokenMeter(self._client, settings.database)

    def _client(self) -> redis.Redis:
        if self._redis is None:
            self._redis = redis_client(self.settings.redis_url)
        return self._redis

    def limits(self, session: Session, tenant_id: int) -> Limits:
        now = self.clock()
        cached = self._limits.get(tenant_id)
        if cached is not None and cached[0] > now:
            return cached[1]
        tenant = session.get(Tenant, tenant_id)
        if tenant is None:  # deleted meanwhile: nothing may be admitted
            raise TenantGone("the tenant no longer exists", limit="tenant")
        limits = Limits.of(tenant, self.settings)
        self._limits[tenant_id] = (now + self.ttl_s, limits)
        return limits

    def admit_jobs(
        self,
        session: Session,
        tenant_id: int,
        jobs: int = 1,
        *,
        priority: int = 0,
        requests: int = 1,
    ) -> None:
        """Count `requests` requests making `jobs` jobs (at `priority`), or raise
        QuotaExceeded. A door that gathers many callers' requests into one call (a
        stream's, a log's entries) counts each: the rate is the same by every door."""
        limits = self.limits(session, tenant_id)
        check_priority(priority, limits)
        self._rate(tenant_id, limits, requests)
        if limits.in_flight is not None and jobs:  # (an inline call is never in flight)
            self._in_flight(session, tenant_id, jobs, limits.in_flight)

    def admit_tokens(self, session: Session, tenant_id: int) -> None:
        """A generation, while the tenant's last minute holds less than its token
        budget; else QuotaExceeded with the seconds until it does not."""
        allowed = self.limits(session, tenant_id).tokens_per_minute
        if allowed is None:
            return
        window = self.tokens.window(tenant_id, allowed)
        if window.retry_after:
            raise QuotaExceeded(
                f"this tenant's generations took {window.used} tokens in the last minute "
                f"and may take at most {allowed} (max_tokens_per_minute, prompt plus "
                f"completion); retry in about {window.retry_after} s",
                retry_after=window.retry_after, limit="max_tokens_per_minute",
                allowed=allowed, used=window.used,
            )  # fmt: skip

    def admit_batch(self, session: Session, tenant_id: int, rows: int | None, chunks: int) -> None:
        """A new batch of `rows` (None: not known until its file is cut, so only a
        tenant with room left may start one) in `chunks` chunk jobs."""
        limits = self.limits(session, tenant_id)
        self._rate(tenant_id, limits)
        if limits.batch_rows_per_day is not None:
            self._batch_rows(session, tenant_id, rows or 0, limits.batch_rows_per_day)
        if limits.stored_bytes is not None:
            self._stored(session, tenant_id, 0, limits.stored_bytes)
        if limits.in_flight is not None:
            self._in_flight(session, tenant_id, chunks, limits.in_flight)

    def admit_upload(self, session: Session, tenant_id: int, size: int) -> int | None:
        """An upload of `size` bytes (so far); returns the bytes the tenant may still
        store (None: no limit)."""
        limits = self.limits(session, tenant_id)
        if limits.stored_bytes is None:
            return None
        return self._stored(session, tenant_id, size, limits.stored_bytes)

    def _rate(self, tenant_id: int, limits: Limits, requests: int = 1) -> None:
        if limits.submits_per_second is None:
            return
        second = int(time.time())
        key = f"quota:submits:{tenant_id}:{second}"
        try:
            pipe = self._client().pipeline()
            pipe.incrby(key, requests)
            pipe.expire(key, 2)
            used = int(pipe.execute()[0])
            if used > limits.submits_per_second and requests > 1:
                # Refused together: they take none of the second's allowance, so fewer
                # of them (a door that halves its batch when refused) can still pass.
                self._client().decrby(key, requests)
        except redis.RedisError as exc:  # the quota fails open: the broker's outage shows elsewhere
            logger.warning("submit rate of tenant %s not counted: %s", tenant_id, exc)
            return
        allowed = limits.submits_per_second
        if used > allowed:
            raise QuotaExceeded(
                f"this tenant may make at most {allowed:g} submits a second "
                f"(max_submits_per_second); this was number {used} in this second",
                retry_after=1, limit="max_submits_per_second",
                allowed=allowed, used=used,
            )  # fmt: skip

    def _in_flight(self, session: Session, tenant_id: int, jobs: int, allowed: int) -> None:
        now = self.clock()
        count = self._counts.get(tenant_id)
        if count is None or now - count.at > self.count_ttl_s:
            value = session.scalar(_IN_FLIGHT, {"tenant": tenant_id}) or 0
            count = self._counts[tenant_id] = _Count(int(value), now)
        with self._lock:
            if count.value + jobs > allowed:
                raise QuotaExceeded(
                    f"this tenant has {count.value} jobs queued or running and may have at "
                    f"most {allowed} (max_in_flight); this request adds {jobs}",
                    retry_after=2, limit="max_in_flight",
                    allowed=allowed, used=count.value,
                )  # fmt: skip
            count.value += jobs

    def _batch_rows(self, session: Session, tenant_id: int, rows: int, allowed: int) -> None:
        since = datetime.now(UTC) - DAY
        recent = list(
            session.execute(
                select(Batch.created_at, Batch.rows)
                .where(Batch.tenant_id == tenant_id, Batch.created_at > since)
                .order_by(Batch.created_at)
            )
        )
        used = sum(r.rows or 0 for r in recent)
        if used + rows <= allowed and (rows or used < allowed):
            return
        # Rows leave the 24 h window as their batches age: when enough will have left.
        excess, freed, wait = used + rows - allowed, 0, DAY.total_seconds()
        for r in recent:
            freed += r.rows or 0
            if freed >= max(excess, 1):
                wait = (r.created_at + DAY - datetime.now(UTC)).total_seconds()
                break
        raise QuotaExceeded(
            f"this tenant ran {used} batch rows in the last 24 h and may run at most "
            f"{allowed} (max_batch_rows_per_day); this batch has "
            f"{rows if rows else 'an unknown number of'} rows",
            retry_after=max(1, math.ceil(wait)), limit="max_batch_rows_per_day",
            allowed=allowed, used=used,
        )  # fmt: skip

    def _stored(self, session: Session, tenant_id: int, size: int, allowed: int) -> int:
        used = stored_bytes(session, tenant_id, self.settings.retention_s)
        if used + size <= allowed and used < allowed:
            return allowed - used - size
        raise QuotaExceeded(
            f"this tenant keeps {used} bytes of uploads and batch results and may keep at "
            f"most {allowed} (max_stored_bytes); this adds {size}. Delete files "
            "(DELETE /files/<id>) or wait for retention to remove old results",
            retry_after=60, limit="max_stored_bytes", allowed=allowed, used=used,
        )  # fmt: skip


_IN_FLIGHT = text(f"SELECT count(*) FROM jobs WHERE tenant_id = :tenant AND status IN ({OPEN_SQL})")


def stored_bytes(session: Session, tenant_id: int, retention_s: float) -> int:
    """Bytes the tenant keeps: its uploaded files, and its batches' results that
    retention has not deleted yet."""
    files = session.scalar(
        select(func.coalesce(func.sum(File.size_bytes), 0)).where(File.tenant_id == tenant_id)
    )
    results = select(func.coalesce(func.sum(Batch.result_bytes), 0)).where(
        Batch.tenant_id == tenant_id, Batch.result_bytes.is_not(None)
    )
    if retention_s > 0:
        kept_since = datetime.now(UTC) - timedelta(seconds=retention_s)
        results = results.where(Batch.finished_at > kept_since)
    return int(files or 0) + int(session.scalar(results) or 0)
