"""A repository's look at its folder and shared states while they change under it:
a model removed during a scan, and a request that arrives while another thread's
look is under way (PostgreSQL and the folder are real; the clock is not)."""

from __future__ import annotations

import shutil
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
import sqlalchemy as sa

from app.platform.database import Database
from app.repository.registry import ModelRepository
from app.repository.states import SharedStates
from tests.support import FakeClock, wait_until


@pytest.fixture
def add_by_hand(model_repository: Path) -> Callable[[Path, str], None]:
    """Places a copy of digits as `name` under a root, as a hand or a PUT would."""

    def add(root: Path, name: str) -> None:
        shutil.copytree(model_repository / "digits" / "1", root / name / "1")

    return add


def test_a_scan_survives_models_removed_while_it_looks(
    tmp_path: Path, add_by_hand: Callable[[Path, str], None]
) -> None:
    root = tmp_path / "models"
    steady = [f"steady-{i}" for i in range(3)]
    for name in steady:
        add_by_hand(root, name)
    repository = ModelRepository(root, ttl_s=0)
    stop = threading.Event()

    def churn() -> None:  # folders come and go as `models remove` takes them
        while not stop.is_set():
            name = f"gone-{uuid.uuid4().hex[:6]}"
            add_by_hand(root, name)
            shutil.rmtree(root / name, ignore_errors=True)

    remover = threading.Thread(target=churn, daemon=True)
    remover.start()
    try:
        for _ in range(300):
            repository.sync(force=True)  # raised FileNotFoundError from pathlib's glob
            assert set(steady) <= set(repository.names()), repository.names()
    finally:
        stop.set()
        remover.join(10)


def test_a_look_under_way_is_waited_for_not_taken_for_done(
    database: Database, tmp_path: Path, add_by_hand: Callable[[Path, str], None]
) -> None:
    root = tmp_path / "models"
    add_by_hand(root, "first")
    clock = FakeClock()
    repository = ModelRepository(root, SharedStates(database.engine), ttl_s=2.0, clock=clock)
    assert repository.names() == ["first"]
    add_by_hand(root, "second")  # a model added by another process
    clock.advance(2.0)
    seen: dict[str, list[str]] = {}
    with database.engine.connect() as holder:  # the states' query waits on this lock
        holder.execute(sa.text("LOCK TABLE model_states IN ACCESS EXCLUSIVE MODE"))
        watch = threading.Thread(target=lambda: repository.sync(force=True))
        watch.start()  # the repository watch's look: stuck in its states query
        wait_until(lambda: waiting_on_a_lock(database), "the look waiting for the states")
        request = threading.Thread(target=lambda: seen.setdefault("names", repository.names()))
        request.start()  # a request's look, within the TTL of the one under way
        time.sleep(0.3)
        holder.commit()
    watch.join(30)
    request.join(30)
    assert seen["names"] == ["first", "second"]


def waiting_on_a_lock(database: Database) -> bool:
    with database.engine.connect() as conn:
        waiting = conn.execute(sa.text(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock' AND query ILIKE '%model_states%'"
        )).scalar_one()  # fmt: skip
    return bool(waiting)
