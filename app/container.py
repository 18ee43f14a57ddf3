"""The composition root: every service of a process, built once from `Settings`.

The HTTP door (`create_app`), the Celery worker, beat, Flower, `manage.py` and
the benchmark each make one `Container`; nothing below the doors looks a
service up by itself. Services are made on first use, so a worker never opens
the API's event listener and the API never loads an ONNX Runtime session
(except for inline models); a lock makes "once" hold across threads.

`clock` (seconds, monotonic) is the one every cache of the container's
services times its lifetimes by: the API keys, the queue bound, the quotas, the
model states and the status board. Tests give a fake one to move time on.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Generic, TypeVar, overload

from app.jobs.guards import ALL_ON, Guards
from app.platform.embedded import resolve_urls
from app.platform.settings import Settings

if TYPE_CHECKING:
    import redis
    from celery import Celery
    from sqlalchemy.orm import Session

    from app.dataplane import DataPlane
    from app.dataplane.holds import Holds
    from app.jobs.admission import Admission
    from app.jobs.dispatch import Dispatcher
    from app.jobs.events import EventBus
    from app.jobs.inserts import JobInserter
    from app.jobs.replies import Replies, Reply
    from app.jobs.runner import Runtime
    from app.observability.metrics import QueueCollector
    from app.platform.database import Database
    from app.platform.filestore import FileStore
    from app.platform.logstreams import LogEngine
    from app.repository.registry import ModelRepository
    from app.status.board import StatusBoard
    from app.status.streams import StreamCollector
    from app.tenancy.keys import KeyCache
    from app.tenancy.quotas import Quotas

T = TypeVar("T")


class service(Generic[T]):
    """A property made once per container on first use, under the container's lock."""

    def __init__(self, build: Callable[[Container], T]) -> None:
        self.build, self.name = build, build.__name__
        self.__doc__ = build.__doc__

    @overload
    def __get__(self, container: None, owner: type) -> service[T]: ...
    @overload
    def __get__(self, container: Container, owner: type) -> T: ...
    def __get__(self, container: Container | None, owner: type) -> service[T] | T:
        if container is None:
            return self
        made = container._made
        if self.name not in made:
            with container._lock:
                if self.name not in made:
                    made[self.name] = self.build(container)
        value: T = made[self.name]
        return value


