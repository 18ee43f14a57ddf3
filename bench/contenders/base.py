"""What every contender served over HTTP gives the workloads: where to submit,
where its jobs are recorded, and which processes are its roles."""

from __future__ import annotations

import abc
import logging
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING

from bench.completion import JobStore
from bench.cpu import RoleMeter
from bench.infra import Servers
from bench.load import Endpoint

if TYPE_CHECKING:
    from bench.grpc_load import GrpcEndpoint

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class StreamDoor:
    """A contender's stream binding (h): its Redis and the full names of its logs."""

    redis_url: str
    input: str
    output: str


@dataclass(frozen=True)
class Context:
    """Shared by every contender of one run."""

    servers: Servers
    run_id: str
    log_dir: Path
    model_repository: Path
    # Roles every contender shares: the PostgreSQL postmaster tree and Redis.
    postgres_pid: int | None
    redis_pid: int | None

    def shared_trees(self, postgres: bool = True) -> dict[int, str]:
        trees: dict[int, str] = {}
        if postgres and self.postgres_pid:
            trees[self.postgres_pid] = "postgres"
        if self.redis_pid:
            trees[self.redis_pid] = "redis"
        return trees


class HttpContender(abc.ABC):
    """Started once per run; the workloads then submit to `endpoint`, wait on
    `store` and sample `meter`. Use as a context manager: stop() always runs."""

    name: str = ""
    description: str = ""
    runs_heavy_model: bool = True
    runs_embedding_model: bool = False  # (m): serves minilm's text jobs
    soaks: bool = False  # (n): its worker children can be killed, its jobs counted

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.endpoint: Endpoint | None = None
        self.sync_endpoint: Endpoint | None = None  # (f), where the contender has one
        self.inline_endpoint: Endpoint | None = None  # (l): (f) on a model run inline
        self.bulk_endpoint: Endpoint | None = None  # (k), where it may have POST /jobs/bulk
        self.batch_port: int | None = None  # (g): /files and /batches, where it has them
        self.grpc_endpoint: GrpcEndpoint | None = None  # (h), (i), where it has a gRPC door
        self.stream: StreamDoor | None = None  # (j), where it has a stream door
        self.store: JobStore | None = None
        self.meter = RoleMeter()

    @abc.abstractmethod
    def start(self) -> None: ...

    @abc.abstractmethod
    def stop(self) -> None: ...

    def log_path(self, part: str) -> Path:
        return self.ctx.log_dir / f"{self.name}-{part}.log"

    def __enter__(self) -> HttpContender:
        try:
            self.start()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            self.stop()
        finally:
            if self.store is not None:
                self.store.close()
                self.store = None
