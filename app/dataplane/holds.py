"""Requests that hold a thread while they wait (event streams, long-polls,
`Prefer: wait`, sync calls through the workers, gRPC streams) are counted per process:
each tenant may hold MAX_WAITS_PER_TENANT, all tenants together MAX_WAITS,
which is kept below the process's threads so ordinary requests (a submit,
a readiness check) always find one free. Beyond either, TooManyWaits.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from app.errors import TooManyWaits


class Holds:
    def __init__(self, per_tenant: int, total: int) -> None:
        self.per_tenant, self.total = per_tenant, total
        self._lock = threading.Lock()
        self._held: Counter[int] = Counter()

    def acquire(self, tenant_id: int) -> Callable[[], None]:
        """Count one more waiting request of the tenant; returns its release
        (idempotent). TooManyWaits when a limit is reached."""
        with self._lock:
            if self._held[tenant_id] >= self.per_tenant:
                raise TooManyWaits(
                    f"you already have {self.per_tenant} event streams, long-polls, sync calls "
                    "or gRPC streams open on this server (MAX_WAITS_PER_TENANT; on the gRPC "
                    "door GRPC_MAX_WAITS_PER_TENANT); close one, or poll without waiting",
                    retry_after=1, limit=self.per_tenant,
                )  # fmt: skip
            if sum(self._held.values()) >= self.total:
                raise TooManyWaits(
                    f"this server already holds {self.total} waiting requests (MAX_WAITS; on "
                    "the gRPC door GRPC_MAX_WAITS); retry shortly, or poll without waiting",
                    retry_after=1, limit=self.total,
                )  # fmt: skip
            self._held[tenant_id] += 1
        released = threading.Event()

        def release() -> None:
            with self._lock:
                if not released.is_set():
                    released.set()
                    self._held[tenant_id] -= 1
                    if self._held[tenant_id] <= 0:
                        del self._held[tenant_id]

        return release

    @contextmanager
    def holding(self, tenant_id: int) -> Iterator[None]:
        release = self.acquire(tenant_id)
        try:
            yield
        finally:
            release()
