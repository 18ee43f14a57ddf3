"""Every setting, read once from the environment.

`Settings.from_env()` is the only place that reads `os.environ` for the service;
everything else receives a `Settings`. Unset `DATABASE_URL` / `REDIS_URL` mean
"use the embedded PostgreSQL / Redis under `VAR_DIR`" (see `app.embedded`),
which the launcher resolves to real URLs before the processes start.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    return int(raw) if raw not in (None, "") else default


def _env_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    return float(raw) if raw not in (None, "") else default


def _env_str(name: str, default: str) -> str:
    raw = os.environ.get(name)
    return raw if raw not in (None, "") else default


@dataclass(frozen=True)
class Settings:
    """Service settings. Field comments name the environment variable."""

    # DATABASE_URL: SQLAlchemy URL of PostgreSQL; empty = embedded server under VAR_DIR.
    database_url: str = ""
    # REDIS_URL: redis://host:port/db or unix:///path.sock; empty = embedded server.
    redis_url: str = ""
    # VAR_DIR: where the embedded PostgreSQL and Redis keep their data.
    var_dir: Path = field(default_factory=lambda: ROOT / "var")
    # MODEL_REPOSITORY: <name>/<version>/model.onnx + card.json.
    model_repository: Path = field(default_factory=lambda: ROOT / "models")
    # MAX_REQUEST_BYTES: request bodies above this are refused with 413.
    max_request_bytes: int = 8 * 1024 * 1024
    # JOBS_QUEUE: the Celery queue that inference jobs travel on.
    jobs_queue: str = "inference"
    # JOB_MAX_ATTEMPTS: how many times a job may be claimed by a worker before it fails.
    job_max_attempts: int = 3
    # REPUBLISH_AFTER_SECONDS: a queued job not picked up for this long is published again.
    republish_after_seconds: float = 60.0
    # ORT_PROVIDER: auto (CUDA when it works, else CPU), cuda or cpu.
    ort_provider: str = "auto"
    # ORT_INTRA_OP_THREADS: threads per ONNX Runtime session (0 = ORT's default).
    ort_intra_op_threads: int = 1
    # LOG_LEVEL
    log_level: str = "INFO"

    @classmethod
    def from_env(cls) -> Settings:
        d = cls()
        return cls(
            database_url=_env_str("DATABASE_URL", d.database_url),
            redis_url=_env_str("REDIS_URL", d.redis_url),
            var_dir=Path(_env_str("VAR_DIR", str(d.var_dir))),
            model_repository=Path(_env_str("MODEL_REPOSITORY", str(d.model_repository))),
            max_request_bytes=_env_int("MAX_REQUEST_BYTES", d.max_request_bytes),
            jobs_queue=_env_str("JOBS_QUEUE", d.jobs_queue),
            job_max_attempts=_env_int("JOB_MAX_ATTEMPTS", d.job_max_attempts),
            republish_after_seconds=_env_float(
                "REPUBLISH_AFTER_SECONDS", d.republish_after_seconds
            ),
            ort_provider=_env_str("ORT_PROVIDER", d.ort_provider).lower(),
            ort_intra_op_threads=_env_int("ORT_INTRA_OP_THREADS", d.ort_intra_op_threads),
            log_level=_env_str("LOG_LEVEL", d.log_level).upper(),
        )

    def with_overrides(self, **changes: object) -> Settings:
        return replace(self, **changes)  # type: ignore[arg-type]

    @property
    def broker_url(self) -> str:
        """The Redis URL in kombu's spelling (unix sockets are `redis+socket://`)."""
        if self.redis_url.startswith("unix://"):
            return "redis+socket://" + self.redis_url[len("unix://") :]
        return self.redis_url
