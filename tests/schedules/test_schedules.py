"""Beat schedules on real parts: schedules in PostgreSQL, two real `celery beat`
processes ticking every half second, a real worker firing due schedules and
running each run's batch, results written into the tenant's data area."""

from __future__ import annotations

import io
import itertools
import json
import os
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import sqlalchemy as sa
from click.testing import CliRunner
from flask import Flask
from flask.testing import FlaskClient

from app import create_app
from app.batches.tables import Batch
from app.cards import ModelCard
from app.platform.database import Database
from app.platform.settings import Settings
from app.runtime.sessions import SessionPool
from app.schedules import definitions, firing, paths
from app.schedules.tables import Schedule
from app.tenancy.tables import Tenant
from app.web.context import container_of
from tests.conftest import BeatProcess, TenantAuth, WorkerProcess, make_tenant
from tests.support import starts_processes, wait_until

RNG = np.random.default_rng(5)
EVERY_2_S = "* * * * * */2"  # six fields, seconds last: a compressed clock


def area(database: Database, settings: Settings, tenant: TenantAuth) -> Path:
    with database.sessionmaker() as session:
        name = session.scalar(sa.select(Tenant.name).where(Tenant.id == tenant.id))
    assert name is not None
    root = paths.tenant_root(settings.data_dir, tenant.id, name)
    root.mkdir(parents=True, exist_ok=True)
    return root


def write_jsonl(path: Path, pixels: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"pixels": row.tolist()}) + "\n" for row in pixels))


def runs(client: FlaskClient, tenant: TenantAuth, schedule_id: str) -> list[dict[str, Any]]:
    response = client.get(f"/schedules/{schedule_id}/runs?limit=200", headers=tenant.headers)
    assert response.status_code == 200, response.json
    items: list[dict[str, Any]] = response.json["items"]
    return items


@pytest.fixture
@starts_processes
def two_beats(settings: Settings, tmp_path: Path) -> Iterator[list[BeatProcess]]:
    # DEBUG: the test reads the ticks a beat sent, which it logs at DEBUG only.
    beats = [BeatProcess(settings, tmp_path, name, SCHEDULE_TICK_SECONDS="0.5", LOG_LEVEL="DEBUG")
             for name in ("beat-a", "beat-b")]  # fmt: skip
    yield beats
    for beat in beats:
        beat.stop()


def test_two_beats_fire_each_tick_once_and_runs_write_their_results(
    client: FlaskClient,
    tenant: TenantAuth,
    database: Database,
    settings: Settings,
    worker: WorkerProcess,
    control_worker: WorkerProcess,
    model_repository: Path,
    two_beats: list[BeatProcess],
) -> None:
    root = area(database, settings, tenant)
    pixels = (RNG.random((30, 64)) * 16).astype(np.float32)
    write_jsonl(root / "incoming" / "a.jsonl", pixels[:10])
    write_jsonl(root / "incoming" / "b.jsonl", pixels[10:])
    body = {"name": "nightly", "cron": EVERY_2_S, "model": "digits",
            "input": {"path": "incoming"}, "output": "scored"}  # fmt: skip
    response = client.post("/schedules", json=body, headers=tenant.headers)
    assert response.status_code == 201, response.json
    schedule = response.json
    assert response.headers["Location"] == f"/schedules/{schedule['id']}"

    wait_until(lambda: len([r for r in runs(client, tenant, schedule["id"])
                            if r["status"] not in ("queued", "running")]) >= 4,
               lambda: f"four finished runs: {runs(client, tenant, schedule['id'])}", 90,
               interval=0.2)  # fmt: skip
    paused = client.patch(f"/schedules/{schedule['id']}", json={"paused": True},
                          headers=tenant.headers)  # fmt: skip
    assert paused.status_code == 200 and paused.json["paused"] is True
    time.sleep(1.0)  # a tick fired just before the pause may still be finishing
    before = len(runs(client, tenant, schedule["id"]))
    time.sleep(4.0)  # two ticks of the cron, eight of each beat
    everything = runs(client, tenant, schedule["id"])
    assert len(everything) == before, "a paused schedule fired"

    ticks = [datetime.fromisoformat(r["scheduled_for"]) for r in everything]
    assert len(ticks) == len(set(ticks)), "a tick fired twice"
    log = control_worker.log_path.read_text(errors="replace")
    holders = [b for b in two_beats if "holds it" in b.log_path.read_text()]
    assert len(holders) == 1, "not one beat, and one only, held the control lease"
    failed_ticks = [line for line in log.splitlines() if "schedules.tick[" in line
                    and "raised" in line]  # fmt: skip
    assert failed_ticks == [], "a tick's task failed (a second firing refused by the index?)"
    assert all(t.second % 2 == 0 and t.microsecond == 0 for t in ticks)
    with database.sessionmaker() as session:  # each run's input: both files, in name order
        assert session.scalar(
            sa.select(sa.func.count()).select_from(Batch).where(
                Batch.schedule_id == uuid.UUID(schedule["id"]), Batch.rows != 30
            )
        ) == 0  # fmt: skip
    finished = [r for r in everything if r["status"] == "succeeded"]
    assert len(finished) >= 4, everything
    expected = SessionPool("cpu").run(
        ModelCard.load(model_repository / "digits" / "1"), {"pixels": pixels}
    )
    deadline = time.monotonic() + 30
    for run in finished:
        tick = datetime.fromisoformat(run["scheduled_for"])
        written = root / "scored" / f"nightly-{tick:%Y%m%dT%H%M%SZ}.npy"
        # the next tick of a worker writes it
        wait_until(written.exists, f"{written} written", deadline - time.monotonic(), 0.2)
        results = np.load(written, allow_pickle=False)
        assert np.array_equal(results["label"], expected["label"])
        assert np.array_equal(results["probabilities"], expected["probabilities"])
    assert not list((root / "scored").glob(".*.part")), "a partial file was left behind"


