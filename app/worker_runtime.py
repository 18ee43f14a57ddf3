"""The workers' runtime, built from a container's parts: what a worker process
runs beside the operations the doors call, and the only side that starts
threads of its own (the sync lane's server, the decode loop's leases).

A Celery task reaches it as `container.worker`: the drain of a model's queued
jobs (`execution`), the decode loop of a generative model (`generation`, the
core of app.engine), a worker child's sync-lane consumers (`lane_server`) and
beat's sweeps and purges (`maintenance`). The API's processes never make it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from app.jobs.guards import ALL_ON, Guards
from app.parts import Lazy, Parts, made
from app.platform.settings import Settings

if TYPE_CHECKING:
    from app.engine.core import Generation
    from app.engine.lane_server import LaneServer
    from app.operations.execution import Execution
    from app.operations.maintenance import Maintenance


class WorkerRuntime(Lazy):
    def __init__(self, parts: Parts, settings: Settings, guards: Guards = ALL_ON) -> None:
        super().__init__()
        self.parts, self.settings, self.guards = parts, settings, guards

    @made
    def execution(self) -> Execution:
        """Claiming, running and finishing jobs (the workers; inline calls' tests)."""
        from app.operations.execution import DrainSettings, Execution

        parts = self.parts
        return Execution(
            parts.database, parts.runner, parts.dispatcher, DrainSettings.of(self.settings)
        )

    @made
    def generation(self) -> Generation:
        """The decode loop of generative models (app.engine)."""
        from app.engine.core import Generation, GenerationSettings

        parts = self.parts
        generation = Generation.of(
            parts.database, parts.runner, parts.dispatcher, lambda: parts._reply_redis,
            GenerationSettings.of(self.settings), self.settings.ort_provider,
        )  # fmt: skip
        parts.reconciler.hold(generation.engines.retain)
        return generation

    @made
    def lane_server(self) -> LaneServer:
        """A worker child's sync-lane threads (started after the fork)."""
        from app.engine.lane_server import LaneServer
        from app.platform.broker import redis_client
        from app.sync.lane import Lane

        parts, settings = self.parts, self.settings
        url = settings.redis_url
        return LaneServer(
            lambda: Lane(redis_client(url), settings.sync_lane_max_waiting),
            parts.repository, parts.runner.sessions, parts.records,
            settings.sync_lane_lease_seconds, self.guards,
        )  # fmt: skip

    @made
    def maintenance(self) -> Maintenance:
        """Beat's sweeps and purges."""
        from app.operations.maintenance import Maintenance, MaintenanceSettings

        parts = self.parts
        return Maintenance(
            parts.database, parts.dispatcher, parts.store,
            MaintenanceSettings.of(self.settings), self.guards,
        )  # fmt: skip

    def hand_over(self) -> None:
        """A worker shutting down: its children's decode loops hand their generations
        to other workers rather than finish them first."""
        from app.engine.loop import ask_hand_over

        ask_hand_over(self.settings.redis_url)

    def stop_lanes(self) -> None:
        """A worker child exiting: its lane consumers stop, and say so."""
        if self.built("lane_server"):
            self.lane_server.stop()
