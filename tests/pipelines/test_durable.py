"""A pipeline job whose worker is SIGKILLed between steps and inside a map, twice:
it completes, resuming each time at its first unfinished step (and within the
map, at its first unfinished element), and a counter kept by its code steps
shows that no finished step ran again: only the element in flight at each kill
ran twice."""

from __future__ import annotations

import json
import signal
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest
import sqlalchemy as sa
from flask import Flask

from app.platform.database import Database
from app.platform.settings import Settings
from app.web.context import container_of
from tests.conftest import WorkerProcess
from tests.support import wait_until

pytestmark = pytest.mark.processes

SPLIT = """
import os
import numpy as np
LOG = os.environ["COUNT_LOG"]
INPUTS = [{"name": "text", "datatype": "BYTES", "shape": [1]}]
OUTPUTS = [{"name": "words", "datatype": "BYTES", "shape": [-1]}]

def preprocess(batch):
    out = []
    for request in batch:
        text = request["text"][0].decode()
        with open(LOG, "a") as log:
            log.write(f"split {text}\\n")
        out.append({"words": np.array(text.split(), dtype=object)})
    return out
"""

SHOUT = """
import os
import time
import numpy as np
LOG = os.environ["COUNT_LOG"]
INPUTS = [{"name": "text", "datatype": "BYTES", "shape": [-1]}]
OUTPUTS = [{"name": "shout", "datatype": "BYTES", "shape": [-1]}]

def one(word):
    with open(LOG, "a") as log:
        log.write(f"shout {word.decode()}\\n")
    if word.startswith(b"sleep:"):
        time.sleep(float(word[6:]))
    return word.upper()

def postprocess(batch):
    return [{"shout": np.array([one(w) for w in r["text"]], dtype=object)} for r in batch]
"""

PIPELINE = {
    "platform": "ensemble",
    "inputs": [{"name": "text", "datatype": "BYTES", "shape": [1]}],
    "outputs": [{"name": "shouts", "datatype": "BYTES", "shape": [-1], "from": "each.shout"}],
    "steps": [
        {"name": "split", "model": "count-split", "inputs": {"text": "text"}},
        {"name": "each", "model": "count-shout", "map": "split.words",
         "inputs": {"text": "split.words"}},
    ],
}  # fmt: skip


def code_folder(folder: Path, source: str, card: dict[str, object], example: object) -> Path:
    folder.mkdir(parents=True)
    (folder / "model.py").write_text(source)
    (folder / "card.json").write_text(json.dumps(card))
    (folder / "examples.json").write_text(json.dumps({"inputs": example}))
    return folder


@pytest.fixture
def own(settings: Settings, tmp_path: Path) -> Settings:
    return settings.with_overrides(model_repository=tmp_path / "models",
                                   jobs_queue=f"durable-{uuid.uuid4().hex[:8]}")  # fmt: skip


@pytest.fixture
def log(tmp_path: Path) -> Path:
    return tmp_path / "count.log"