def test_a_tick_missed_while_down_fires_once_on_start(
    app: Flask, client: FlaskClient, tenant: TenantAuth, database: Database, settings: Settings
) -> None:
    upload = client.post("/files?filename=r.npy", data=_npy(5), headers=tenant.headers)
    body = {"name": "hourly", "cron": "0 * * * *", "timezone": "Europe/Paris",
            "model": "digits", "input": {"file_id": upload.json["id"]}}  # fmt: skip
    schedule_id = client.post("/schedules", json=body, headers=tenant.headers).json["id"]
    missed = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) - timedelta(hours=30)
    with database.sessionmaker() as session:  # thirty hourly ticks went by while down
        session.execute(sa.update(Schedule).where(Schedule.id == uuid.UUID(schedule_id))
                        .values(next_run_at=missed))  # fmt: skip
        session.commit()
    started: list[uuid.UUID] = []
    container = container_of(app)
    with container.scope():
        fired = container.schedules.fire_due(_record(started))
        again = container.schedules.fire_due(_record(started))
    with database.sessionmaker() as session:
        schedule = session.get(Schedule, uuid.UUID(schedule_id))
        assert schedule is not None
        next_run = schedule.next_run_at
    # The earliest missed tick, and the last whole hour too if it went by less than
    # SCHEDULE_CATCH_UP_SECONDS ago: not the 28 hours between.
    hour = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
    recent = [hour] if (datetime.now(UTC) - hour).total_seconds() <= 300 - 5 else []
    assert again == [] and started == fired and len(fired) in (1, 2)
    made = sorted(runs(client, tenant, schedule_id), key=lambda r: r["scheduled_for"])
    ticks = [datetime.fromisoformat(run["scheduled_for"]) for run in made]
    assert ticks[0] == missed and ticks[1:] in ([], recent), ticks
    assert made[0]["status"] == "queued" and made[0]["file_id"] == upload.json["id"]
    assert datetime.now(UTC) < next_run <= datetime.now(UTC) + timedelta(hours=1)
    assert next_run.minute == 0  # the next whole hour, read in Paris time


def test_ticks_missed_for_less_than_the_catch_up_window_each_fire_once(
    client: FlaskClient, tenant: TenantAuth, database: Database, settings: Settings
) -> None:
    """Redis or PostgreSQL restarting, or the control lease changing hands, holds a
    tick back some seconds: the ticks it missed fire late, each once, in order, and
    a tick whose run exists (its next_run_at moved back by hand) does not fire again."""
    app = create_app(settings.with_overrides(schedule_catch_up_seconds=300.0))
    upload = client.post("/files?filename=r.npy", data=_npy(5), headers=tenant.headers)
    body = {"name": "every-5s", "cron": "* * * * * */5", "model": "digits",
            "input": {"file_id": upload.json["id"]}}  # fmt: skip
    schedule_id = client.post("/schedules", json=body, headers=tenant.headers).json["id"]
    now = datetime.now(UTC).replace(microsecond=0)
    first = now - timedelta(seconds=now.second % 5 + 20)  # four ticks ago, and the one before
    with database.sessionmaker() as session:
        session.execute(sa.update(Schedule).where(Schedule.id == uuid.UUID(schedule_id))
                        .values(next_run_at=first))  # fmt: skip
        session.commit()
    container = container_of(app)
    with container.scope():
        fired = container.schedules.fire_due(_record([]))
        again = container.schedules.fire_due(_record([]))
    made = runs(client, tenant, schedule_id)
    ticks = sorted(datetime.fromisoformat(run["scheduled_for"]) for run in made)
    assert len(ticks) == len(fired) >= 5 and len(set(ticks)) == len(ticks)
    assert ticks[0] == first and all(b - a == timedelta(seconds=5) for a, b in
                                     itertools.pairwise(ticks)), ticks  # fmt: skip
    assert len(again) <= 1  # a tick may have come due meanwhile; never a repeat
    with database.sessionmaker() as session:  # moved back over ticks that have runs
        session.execute(sa.update(Schedule).where(Schedule.id == uuid.UUID(schedule_id))
                        .values(next_run_at=first))  # fmt: skip
        session.commit()
    with container.scope():
        refired = container.schedules.fire_due(_record([]))
    after = [datetime.fromisoformat(run["scheduled_for"]) for run in
             runs(client, tenant, schedule_id)]  # fmt: skip
    assert len(after) == len(set(after)) == len(ticks) + len(again) + len(refired)
    assert len(refired) <= 1, "ticks with runs fired again"
    # Due every 5 s, it would fire in the later tests that fire the due schedules.
    assert client.delete(f"/schedules/{schedule_id}", headers=tenant.headers).status_code == 204


