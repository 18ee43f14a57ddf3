"""The composition root: every operation of a process, built once from `Settings`.

The HTTP door (`create_app`), the gRPC and stream doors, the Celery worker, beat,
Flower, the CLI and the benchmark each make one `Container`; nothing below the
doors looks a service up by itself. A door calls the operations it needs
(`container.jobs.submit(...)`), each given only what it uses: its part of the
settings and the parts (app.parts) it is built from. Both are made on first use.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from app.jobs.guards import ALL_ON, Guards
from app.parts import Lazy, Parts, made
from app.platform.embedded import resolve_urls
from app.platform.settings import Settings

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

    from app.operations.batches import BatchOperations
    from app.operations.bindings import BindingOperations
    from app.operations.calls import CallOperations
    from app.operations.dead_letters import DeadLetterOperations
    from app.operations.files import FileOperations
    from app.operations.jobs import JobOperations
    from app.operations.models import ModelOperations
    from app.operations.openai_door import OpenAIOperations
    from app.operations.schedules import ScheduleOperations
    from app.operations.status import StatusOperations
    from app.operations.submission import Submitter
    from app.operations.tenants import TenantOperations
    from app.operations.webhooks import WebhookOperations
    from app.worker_runtime import WorkerRuntime


class Container(Lazy):
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
        super().__init__()
        self.settings, self.guards, self.clock = settings, guards, clock
        self.parts = Parts(settings, guards, clock=clock, tasks_reach=self)

    @classmethod
    def from_env(cls) -> Container:
        """From the environment, the embedded servers' URLs filled in."""
        return cls(resolve_urls(Settings.from_env()))

    @contextmanager
    def scope(self) -> Iterator[Session]:
        """A scope for one task, command or call: its session, closed at the end."""
        with self.parts.database.scope() as session:
            yield session

    def end_scope(self) -> None:
        """End a scope a door began without `scope()`: an HTTP request, whose session
        is made on first use and closed at its teardown."""
        self.parts.database.end_scope()

    def after_fork(self) -> None:
        """In a forked child: fresh database connections (never the parent's sockets)."""
        if self.parts.built("database"):
            self.parts.database.after_fork()

    def close(self) -> None:
        """Close the connection pool and stop following the repository (tests and
        commands that make many containers)."""
        if self.parts.built("reconciler"):
            self.parts.reconciler.stop()
        if self.parts.built("database"):
            self.parts.database.engine.dispose()

    # -- the operations, one per domain --------------------------------------------

    @made
    def _submitter(self) -> Submitter:
        from app.operations.submission import SubmitSettings, Submitter
        from app.webhooks.ssrf import UrlPolicy, networks

        parts, settings = self.parts, self.settings
        policy = UrlPolicy(
            settings.webhook_allow_private_networks, networks(settings.webhook_allowed_networks)
        )
        return Submitter(
            parts.database, parts.repository, parts.inserter, parts.dispatcher,
            parts.limits.admission, parts.limits.quotas,
            SubmitSettings(settings.job_max_attempts, policy),
        )  # fmt: skip

    @made
    def jobs(self) -> JobOperations:
        from app.operations.jobs import JobOperations

        parts = self.parts
        return JobOperations(
            parts.database, self._submitter, parts.limits.holds, parts.events,
            parts.records.write_now,
        )  # fmt: skip

    @made
    def openai(self) -> OpenAIOperations:
        """The OpenAI-compatible door's: generation calls that follow their job,
        durable responses, embeddings as sync calls."""
        from app.operations.completions import Completions
        from app.operations.embeddings import Embeddings
        from app.operations.openai_door import OpenAIOperations
        from app.operations.responses import Responses

        parts, settings = self.parts, self.settings
        completions = Completions(
            parts.database, self.jobs, self._submitter, parts.repository,
            lambda: parts._reply_redis, settings.job_time_limit_seconds + 60,
        )  # fmt: skip
        return OpenAIOperations(
            completions, Responses(parts.database, self.jobs, completions),
            Embeddings(self.calls, self._submitter),
        )  # fmt: skip

    @made
    def calls(self) -> CallOperations:
        """Sync calls (the HTTP and gRPC inference doors)."""
        from app.operations.calls import CallOperations, CallSettings, InlineRuns, LaneCalls
        from app.sync.recovery import Recovery

        parts, settings = self.parts, self.settings
        inline = InlineRuns(lambda: parts._sessions, parts.records, parts.repository)
        timing = CallSettings(
            settings.sync_timeout_seconds, settings.max_wait_seconds, settings.sync_lane
        )
        lane = LaneCalls(
            parts.lane, Recovery(parts.lane), parts.replies, parts.dispatcher.queue_for
        )
        return CallOperations(
            parts.database, self._submitter, self.jobs, parts.limits.holds, parts.replies, inline,
            timing, lane,
        )  # fmt: skip

    @made
    def batches(self) -> BatchOperations:
        from app.batches.creation import Chunking
        from app.operations.batches import BatchOperations, BatchSettings

        parts, settings = self.parts, self.settings
        batch_settings = BatchSettings(
            Chunking.of(settings), self._submitter.settings.webhooks,
            settings.republish_after_seconds,
        )  # fmt: skip
        return BatchOperations(
            parts.database, parts.store, parts.repository,
            (parts.limits.quotas, parts.limits.admission), parts.dispatcher, batch_settings,
        )  # fmt: skip

    @made
    def files(self) -> FileOperations:
        from app.operations.files import FileOperations

        parts = self.parts
        return FileOperations(
            parts.database, parts.store, parts.limits.quotas, self.settings.max_upload_bytes
        )

    @made
    def dead_letters(self) -> DeadLetterOperations:
        from app.operations.dead_letters import DeadLetterOperations

        return DeadLetterOperations(self.parts.database, self._submitter)

    @made
    def schedules(self) -> ScheduleOperations:
        from app.batches.creation import Chunking
        from app.operations.schedules import ScheduleOperations
        from app.schedules.definitions import Rules

        parts, settings = self.parts, self.settings
        rules = Rules(
            parts.repository, settings.data_dir, Chunking.of(settings), settings.max_upload_bytes,
            settings.schedule_catch_up_seconds,
        )  # fmt: skip
        return ScheduleOperations(parts.database, parts.store, rules)

    @made
    def bindings(self) -> BindingOperations:
        """Stream bindings, and the stream door's consumers and publishers."""
        from app.operations.bindings import BindingOperations, BindingSettings

        settings = self.settings
        binding = BindingSettings(settings.streams_prefix, settings.retention_seconds)
        return BindingOperations(self.parts.database, self._submitter, binding)

    @made
    def models(self) -> ModelOperations:
        """Model cards, readiness, and the model repository's control."""
        from app.operations.models import ModelOperations

        parts = self.parts
        return ModelOperations(parts.database, parts.repository, parts.reconciler.announce)

    @made
    def tenants(self) -> TenantOperations:
        """Who a key belongs to; tenants' keys, quotas and webhook secrets."""
        from app.operations.tenants import TenantOperations

        parts = self.parts
        return TenantOperations(parts.database, parts.limits.api_keys, parts.limits.quotas)

    @made
    def webhooks(self) -> WebhookOperations:
        """Delivery logs, redelivery, disabled URLs and usage; the webhook senders."""
        from app.operations.webhooks import WebhookOperations
        from app.webhooks.delivery import DeliverySettings

        return WebhookOperations(self.parts.database, DeliverySettings.of(self.settings))

    @made
    def status(self) -> StatusOperations:
        """The status page, readiness and /metrics."""
        from app.operations.status import StatusOperations
        from app.repository.registry import PUBLIC

        parts, models = self.parts, self.models
        return StatusOperations(
            parts.database, parts.status_board, self.settings.redis_url,
            lambda: set(parts.repository.names(PUBLIC)), models.built, lambda: parts.collectors,
        )  # fmt: skip

    @made
    def worker(self) -> WorkerRuntime:
        """The workers' runtime (app.worker_runtime): the drain, the decode loop, the
        sync lane's server, beat's sweeps. Made in worker and beat processes only."""
        from app.worker_runtime import WorkerRuntime

        return WorkerRuntime(self.parts, self.settings, self.guards)
