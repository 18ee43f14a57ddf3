"""A model with code and a pipeline over it added, rolled and removed while clients
call the pipeline on the sync and async doors, over a real worker of their own:
every call is answered (an answer, or the model gone: never a 500 nor a timeout),
every accepted job ends, the roll reaches the worker at once, and the worker drops
the code of the versions gone."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from flask import Flask

from app.platform.settings import Settings
from app.web.context import container_of
from tests.code.folders import whims_folder
from tests.conftest import WorkerProcess, wait_for_job
from tests.support import wait_until

pytestmark = pytest.mark.processes

PIPE = {
    "platform": "ensemble",
    "inputs": [{"name": "text", "datatype": "BYTES", "shape": [-1]}],
    "outputs": [{"name": "shout", "datatype": "BYTES", "shape": [-1], "from": "loud.shout"}],
    "steps": [{"name": "loud", "model": "churn-code", "inputs": {"text": "text"}}],
    "batching": {"max_batch_size": 16, "max_queue_delay_ms": 0},
}
ANSWERED = {200, 202, 404, 503}  # an answer, or the model (or its step's) gone


@pytest.fixture
def own(settings: Settings, tmp_path: Path) -> Settings:
    return settings.with_overrides(model_repository=tmp_path / "models",
                                   jobs_queue=f"churn-code-{uuid.uuid4().hex[:8]}")  # fmt: skip


@pytest.fixture
def worker(own: Settings, tmp_path: Path) -> Iterator[WorkerProcess]:
    (tmp_path / "models").mkdir()
    process = WorkerProcess(own, tmp_path / "worker.log", concurrency=2)
    yield process
    process.stop()


class Callers:
    """Threads calling the pipeline on the sync door and submitting jobs."""

    def __init__(self, app: Flask, auth: dict[str, str]) -> None:
        self.app, self.auth = app, auth
        self.statuses: Counter[int] = Counter()
        self.shouts: list[str] = []
        self.jobs: list[str] = []
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._call, args=(i,)) for i in range(4)]

    def _call(self, index: int) -> None:
        client = self.app.test_client()
        body = {"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["hi"]}]}
        job = {"model": "churn-pipe", "inputs": {"text": ["hi"]}}
        while not self.stop.is_set():
            if index % 2:
                got = client.post("/v2/models/churn-pipe/infer", json=body, headers=self.auth)
                if got.status_code == 200:
                    self.shouts.append(got.json["outputs"][0]["data"][0])
            else:
                got = client.post("/jobs", headers=self.auth, json=job)
                if got.status_code == 202:
                    self.jobs.append(got.json["id"])
            self.statuses[got.status_code] += 1
            time.sleep(0.01)

    def __enter__(self) -> Callers:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *_: Any) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(30)


def code_version(tmp_path: Path, name: str, upper: bool) -> Path:
    folder = whims_folder(tmp_path / name)
    if not upper:
        source = (folder / "model.py").read_text().replace("text.upper()", "text.lower() + b'!'")
        (folder / "model.py").write_text(source)
    return folder


def test_code_and_a_pipeline_added_rolled_and_removed_under_load(
    own: Settings, worker: WorkerProcess, make_app: Callable[..., Flask],
    auth: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    monkeypatch.setenv("WHIMS_LOG", str(tmp_path / "calls.log"))
    app = make_app(own, max_waits_per_tenant=16)
    models, client = container_of(app).models, app.test_client()
    models.add(code_version(tmp_path, "v1", upper=True), "churn-code")
    card = tmp_path / "pipe.json"
    card.write_text(json.dumps(PIPE))
    with Callers(app, auth) as callers:
        models.add(card, "churn-pipe")
        wait_until(lambda: "HI" in callers.shouts, "the pipeline answering", 60)
        models.add(code_version(tmp_path, "v2", upper=False), "churn-code")  # the roll
        wait_until(lambda: "hi!" in callers.shouts[-4:], "the roll answering", 60)
        models.remove("churn-code", "1")
        time.sleep(0.5)
        models.remove("churn-pipe")
        wait_until(lambda: callers.statuses[404] >= 4, "the removed pipeline refused", 60)
    assert set(callers.statuses) <= ANSWERED, callers.statuses
    assert callers.statuses[200] > 0 and callers.statuses[202] > 0, callers.statuses
    # Every accepted job ended (its model gone before it ran: failed, naming it).
    ended = [wait_for_job(client, auth, job, 60)["status"] for job in callers.jobs]
    assert set(ended) <= {"succeeded", "failed"} and "succeeded" in ended, Counter(ended)
    # The worker dropped the code of the versions gone.
    wait_until(lambda: "dropped the code of churn-code:1" in worker.log_path.read_text(),
               "churn-code:1's code dropped in the worker", 30)  # fmt: skip
    assert client.post("/jobs", headers=auth, json={
        "model": "churn-pipe", "inputs": {"text": ["hi"]}}).status_code == 404  # fmt: skip
