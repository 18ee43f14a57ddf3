"""Fixtures for the metrics and logs tests: a database and queues of their own,
so what they count and what they log is exactly what they did (no other test's
jobs, deliveries or schedules in the sweeps, the queue gauges or the counters),
and scrape helpers."""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import sqlalchemy as sa
from prometheus_client.parser import text_string_to_metric_families

from app.platform.database import engine_url
from app.platform.settings import ROOT, Settings
from tests.conftest import fresh_database, service_env
from tests.support import process_started, wait_until


@pytest.fixture(scope="module")
def isolated(settings: Settings) -> Iterator[Settings]:
    """The run's settings on a fresh database (every migration applied) and queues
    no other test uses; dropped afterwards."""
    tag = uuid.uuid4().hex[:6]
    name = f"{sa.engine.make_url(engine_url(settings.database_url)).database}_{tag}"
    with fresh_database(settings.database_url, name) as url:
        yield settings.with_overrides(
            database_url=url, jobs_queue=f"{settings.jobs_queue}-{tag}",
            control_queue=f"{settings.control_queue}-{tag}", webhooks_queue=f"hooks-{tag}",
        )  # fmt: skip


Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse(text: str) -> Samples:
    """Every sample of a Prometheus text page, by name and labels."""
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    """The sum of `name`'s samples whose labels include `labels` (0 if none)."""
    wanted = set(labels.items())
    return sum(v for (n, have), v in samples.items() if n == name and wanted <= have)


def scrape(url: str, token: str | None = None) -> Samples:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    response = requests.get(url, headers=headers, timeout=10)
    assert response.status_code == 200, response.text
    assert response.headers["Content-Type"].startswith("text/plain")
    return parse(response.text)


class Service:
    """A service process (the API under granian, a Celery worker, beat) with its
    stdout and stderr in files of their own."""

    def __init__(self, args: list[str], settings: Settings, folder: Path, name: str,
                 **env: str) -> None:  # fmt: skip
        self.stdout_path, self.stderr_path = folder / f"{name}.out", folder / f"{name}.err"
        self._out, self._err = self.stdout_path.open("wb"), self.stderr_path.open("wb")
        self.proc = subprocess.Popen(args, cwd=ROOT, env=service_env(settings, **env),
                                     stdout=self._out, stderr=self._err)  # fmt: skip
        process_started()

    def lines(self) -> list[str]:
        return self.stderr_path.read_text(errors="replace").splitlines()

    def json_lines(self) -> list[dict[str, Any]]:
        """Every stderr line, each of which must be a JSON object."""
        parsed = []
        for line in self.lines():
            try:
                parsed.append(json.loads(line))
            except json.JSONDecodeError:
                raise AssertionError(f"not a JSON line: {line!r}") from None
        assert all(isinstance(p, dict) for p in parsed)
        return parsed

    def wait_for(self, needle: str, timeout: float = 60) -> None:
        def seen() -> bool:
            assert self.proc.poll() is None, "exited:\n" + "\n".join(self.lines()[-40:])
            return needle in self.stderr_path.read_text(errors="replace")

        wait_until(seen, f"{needle!r} in {self.stderr_path.name}", timeout)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._out.close()
        self._err.close()