@pytest.fixture
def app_and_worker(
    own: Settings, make_app: Callable[..., Flask], tmp_path: Path, log: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[tuple[Flask, WorkerProcess]]:  # fmt: skip
    monkeypatch.setenv("COUNT_LOG", str(tmp_path / "dry-run.log"))  # (the dry runs' own)
    app = make_app(own, retry_backoff_seconds=0.05, retry_backoff_max_seconds=0.1)
    models = container_of(app).models
    words = {"name": "text", "datatype": "BYTES", "shape": [-1]}
    models.add(code_folder(tmp_path / "split", SPLIT, {
        "inputs": [{"name": "text", "datatype": "BYTES", "shape": [1]}],
        "outputs": [{"name": "words", "datatype": "BYTES", "shape": [-1]}],
        "batching": {"max_batch_size": 0}}, {"text": ["a b"]}), "count-split")  # fmt: skip
    # One element a slice: each finished element is recorded on its own.
    models.add(code_folder(tmp_path / "shout", SHOUT, {
        "inputs": [words], "outputs": [{**words, "name": "shout"}],
        "batching": {"max_batch_size": 1}}, {"text": ["a"]}), "count-shout")  # fmt: skip
    card = tmp_path / "durable.json"
    card.write_text(json.dumps(PIPELINE))
    models.add(card, "durable")
    worker = WorkerProcess(own, tmp_path / "worker.log", concurrency=1,
                           JOB_LEASE_SECONDS="2", COUNT_LOG=str(log))  # fmt: skip
    yield app, worker
    worker.stop()


def kill_the_child_at(worker: WorkerProcess, log: Path, line: str) -> None:
    wait_until(lambda: log.is_file() and line in log.read_text().splitlines(),
               f"{line!r} running", 60, 0.02)  # fmt: skip
    [child] = psutil.Process(worker.proc.pid).children()
    child.send_signal(signal.SIGKILL)


def test_a_pipeline_killed_between_steps_and_inside_its_map_resumes_and_reruns_nothing_finished(
    app_and_worker: tuple[Flask, WorkerProcess], log: Path, auth: dict[str, str]
) -> None:
    app, worker = app_and_worker
    client, maintenance = app.test_client(), container_of(app).worker.maintenance
    text = "a sleep:3 b c sleep:3.0 d"
    submitted = client.post("/jobs", headers=auth,
                            json={"model": "durable", "inputs": {"text": [text]}})  # fmt: skip
    assert submitted.status_code == 202, submitted.json
    job_id = submitted.json["id"]

    def finished() -> dict[str, object] | None:
        maintenance.sweep()  # (beat's sweep: takes back the dead child's job)
        job = client.get(f"/jobs/{job_id}", headers=auth).json
        return job if job["status"] in ("succeeded", "failed") else None

    kill_the_child_at(worker, log, "shout sleep:3")  # the split and "a" recorded
    wait_until(lambda: finished() or "shout sleep:3.0" in log.read_text(),
               "the job resumed past its first kill", 60, 0.2)  # fmt: skip
    kill_the_child_at(worker, log, "shout sleep:3.0")
    job = wait_until(finished, "the job finished after two kills", 90, 0.2)
    assert job["status"] == "succeeded", job
    assert job["outputs"] == {"shouts": ["A", "SLEEP:3", "B", "C", "SLEEP:3.0", "D"]}
    assert job["attempts"] == 3
    calls = Counter(log.read_text().splitlines())
    assert calls[f"split {text}"] == 1, calls  # finished before the first kill: never again
    assert [calls[f"shout {w}"] for w in ("a", "b", "c", "d")] == [1, 1, 1, 1], calls
    # Only the elements in flight at each kill ran twice.
    assert calls["shout sleep:3"] == 2 and calls["shout sleep:3.0"] == 2, calls


def test_a_worker_child_crashing_in_a_models_code_is_retried_then_dead_lettered(
    own: Settings, make_app: Callable[..., Flask], tmp_path: Path, auth: dict[str, str],
    database: Database,
) -> None:  # fmt: skip
    from tests.code.folders import whims_folder

    app = make_app(own, retry_backoff_seconds=0.05, retry_backoff_max_seconds=0.1)
    container_of(app).models.add(whims_folder(tmp_path / "whims"), "crashy")
    worker = WorkerProcess(own, tmp_path / "worker.log", concurrency=1, JOB_LEASE_SECONDS="1",
                           WHIMS_LOG=str(tmp_path / "calls.log"))  # fmt: skip
    try:
        client, maintenance = app.test_client(), container_of(app).worker.maintenance
        bodies = [{"model": "crashy", "inputs": {"text": [text]}} for text in ("crash", "calm")]
        ids = [client.post("/jobs", headers=auth, json=body).json["id"] for body in bodies]

        def ended() -> list[dict[str, object]] | None:
            maintenance.sweep()
            jobs = [client.get(f"/jobs/{i}", headers=auth).json for i in ids]
            return jobs if all(j["status"] in ("succeeded", "failed") for j in jobs) else None

        crashed, calm = wait_until(ended, "both jobs ended", 120, 0.2)
    finally:
        worker.stop()
    assert calm["status"] == "succeeded" and calm["outputs"] == {"shout": ["CALM"]}
    assert crashed["status"] == "failed" and crashed["attempts"] == 3, crashed
    assert crashed["error"]["code"] == "attempts_exhausted", crashed  # type: ignore[index]
    with database.sessionmaker() as session:
        query = sa.text("SELECT error_code FROM dead_letters WHERE job_id = :id")
        letters = session.execute(query, {"id": crashed["id"]}).scalars().all()
    assert letters == ["attempts_exhausted"]