class Container:
    def __init__(
        self,
        settings: Settings,
        guards: Guards = ALL_ON,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`guards`: the safety guards the execute path, the sweeps and the drain
        task keep; all on, except in the fault suite's processes. `clock`: what
        every cache lifetime is measured with (tests pass a fake one)."""
        self.settings, self.guards, self.clock = settings, guards, clock
        self._made: dict[str, Any] = {}
        self._lock = threading.RLock()

    @classmethod
    def from_env(cls) -> Container:
        """From the environment, the embedded servers' URLs filled in."""
        return cls(resolve_urls(Settings.from_env()))

    @service
    def database(self) -> Database:
        from app.platform.database import Database

        return Database(
            self.settings.database_url,
            self.settings.db_pool_size,
            prepared_statements=self.settings.db_prepared_statements,
        )

    @service
    def store(self) -> FileStore:
        """Uploaded files and batch results (FILE_STORE_URL, else VAR_DIR/files)."""
        from app.platform.filestore import FileStore

        return FileStore(self.settings.store_url, self.settings.store_options)

    @contextmanager
    def unit_of_work(self) -> Iterator[Session]:
        """A scope for one task or command: its session, closed at the end."""
        with self.database.scope() as session:
            yield session

    @service
    def models(self) -> ModelRepository:
        from app.repository.registry import ModelRepository
        from app.repository.states import SharedStates

        settings = self.settings
        return ModelRepository(
            settings.model_repository,
            SharedStates(self.database.engine),
            settings.model_state_cache_seconds,
            clock=self.clock,
        )

    @service
    def events(self) -> EventBus:
        from app.jobs.events import EventBus

        return EventBus(self.database.engine)

    @service
    def celery(self) -> Celery:
        from app.platform.broker import make_celery

        return make_celery(self.settings, self.unit_of_work, beat_schedule(self.settings), self)

    @service
    def dispatcher(self) -> Dispatcher:
        from app.jobs.dispatch import Dispatcher

        settings, models = self.settings, self.models
        # Each model's wake-ups go to the queue its card names (or DEFAULT_MODEL_QUEUE).
        return Dispatcher(
            self.celery, settings.redis_url, settings.jobs_queue,
            lambda model: models.queue_of(model) or settings.model_queue,
        )  # fmt: skip

    @service
    def inserter(self) -> JobInserter:
        from app.jobs.inserts import JobInserter

        dispatcher = self.dispatcher
        return JobInserter(self.database.engine, lambda model: dispatcher.wake(model))

    @service
    def records(self) -> JobInserter:
        """The records of sync calls that ran inline, group-committed like submits."""
        from app.jobs.inserts import JobInserter

        return JobInserter(self.database.engine, None)

    @service
    def replies(self) -> Replies:
        """This process's reply channel: sync calls' answers from the workers."""
        from app.jobs.dispatch import redis_client
        from app.jobs.replies import Replies

        url = self.settings.redis_url
        return Replies(lambda: redis_client(url))

    @service
    def reply_redis(self) -> redis.Redis:
        """The worker's client for publishing answers (app.jobs.replies)."""
        from app.jobs.dispatch import redis_client

        return redis_client(self.settings.redis_url)

    def _publish_replies(self, replies: list[tuple[str, Reply]]) -> None:
        from app.jobs.replies import publish

        publish(self.reply_redis, replies)

    @service
    def admission(self) -> Admission:
        from app.jobs.admission import Admission

        return Admission(self.settings.max_queued_per_model, clock=self.clock)

    @service
    def quotas(self) -> Quotas:
        from app.tenancy.quotas import Quotas

        return Quotas(self.settings, clock=self.clock)

    @service
    def holds(self) -> Holds:
        from app.dataplane.holds import Holds

        return Holds(self.settings.max_waits_per_tenant, self.settings.max_waits)

    @service
    def requests_in_progress(self) -> Holds:
        """Each tenant's requests in progress on this API process, bounded by
        MAX_REQUESTS_PER_TENANT (0: unbounded)."""
        from app.dataplane.holds import Holds, Wording
        from app.errors import TooManyRequests

        wording = Wording(
            what="requests", per_tenant="MAX_REQUESTS_PER_TENANT", total="",
            advice="let one finish", refusal=TooManyRequests,
        )  # fmt: skip
        per_tenant = self.settings.max_requests_per_tenant or sys.maxsize
        return Holds(per_tenant, sys.maxsize, wording)

    @service
    def api_keys(self) -> KeyCache:
        from app.tenancy.keys import KeyCache

        return KeyCache(self.settings.api_key_cache_seconds, clock=self.clock)

    @service
    def runtime(self) -> Runtime:
        """The execute path's models and ONNX Runtime sessions (workers; inline models)."""
        from app.jobs.runner import Runtime
        from app.runtime.sessions import SessionPool

        settings = self.settings
        return Runtime(
            repository=self.models,
            sessions=SessionPool(settings.ort_provider, settings.ort_intra_op_threads),
            settings=settings,
            new_session=self.database.sessionmaker,
            store=self.store,
            guards=self.guards,
            reply=self._publish_replies,
        )

    @service
    def dataplane(self) -> DataPlane:
        from app.dataplane import DataPlane

        return DataPlane(
            self.settings, self.database, self.models, self.events, self.inserter,
            self.dispatcher, self.admission, self.quotas, self.holds, self.api_keys,
            self.status, self.store, sessions=lambda: self.runtime.sessions,
            records=self.records, replies=self.replies,
        )  # fmt: skip

    @service
    def status(self) -> StatusBoard:
        from app.status.board import StatusBoard
        from app.status.census import WorkerCensus
        from app.status.streams import read_streams

        settings = self.settings
        queues = (settings.jobs_queue, settings.webhooks_queue, settings.control_queue)
        ttl = settings.status_cache_seconds
        census = WorkerCensus(self.celery, settings.redis_url, queues, ttl, clock=self.clock)
        return StatusBoard(
            census, settings.retention_seconds, ttl, clock=self.clock,
            streams=lambda session: read_streams(session, self.logs, settings.streams_group),
        )  # fmt: skip

    @service
    def queue_metrics(self) -> QueueCollector:
        from app.observability.metrics import QueueCollector

        models = self.models
        return QueueCollector(self.database.engine, lambda: {card.name for card in models.all()})

    @service
    def logs(self) -> LogEngine:
        """The stream door's logs (Redis Streams at STREAMS_REDIS_URL, else REDIS_URL)."""
        from app.platform.logstreams import RedisLogs

        return RedisLogs.from_url(self.settings.logs_url)

    @service
    def stream_metrics(self) -> StreamCollector:
        """The stream bindings' lag, read when the API is scraped."""
        from app.status.streams import StreamCollector

        return StreamCollector(self.database.engine, self.logs, self.settings.streams_group)

    def after_fork(self) -> None:
        """In a forked child: fresh database connections (never the parent's sockets)."""
        if "database" in self._made:
            self.database.after_fork()

    def close(self) -> None:
        """Close the connection pool (tests and commands that make many containers)."""
        if "database" in self._made:
            self.database.engine.dispose()


def beat_schedule(settings: Settings) -> dict[str, dict[str, Any]]:
    """Periodic work, declared as data. Beat only sends these, on the control queue
    (never behind inference jobs), one pending message of each at most; the control
    worker runs them (see app.jobs.periodic)."""
    from app.jobs.dispatch import PURGE_TASK, SWEEP_TASK
    from app.jobs.periodic import periodic
    from app.schedules.service import TICK_TASK
    from app.webhooks.delivery import SWEEP_TASK as WEBHOOK_SWEEP_TASK

    return {
        "sweep-jobs": periodic(SWEEP_TASK, settings.sweep_interval_seconds, settings),
        "purge-old-job-data": periodic(PURGE_TASK, 3600.0, settings),
        "send-due-webhooks": periodic(WEBHOOK_SWEEP_TASK, 1.0, settings),
        "fire-schedules": periodic(TICK_TASK, settings.schedule_tick_seconds, settings),
    }
