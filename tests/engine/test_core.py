"""The engine's core in process, in milliseconds (tests/engine/harness.py): the
scheduler's fair shares, the prefill budget, a retry going on from its recorded
tokens, and a cancellation, as the loop carries them out against the job store."""

from __future__ import annotations

import uuid

from app.jobs.outputs import Piece
from app.statuses import JobStatus
from tests.engine.harness import FIRST_TOKEN, core, text_of


def test_a_tenant_arriving_while_another_fills_every_slot_starts_at_once(redis_url: str) -> None:
    """Two slots, both taken by tenant 1's long generations: tenant 2's job, queued
    mid-run, takes a slot from one of them at the next share (its fair share is
    one), and ends first; the paused generation goes on where it was and ends
    whole."""
    c = core(redis_url, slots=2)
    longs = [c.store.submit(1, prompt=4, max_tokens=40) for _ in range(3)]
    late: list[uuid.UUID] = []
    c.engine.after_step = lambda step: (
        late.append(c.store.submit(2, prompt=4, max_tokens=5)) if step == 3 else None
    )
    assert c.drain() == 4
    assert c.store.finished[0].job_id == late[0], "the second tenant waited for a free slot"
    assert c.store.outcome(late[0]) == (JobStatus.SUCCEEDED, text_of(5), 5)
    for job_id in longs:
        assert c.store.outcome(job_id) == (JobStatus.SUCCEEDED, text_of(40), 40)
    adds = [s.key for s in c.engine.added]
    paused = [key for key in longs if adds.count(key) == 2]
    assert len(paused) == 1, "not one generation of tenant 1 paused and put back"
    again = [s for s in c.engine.added if s.key == paused[0]][1]
    made_before = len(again.prompt) - 4  # its prompt, then the tokens it had made
    assert made_before > 0
    assert again.prompt == [1, 2, 3, 4, *again.generated[:made_before]]


def test_each_step_prefills_at_most_its_budget_and_a_long_prompt_goes_in_pieces(
    redis_url: str,
) -> None:
    """GENERATION_PREFILL_TOKENS bounds the prompt tokens a step prefills, however
    many prompts wait: a prompt that does not fit is cut, its rest prefilled at the
    next step, while the others decode."""
    c = core(redis_url, slots=4, prefill_tokens=16)
    jobs = [c.store.submit(1, prompt=12, max_tokens=3) for _ in range(3)]
    assert c.drain() == 3
    steps: list[int] = [0]
    for took in c.engine.prefills:
        if took < 0:
            steps.append(0)
        else:
            steps[-1] += took
    assert max(steps) <= 16, steps
    assert sum(steps) == 36
    assert steps[:3] == [16, 16, 4], steps  # 12 + 4 of the second; its 8 + 8; the last 4
    for job_id in jobs:
        assert c.store.outcome(job_id) == (JobStatus.SUCCEEDED, text_of(3), 3)


def test_a_retry_goes_on_from_the_tokens_its_earlier_attempt_recorded(redis_url: str) -> None:
    """Its prompt and recorded tokens are prefilled together; it makes only the
    rest, and its text and counts are those of one uninterrupted run."""
    c = core(redis_url)
    job_id = c.store.submit(1, prompt=5, max_tokens=6, attempt=2)
    made = [FIRST_TOKEN + i for i in range(3)]
    c.store.record([_piece(job_id, text_of(3), made)])
    assert c.drain() == 1
    [sequence] = c.engine.added
    assert sequence.prompt == [1, 2, 3, 4, 5, *made]
    assert c.engine.prefills[0] == 8
    assert c.store.outcome(job_id) == (JobStatus.SUCCEEDED, text_of(6), 6)
    assert c.engine.steps == 2, "it made more than the three tokens it lacked"


def test_a_cancelled_generation_leaves_the_batch_with_its_text_so_far(redis_url: str) -> None:
    c = core(redis_url)
    job_id = c.store.submit(1, prompt=3, max_tokens=10_000)
    other = c.store.submit(2, prompt=3, max_tokens=50)
    c.engine.after_step = lambda step: (
        setattr(c.store.jobs[job_id], "cancel", True) if step == 5 else None
    )
    assert c.drain() == 2
    status, text, tokens = c.store.outcome(job_id)
    assert status == JobStatus.CANCELLED and 5 < tokens < 100 and text == text_of(tokens)
    assert c.store.outcome(other) == (JobStatus.SUCCEEDED, text_of(50), 50)


def _piece(job_id: uuid.UUID, text: str, tokens: list[int]) -> Piece:
    """What the first attempt recorded of its text."""
    return Piece(job_id, 1, text, tuple(tokens))
