"""The parts a process's operations are built from: the database, the broker and its
clients, the file store, the model repository and its ONNX Runtime sessions, and
the caches every request reads (keys, quotas, queue bounds, the status board).

Each is made on first use, once per process (a lock makes "once" hold across
threads), so a worker never opens the API's event listener and the API never
loads an ONNX Runtime session (except for inline models). `clock` (seconds,
monotonic) is the one every cache times its lifetimes by: tests give a fake one
to move time on. The container (app.container) builds the operations over these.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any, Generic, TypeVar, overload

from app.jobs.guards import ALL_ON, Guards
from app.platform.settings import Settings

if TYPE_CHECKING:
    from celery import Celery
    from prometheus_client.registry import Collector

    from app.execution.dispatch import Dispatcher
    from app.execution.runner import Runner
    from app.jobs.admission import Admission
    from app.jobs.events import EventBus
    from app.jobs.inserts import JobInserter
    from app.operations.holds import Holds
    from app.platform.database import Database
    from app.platform.filestore import FileStore
    from app.platform.logstreams import LogEngine
    from app.repository.generation import Reconciler
    from app.repository.registry import ModelRepository
    from app.runtime.sessions import SessionPool
    from app.status.board import StatusBoard
    from app.sync.lane import Lane
    from app.sync.records import RecordWriter
    from app.sync.replies import Replies, Reply
    from app.tenancy.keys import KeyCache
    from app.tenancy.quotas import Quotas

T = TypeVar("T")
Owner = TypeVar("Owner", bound="Lazy")


class Lazy:
    """An object whose `made` parts are built once, on first use, under its lock."""

    def __init__(self) -> None:
        self._made: dict[str, Any] = {}
        self._lock = threading.RLock()

    def built(self, name: str) -> bool:
        """Whether the part `name` was made (so closing it has anything to do)."""
        return name in self._made


class made(Generic[Owner, T]):
    """A part made once per owner on first use, under the owner's lock."""

    def __init__(self, build: Callable[[Owner], T]) -> None:
        self.build, self.name = build, build.__name__
        self.__doc__ = build.__doc__

    @overload
    def __get__(self, owner: None, kind: type) -> made[Owner, T]: ...
    @overload
    def __get__(self, owner: Owner, kind: type) -> T: ...
    def __get__(self, owner: Owner | None, kind: type) -> made[Owner, T] | T:
        if owner is None:
            return self
        parts = owner._made
        if self.name not in parts:
            with owner._lock:
                if self.name not in parts:
                    parts[self.name] = self.build(owner)
        value: T = parts[self.name]
        return value