def test_a_run_whose_input_is_gone_or_leads_out_is_a_failed_run_saying_why(
    app: Flask, client: FlaskClient, tenant: TenantAuth, database: Database, settings: Settings,
    tmp_path: Path,
) -> None:  # fmt: skip
    root = area(database, settings, tenant)
    write_jsonl(root / "in2" / "x.jsonl", (RNG.random((3, 64)) * 16).astype(np.float32))
    body = {"name": "gone", "cron": "0 * * * *", "model": "digits", "input": {"path": "in2"}}
    schedule_id = client.post("/schedules", json=body, headers=tenant.headers).json["id"]
    outside = tmp_path / "secrets"
    write_jsonl(outside / "y.jsonl", (RNG.random((3, 64)) * 16).astype(np.float32))
    (root / "in2" / "x.jsonl").unlink()
    (root / "in2").rmdir()
    os.symlink(outside, root / "in2")  # swapped for a link out of the area after saving
    for _ in range(2):
        with database.sessionmaker() as session:
            session.execute(
                sa.update(Schedule)
                .where(Schedule.id == uuid.UUID(schedule_id))
                .values(next_run_at=datetime.now(UTC) - timedelta(minutes=1))
            )
            session.commit()  # fmt: skip
        with container_of(app).scope():
            container_of(app).schedules.fire_due(_record([]))
        (root / "in2").unlink(missing_ok=True)  # then: gone
    failed = runs(client, tenant, schedule_id)
    assert [r["status"] for r in failed] == ["failed", "failed"]
    messages = sorted(r["error"]["message"] for r in failed)
    assert "does not exist" in messages[0] and "leads out of your data area" in messages[1]
    assert all(r["error"]["code"] == "input_unavailable" for r in failed)


def test_bad_schedules_are_clear_problems(
    client: FlaskClient, tenant: TenantAuth, database: Database, settings: Settings,
    tmp_path: Path,
) -> None:  # fmt: skip
    root = area(database, settings, tenant)
    os.symlink(tmp_path, root / "link-out")
    good = {"name": "ok", "cron": "0 3 * * *", "model": "digits", "input": {"path": "in"}}

    def problem(changes: dict[str, Any], status: int, field: str) -> None:
        response = client.post("/schedules", json={**good, **changes}, headers=tenant.headers)
        assert response.status_code == status, response.json
        assert response.mimetype == "application/problem+json"
        assert field in json.dumps(response.json), response.json

    problem({"cron": "every night"}, 422, "cron")
    problem({"timezone": "Mars/Olympus"}, 422, "timezone")
    problem({"input": {"path": "../other-tenant"}}, 422, "input_path")
    problem({"input": {"path": "/etc"}}, 422, "input_path")
    problem({"input": {"path": "link-out/x"}}, 422, "input_path")
    problem({"output": "../../escape"}, 422, "output_path")
    problem({"input": {}}, 422, "input")
    problem({"input": {"file_id": str(uuid.uuid4())}}, 404, "no file")
    problem({"model": "nope"}, 404, "nope")
    problem({"model": "slow"}, 422, "batch dimension")
    problem({"cron": None}, 422, "cron")
    created = client.post("/schedules", json=good, headers=tenant.headers)
    assert created.status_code == 201
    problem({}, 422, "name")  # the same name again
    other = make_tenant(database)
    url = f"/schedules/{created.json['id']}"
    assert client.get(url, headers=other.headers).status_code == 404
    assert client.patch(url, json={"paused": True}, headers=other.headers).status_code == 404
    assert client.delete(url, headers=other.headers).status_code == 404
    assert client.get(f"{url}/runs", headers=other.headers).status_code == 404
    assert client.get("/schedules", headers=other.headers).json["items"] == []
    assert client.patch(url, json={"cron": "x"}, headers=tenant.headers).status_code == 422
    second = client.post("/schedules", json={**good, "name": "ok2"}, headers=tenant.headers)
    renamed = client.patch(url, json={"name": "ok2", "model": "digits"}, headers=tenant.headers)
    assert renamed.status_code == 422, renamed.json  # another schedule's name: not a 500
    assert renamed.json["errors"] == {"name": ["unique among your schedules"]}
    assert client.get(url, headers=tenant.headers).json["name"] == "ok"
    removed = client.delete(f"/schedules/{second.json['id']}", headers=tenant.headers)
    assert removed.status_code == 204
    assert client.get(url).status_code == 401
    assert client.delete(url, headers=tenant.headers).status_code == 204
    assert client.get(url, headers=tenant.headers).status_code == 404


