"""A generation joining its loop: nothing held when that fails half way.

In process, with the loop's parts stubbed: the database read that a retry makes
(its recorded tokens) fails as it does when PostgreSQL goes away.
"""

from __future__ import annotations

import uuid
from types import SimpleNamespace
from typing import Any

import pytest
import sqlalchemy as sa

from app.engine import core as generation
from app.engine.loop import Loop
from app.engine.store import MONOTONIC
from app.execution.leases import LeaseKeeper
from app.jobs.claims import ClaimedJob


class Format:
    """The chat format's part `_start` uses: a prompt of three tokens."""

    def prompt_of(self, request: Any) -> list[int]:
        return [1, 2, 3]

    def guide(self, request: Any) -> None:
        return None

    def label_ids(self, request: Any) -> None:
        return None


def test_a_retry_whose_recorded_tokens_cannot_be_read_holds_no_lease(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Else the process's lease thread renews the job for as long as the worker
    lives, with no loop decoding it: no sweep takes back a lease that never runs
    out, and the job stays running forever (seen in the fleet's faults, PostgreSQL
    restarted while retries joined their loops)."""
    keeper = LeaseKeeper(lambda held: {j.id for j in held})
    runner = SimpleNamespace(
        leases=keeper,
        settings=SimpleNamespace(lease_s=3.0, time_limit_s=600.0),
        guards=SimpleNamespace(resume=True),
    )
    request = SimpleNamespace(sampling=SimpleNamespace(logprobs=None), labels=None)
    monkeypatch.setattr(generation, "stored_request", lambda data: request)
    gen = generation.Generation.__new__(generation.Generation)
    gen.runner = runner  # type: ignore[assignment]
    gen._formats = lambda card: Format()  # type: ignore[assignment,return-value]
    gen._clock = MONOTONIC

    def database_gone(job_id: uuid.UUID) -> list[int]:
        raise sa.exc.OperationalError("SELECT", {}, Exception("server closed the connection"))

    gen.store = SimpleNamespace(recorded=database_gone)  # type: ignore[assignment]
    loop = Loop(card=SimpleNamespace(name="chat"), engine=None, schedule=None)  # type: ignore[arg-type]
    retry = ClaimedJob(uuid.uuid4(), "chat", "1", None, b"{}", 2, 3)
    # The error kept, as the worker's task keeps it for its retry: its traceback
    # holds the failed call's frame, and garbage collection closes nothing.
    with pytest.raises(sa.exc.OperationalError) as kept:
        gen._start(loop, retry)
    assert loop.running == {}
    assert keeper._held == {}, "a lease left renewed for a job no loop holds"
    assert kept.value is not None