class Parts(Lazy):
    def __init__(
        self,
        settings: Settings,
        guards: Guards = ALL_ON,
        *,
        clock: Callable[[], float] = time.monotonic,
        tasks_reach: object = None,
    ) -> None:
        """`guards`: the safety guards the execute path, the sweeps and the drain
        task keep; all on, except in the fault suite's processes. `tasks_reach`:
        what Celery tasks reach as `self.app.services` (the container)."""
        super().__init__()
        self.settings, self.guards, self.clock = settings, guards, clock
        self._tasks_reach = tasks_reach

    @made
    def database(self) -> Database:
        from app.platform.database import Database

        return Database(
            self.settings.database_url,
            self.settings.db_pool_size,
            prepared_statements=self.settings.db_prepared_statements,
        )

    @made
    def store(self) -> FileStore:
        """Uploaded files and batch results (FILE_STORE_URL, else VAR_DIR/files)."""
        from app.platform.filestore import FileStore

        return FileStore(self.settings.store_url, self.settings.store_options)

    @made
    def repository(self) -> ModelRepository:
        """The model repository's cards, with the load states every process shares."""
        from app.repository.registry import ModelRepository
        from app.repository.states import SharedStates

        settings = self.settings
        return ModelRepository(
            settings.model_repository,
            SharedStates(self.database.engine),
            settings.model_state_cache_seconds,
            clock=self.clock,
        )

    @made
    def reconciler(self) -> Reconciler:
        """Follows the repository generation (app.repository.generation): what this
        process holds per model version is closed once the version stops serving."""
        from app.generation import formats, oneshot
        from app.platform.broker import redis_client
        from app.repository.generation import Reconciler
        from app.runtime import code, pipeline

        url = self.settings.redis_url
        reconciler = Reconciler(self.repository, lambda: redis_client(url))
        reconciler.hold(pipeline.retain)
        reconciler.hold(code.retain)
        reconciler.hold(oneshot.retain)
        reconciler.hold(formats.retain)
        return reconciler

    @made
    def events(self) -> EventBus:
        from app.jobs.events import EventBus

        return EventBus(self.database.engine)

    @made
    def celery(self) -> Celery:
        """The Celery app: every task a scope of this process's database (its session
        closed when the task ends); tasks reach their container as `app.services`."""
        from app.platform.broker import make_celery

        settings = self.settings
        return make_celery(
            settings, self.database.scope, beat_schedule(settings), self._tasks_reach
        )

    @made
    def dispatcher(self) -> Dispatcher:
        from app.execution.dispatch import Dispatcher

        settings, repository = self.settings, self.repository
        # Each model's wake-ups go to the queue its card names (or DEFAULT_MODEL_QUEUE).
        return Dispatcher(
            self.celery, settings.redis_url, settings.jobs_queue,
            lambda model: repository.queue_of(model) or settings.model_queue,
        )  # fmt: skip

    @made
    def inserter(self) -> JobInserter:
        """The process's coalesced job INSERTs, their models woken once committed."""
        from app.jobs.inserts import JobInserter

        dispatcher = self.dispatcher
        return JobInserter(self.database, lambda model: dispatcher.wake(model))

    @made
    def records(self) -> RecordWriter:
        """The records of sync calls answered without a job row first (inline, or
        on the sync lane): journaled in Redis, written behind."""
        from app.jobs import telemetry
        from app.sync.records import RecordWriter

        return RecordWriter(self.database, lambda: self._reply_redis, telemetry.recorded)

    @made
    def lane(self) -> Lane:
        """The sync lane's Redis side (app.sync.lane)."""
        from app.sync.lane import Lane

        return Lane(self._reply_redis, self.settings.sync_lane_max_waiting)

    @made
    def replies(self) -> Replies:
        """This process's reply channel: sync calls' answers from the workers."""
        from app.platform.broker import redis_client
        from app.sync.replies import Replies

        url = self.settings.redis_url
        return Replies(lambda: redis_client(url))

    @made
    def _reply_redis(self) -> Any:
        """The worker's client for publishing answers (app.sync.replies)."""
        from app.platform.broker import redis_client

        return redis_client(self.settings.redis_url)

    def _publish_replies(self, replies: list[tuple[str, Reply]]) -> None:
        from app.sync.replies import publish

        publish(self._reply_redis, replies)

    @made
    def limits(self) -> Limits:
        """What bounds each tenant and model on this process: admission, quotas,
        waits and the API key cache."""
        return Limits(self.settings, self.clock)

    @made
    def _sessions(self) -> SessionPool:
        """ONNX Runtime sessions (workers: the runner's; the API: inline models')."""
        from app.runtime.sessions import SessionPool

        settings = self.settings
        sessions = SessionPool(
            settings.ort_provider, settings.ort_intra_op_threads,
            max_loaded=settings.max_loaded_models,
        )  # fmt: skip
        self.reconciler.hold(sessions.retain)
        return sessions

    @made
    def runner(self) -> Runner:
        """What runs claimed jobs: the models, their sessions, leases kept meanwhile."""
        from app.execution.runner import Runner, RunSettings
        from app.operations.execution import StepStore, renew_leases

        settings = RunSettings.of(self.settings)
        return Runner(
            repository=self.repository,
            sessions=self._sessions,
            settings=settings,
            store=self.store,
            renew=partial(renew_leases, self.database, settings.lease_s),
            guards=self.guards,
            reply=self._publish_replies,
            steps=StepStore(self.database),
        )

    @made
    def status_board(self) -> StatusBoard:
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

    @made
    def logs(self) -> LogEngine:
        """The stream door's logs (Redis Streams at STREAMS_REDIS_URL, else REDIS_URL)."""
        from app.platform.logstreams import RedisLogs

        return RedisLogs.from_url(self.settings.logs_url)

    @made
    def collectors(self) -> list[Collector]:
        """What /metrics reads at scrape time: each model's queue, each binding's lag."""
        from app.observability.metrics import QueueCollector
        from app.status.streams import StreamCollector

        engine, repository, settings = self.database.engine, self.repository, self.settings
        return [
            QueueCollector(engine, lambda: {card.name for card in repository.all()}),
            StreamCollector(engine, self.logs, settings.streams_group),
        ]


class Limits(Lazy):
    """The per-tenant and per-model bounds of one process, and who a key belongs to."""

    def __init__(self, settings: Settings, clock: Callable[[], float]) -> None:
        super().__init__()
        self.settings, self.clock = settings, clock

    @made
    def admission(self) -> Admission:
        from app.jobs.admission import Admission

        return Admission(self.settings.max_queued_per_model, clock=self.clock)

    @made
    def quotas(self) -> Quotas:
        from app.tenancy.quotas import Quotas, QuotaSettings

        return Quotas(QuotaSettings.of(self.settings), clock=self.clock)

    @made
    def holds(self) -> Holds:
        """Each tenant's waiting requests on this process (MAX_WAITS_PER_TENANT, MAX_WAITS)."""
        from app.operations.holds import Holds

        return Holds(self.settings.max_waits_per_tenant, self.settings.max_waits)

    @made
    def api_keys(self) -> KeyCache:
        from app.tenancy.keys import KeyCache

        return KeyCache(self.settings.api_key_cache_seconds, clock=self.clock)


def beat_schedule(settings: Settings) -> dict[str, dict[str, Any]]:
    """Periodic work, declared as data. Beat only sends these, on the control queue
    (never behind inference jobs), one pending message of each at most; the control
    worker runs them (see app.platform.periodic)."""
    from app.execution.dispatch import PURGE_TASK, SWEEP_TASK
    from app.platform.periodic import periodic
    from app.schedules.firing import TICK_TASK
    from app.webhooks.delivery import SWEEP_TASK as WEBHOOK_SWEEP_TASK

    return {
        "sweep-jobs": periodic(SWEEP_TASK, settings.sweep_interval_seconds, settings),
        "purge-old-job-data": periodic(PURGE_TASK, settings.purge_interval_seconds, settings),
        "send-due-webhooks": periodic(WEBHOOK_SWEEP_TASK, 1.0, settings),
        "fire-schedules": periodic(TICK_TASK, settings.schedule_tick_seconds, settings),
    }
