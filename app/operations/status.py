"""Service status: the status page's numbers and the readiness of what the
service needs (PostgreSQL, Redis, a built model). Reads only."""

from __future__ import annotations

from collections.abc import Callable

import redis
from prometheus_client.registry import Collector
from sqlalchemy.exc import SQLAlchemyError

from app.observability import metrics
from app.platform.database import Database
from app.status.board import Status, StatusBoard, read_status
from app.status.representation import StatusSchema, status_dict

__all__ = ["Status", "StatusOperations", "StatusSchema", "status_dict"]


class StatusOperations:
    def __init__(
        self,
        database: Database,
        board: StatusBoard,
        redis_url: str,
        public_models: Callable[[], set[str]],
        models_built: Callable[[], str],
        collectors: Callable[[], list[Collector]],
    ) -> None:
        """`public_models`: the models open to every tenant (named on the public
        page); `models_built`: `ok`, or why no model can serve; `collectors`: what
        /metrics reads from PostgreSQL and the logs at scrape time."""
        self.database, self._board, self._redis_url = database, board, redis_url
        self._public_models, self._models_built = public_models, models_built
        self._collectors = collectors

    def status(self, *, operator: bool) -> Status:
        """Aggregates of the public models for anyone, the whole board with the
        newest dead letters for an operator."""
        session = self.database.session()
        return read_status(session, self._board, self._public_models(), operator=operator)

    def readiness(self) -> dict[str, str]:
        """Each dependency's state, `ok` or why not: PostgreSQL and Redis answer, and
        at least one model is built."""
        return {"database": self._database(), "redis": self._redis(),
                "models": self._models_built()}  # fmt: skip

    def metrics(self) -> bytes:
        """Prometheus text of this process tree, each model's queue and each stream
        binding's lag (read now, under a statement timeout)."""
        return metrics.exposition(*self._collectors())

    def _database(self) -> str:
        try:
            self.database.ping()
        except SQLAlchemyError as exc:
            return f"unreachable ({type(exc).__name__})"
        return "ok"

    def _redis(self) -> str:
        try:
            client = redis.Redis.from_url(
                self._redis_url, socket_timeout=2, socket_connect_timeout=2
            )
            client.ping()
        except (redis.RedisError, OSError) as exc:
            return f"unreachable ({type(exc).__name__})"
        return "ok"
