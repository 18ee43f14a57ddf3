"""The model repository changed under load (tests/churn.py): 16 clients of four
tenants on every door while a model is added and called everywhere, a copy of digits is
rolled to version 2, version 1 is unloaded and the added model removed. The doors
run in this process (HTTP over a real server, gRPC), over two real workers."""

from __future__ import annotations

import json
import shutil
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from flask import Flask

from app.container import Container
from app.grpc.server import door_settings, start
from app.platform.database import Database
from app.platform.settings import Settings
from app.web.context import container_of
from tests.churn import FINE, GONE, LATER, Churn, Repository
from tests.conftest import WorkerProcess, make_tenant
from tests.models import user_model
from tests.support import LiveServer

pytestmark = pytest.mark.processes

INLINE = "churn-inline"
ROLLED = "churn-digits"  # rolled and unloaded: not `digits`, whose states every test shares


@pytest.fixture
def own(settings: Settings, tmp_path: Path) -> Settings:
    """A repository and a queue of this test's own: digits under a name of its own,
    and digits run inline."""
    root = tmp_path / "models"
    shutil.copytree(settings.model_repository / "digits", root / ROLLED)
    shutil.copytree(settings.model_repository / "digits", root / INLINE)
    card = root / INLINE / "1" / "card.json"
    card.write_text(json.dumps({**json.loads(card.read_text()), "execution": "inline"}))
    return settings.with_overrides(model_repository=root,
                                   jobs_queue=f"churn-{uuid.uuid4().hex[:8]}")  # fmt: skip


@pytest.fixture
def workers(own: Settings, tmp_path: Path) -> Iterator[list[WorkerProcess]]:
    made = [WorkerProcess(own, tmp_path / f"worker{i}.log", concurrency=2) for i in range(2)]
    yield made
    for worker in made:
        worker.stop()


def test_every_call_is_answered_while_the_repository_changes_under_load(
    own: Settings, workers: list[WorkerProcess], make_app: Callable[..., Flask],
    serve: Callable[[Flask], LiveServer], database: Database, tmp_path: Path,
) -> None:  # fmt: skip
    app = make_app(own, max_waits_per_tenant=16)
    server = serve(app)
    door = start(Container(door_settings(own)), "127.0.0.1", 0)
    models = container_of(app).models
    digits = own.model_repository / ROLLED / "1" / "model.onnx"
    tenants = [make_tenant(database) for _ in range(4)]
    keys = [t.headers["Authorization"].removeprefix("Bearer ") for t in tenants]
    churn = Churn(server.url, f"127.0.0.1:{door.port}", keys, INLINE, ROLLED).start()
    third = f"third-{uuid.uuid4().hex[:6]}"
    try:
        churn.run(Repository(
            add_identity=lambda name: models.add(user_model("identity", tmp_path), name),
            add_version=lambda name: models.add(digits, name),
            unload=lambda name, version: models.unload(name, version),
            remove=lambda name: models.remove(name),
        ), third)  # fmt: skip
    finally:
        churn.stop()
        door.stop(0)
        door.container.close()
    outcomes = churn.outcomes
    assert not outcomes.unexpected, outcomes.unexpected[:20]
    assert outcomes.total({504}) == 0 and outcomes.total(FINE) > 200, outcomes.calls
    for door_name in ("http-json", "http-binary", "grpc-unary", "grpc-stream", "inline"):
        assert any(n for (d, _, s), n in outcomes.calls.items() if d == door_name and s == 200)
    assert set(outcomes.first_answer_s) == {"http-json", "http-binary", "grpc-unary"}
    gone = {(d, m) for (d, m, s), n in outcomes.calls.items() if s == GONE}
    assert all(m in ("third", f"{ROLLED}:1") for _, m in gone), gone  # only what went is 404
    assert outcomes.jobs, "async jobs were accepted"

    def statuses(_key: str, ids: list[str]) -> dict[str, str]:
        with database.engine.connect() as conn:
            query = sa.text("SELECT id::text, status FROM jobs WHERE id::text = ANY(:ids)")
            rows = conn.execute(query, {"ids": ids})
            return {row[0]: row[1] for row in rows}

    ended = churn.wait_for_jobs(statuses, 120)
    assert len(ended) == len(outcomes.jobs)
    assert all(s in ("succeeded", "failed") for s in ended.values()), ended
    print(json.dumps({"calls": {f"{d} {m} {s}": n for (d, m, s), n in outcomes.calls.items()},
                      "first_answer_s": outcomes.first_answer_s,
                      "refused_later": outcomes.total(LATER)}))  # fmt: skip