def test_the_cli_manages_the_same_schedules(
    client: FlaskClient, tenant: TenantAuth, database: Database, settings: Settings
) -> None:
    from app.cli.schedules import schedules

    with database.sessionmaker() as session:
        name = session.scalar(sa.select(Tenant.name).where(Tenant.id == tenant.id))
    env = {"DATABASE_URL": settings.database_url, "DATA_DIR": str(settings.data_dir),
           "MODEL_REPOSITORY": str(settings.model_repository)}  # fmt: skip
    cli = CliRunner()
    added = cli.invoke(schedules, ["add", "--tenant", str(name), "--name", "cli", "--cron",
                                   "30 2 * * 1", "--model", "digits", "--input-path", "in"],
                       env=env)  # fmt: skip
    assert added.exit_code == 0, added.output
    shown = json.loads(added.output)
    assert shown["cron"] == "30 2 * * 1" and shown["input"] == {"path": "in"}
    listed = client.get("/schedules", headers=tenant.headers).json["items"]
    assert [s["name"] for s in listed] == ["cli"]
    paused = cli.invoke(schedules, ["pause", "--tenant", str(name), "cli"], env=env)
    assert paused.exit_code == 0 and json.loads(paused.output)["paused"] is True
    bad = cli.invoke(schedules, ["add", "--tenant", str(name), "--name", "x", "--cron",
                                 "0 3 * * *", "--model", "digits", "--input-path", "../out"],
                     env=env)  # fmt: skip
    assert bad.exit_code != 0 and "contains '..'" in bad.output
    gone = cli.invoke(schedules, ["delete", "--tenant", str(name), "cli"], env=env)
    assert gone.exit_code == 0
    assert client.get("/schedules", headers=tenant.headers).json["items"] == []


def _npy(rows: int) -> bytes:
    out = io.BytesIO()
    np.save(out, (RNG.random((rows, 64)) * 16).astype(np.float32))
    return out.getvalue()


def _record(into: list[uuid.UUID]) -> Any:
    def start(batch_id: uuid.UUID) -> bool:
        into.append(batch_id)
        return True

    return start


def test_a_process_whose_clock_is_an_hour_ahead_fires_no_tick_early(
    app: Flask,
    client: FlaskClient,
    tenant: TenantAuth,
    database: Database,
    settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Ticks are stored and judged by PostgreSQL's clock: a control worker whose wall
    # clock jumped an hour ahead fired the next hourly tick at once, an hour early.
    upload = client.post("/files?filename=r.npy", data=_npy(5), headers=tenant.headers)
    body = {"name": "hourly-skewed", "cron": "0 * * * *", "model": "digits",
            "input": {"file_id": upload.json["id"]}}  # fmt: skip
    made = client.post("/schedules", json=body, headers=tenant.headers)
    assert made.status_code == 201, made.json
    schedule_id = uuid.UUID(made.json["id"])

    class Ahead(datetime):
        @classmethod
        def now(cls, tz: Any = None) -> datetime:  # type: ignore[override]
            return datetime.now(tz) + timedelta(hours=1, minutes=1)

    monkeypatch.setattr(definitions, "datetime", Ahead)
    monkeypatch.setattr(firing, "datetime", Ahead)
    started: list[uuid.UUID] = []
    with container_of(app).scope():
        fired = container_of(app).schedules.fire_due(_record(started))
    with database.sessionmaker() as session:
        schedule = session.get(Schedule, schedule_id)
        assert schedule is not None
    # (Other tests' schedules in the run's database may be due by PostgreSQL's clock
    # too, and fire: only this schedule's ticks are an hour away.)
    assert runs(client, tenant, str(schedule_id)) == [], (fired, started)
    assert schedule.next_run_at > datetime.now(UTC)
