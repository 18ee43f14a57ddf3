"""Every setting, declared once and read once from the environment.

Each field of `Settings` is the environment variable of its name in capitals, with
its type, default and description (the README's table is made from them:
`python manage.py settings`). `Settings.from_env()` is the only place that reads
`os.environ` for the service; everything else receives a `Settings`. Unset
`DATABASE_URL` / `REDIS_URL` mean "use the embedded PostgreSQL / Redis under
`VAR_DIR`" (see `app.platform.embedded`), which the launcher resolves to real URLs
before the processes start.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from app.platform.settings.doors import DoorSettings
from app.platform.settings.values import ROOT, Environment, SettingsError, problem

__all__ = ["ROOT", "Settings", "SettingsError"]


class Settings(DoorSettings):
    """Service settings: each field is the environment variable of its name in capitals
    (declared by group: app.platform.settings.service, .jobs and .doors, in the
    order the README's table lists them)."""

    model_config = SettingsConfigDict(frozen=True)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Keyword arguments only: `Settings(...)` never reads the environment (tests
        build theirs so, whatever the shell holds); `from_env` does."""
        return (init_settings,)

    @classmethod
    def from_env(cls) -> Settings:
        """The service's settings; a variable that holds a wrong value stops the start,
        named with what was expected."""
        values = Environment(cls)()
        if "var_dir" in values:  # DATA_DIR's default follows VAR_DIR
            values.setdefault("data_dir", str(Path(values["var_dir"]) / "data"))
        try:
            return cls(**values)
        except ValidationError as error:
            problems = "\n".join(problem(e) for e in error.errors())
            raise SettingsError(f"invalid settings in the environment:\n{problems}") from None

    def with_overrides(self, **changes: Any) -> Settings:
        """A copy with these fields changed, checked as any construction is."""
        return type(self)(**{**dict(self), **changes})

    @property
    def logs_url(self) -> str:
        """The Redis of the stream door's logs: STREAMS_REDIS_URL, else REDIS_URL."""
        return self.streams_redis_url or self.redis_url

    @property
    def store_url(self) -> str:
        """FILE_STORE_URL, else the directory VAR_DIR/files."""
        return self.file_store_url or str(self.var_dir / "files")

    @property
    def store_options(self) -> dict[str, Any]:
        """FILE_STORE_OPTIONS as the mapping fsspec takes."""
        options: dict[str, Any] = json.loads(self.file_store_options)
        return options

    @property
    def model_queue(self) -> str:
        """The queue of models whose card names none."""
        return self.default_model_queue or self.jobs_queue

    @property
    def inference_queues(self) -> tuple[str, ...]:
        """The queues an inference worker serves unless WORKER_QUEUES names them: the
        default model queue, and JOBS_QUEUE for batch splits."""
        return self.worker_queues or tuple(dict.fromkeys((self.model_queue, self.jobs_queue)))

    @property
    def broker_url(self) -> str:
        """The Redis URL in kombu's spelling: unix sockets are `redis+socket://`, and
        their database is `?virtual_host=N` (kombu ignores redis-py's `?db=N`)."""
        if self.redis_url.startswith("unix://"):
            path, _, query = self.redis_url[len("unix://") :].partition("?")
            params = [
                "virtual_host=" + p[len("db=") :] if p.startswith("db=") else p
                for p in query.split("&")
                if p
            ]
            return "redis+socket://" + path + ("?" + "&".join(params) if params else "")
        return self.redis_url
