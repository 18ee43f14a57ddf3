"""Each generation runs on the version of its model it names: its prompt in that
version's chat format, its tokens from that version's graph, whatever versions
are queued beside it, while another version's jobs keep coming, and never on
another version when its own was removed while it waited."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from flask import Flask

from app.cards import ModelCard
from app.generation.chat import ChatFormat
from app.platform.settings import Settings
from app.web.context import container_of
from tests.conftest import WorkerProcess, wait_for_job
from tests.generation.tiny_gguf import LLAMA3, write_tiny

MESSAGES = [{"role": "user", "content": "the"}]


def prompt_tokens(card: ModelCard) -> int:
    """How many tokens the version's own chat format makes of MESSAGES."""
    assert card.generation is not None
    own = ChatFormat(card.path / "tokenizer.json", card.generation)
    return len(own.chat_ids(tuple((m["role"], m["content"]) for m in MESSAGES)))


@pytest.mark.processes
def test_each_generation_runs_on_the_version_it_names(
    settings: Settings, make_app: Callable[..., Flask], auth: dict[str, str], tmp_path: Path
) -> None:
    queue = f"versions-{uuid.uuid4().hex[:8]}"
    app = make_app(jobs_queue=queue)
    client, plane = app.test_client(), container_of(app)
    name = f"tiny-versions-{uuid.uuid4().hex[:8]}"
    chatml = plane.models.add(write_tiny(tmp_path / "chatml.gguf", "qwen2", "Q4_0"), name).card
    llama3 = plane.models.add(write_tiny(tmp_path / "llama3.gguf", template=LLAMA3,
                                         bos="<|begin_of_text|>", add_bos=True),
                              name, weights="fp32").card  # fmt: skip
    removed = plane.models.add(write_tiny(tmp_path / "gone.gguf", seed=3), name).card
    expected = {card.version: prompt_tokens(card) for card in (chatml, llama3)}
    assert len(set(expected.values())) == 2, "the versions' formats tell them apart"

    def submit(version: str, max_tokens: int = 4, by: Any = client, **more: Any) -> str:
        body = {"model": name, "version": version, "inputs": {"messages": MESSAGES},
                "parameters": {"max_tokens": max_tokens, "temperature": 0, **more}}  # fmt: skip
        response = by.post("/jobs", json=body, headers=auth)
        assert response.status_code == 202, response.json
        return str(response.json["id"])  # type: ignore[index]

    def ran_on_its_version(job_id: str, version: str) -> None:
        job = wait_for_job(client, auth, job_id, timeout=120)
        assert job["status"] == "succeeded" and job["model_version"] == version, job
        assert job["outputs"]["prompt_tokens"] == expected[version], (version, job)

    try:
        # Queued before any worker runs: a loop starting finds both versions waiting,
        # and a third version's jobs whose version was removed meanwhile.
        order = [chatml.version, llama3.version, chatml.version, llama3.version]
        queued = [submit(version) for version in order]
        orphans = [submit(removed.version) for _ in range(2)]
        plane.models.remove(name, removed.version)
        worker = WorkerProcess(settings.with_overrides(jobs_queue=queue),
                               tmp_path / "worker.log", concurrency=1)  # fmt: skip
        try:
            for job_id, version in zip(queued, order, strict=True):
                ran_on_its_version(job_id, version)
            for job_id in orphans:
                job = wait_for_job(client, auth, job_id, timeout=120)
                assert job["status"] == "failed", job
                assert job["error"]["code"] == "model_unavailable", job

            # One process, its loop busy with the Llama 3 version's jobs as they keep
            # coming: a job of the ChatML version still runs, on its own version.
            flood: list[str] = []
            stop = threading.Event()

            assert llama3.generation is not None
            endless = {str(token): -100 for token in llama3.generation.stop_tokens}

            def keep_coming() -> None:  # (each to its max_tokens: the loop never empties)
                own = app.test_client()
                while not stop.is_set() and len(flood) < 400:
                    flood.append(submit(llama3.version, 128, own, logit_bias=endless))
                    stop.wait(0.02)

            submitter = threading.Thread(target=keep_coming)
            submitter.start()
            try:
                stop.wait(1.0)
                pinned = submit(chatml.version)
                ran_on_its_version(pinned, chatml.version)
                assert not stop.is_set() and submitter.is_alive(), "the flood went on"
            finally:
                stop.set()
                submitter.join(30)
            for job_id in flood:
                ran_on_its_version(job_id, llama3.version)
        finally:
            worker.stop()
    finally:
        plane.models.remove(name)
