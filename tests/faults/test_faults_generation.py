"""Fault scenarios 20-23: generations of the chat model (smollm2) followed as they
are made, through a worker killed at staged points of its decode loop, a Redis
restart, a client that keeps reconnecting, and a PostgreSQL restart.

Every call is greedy (temperature 0), so its text is known beforehand: each
scenario first runs its prompts once with no fault (the references), then the
calls it follows through the fault. Each call is followed twice: as a client of
the OpenAI-compatible door streams it (pub/sub; a cut-off call keeps what it
got), and by its job's event stream (GET /jobs/<id>/events, reconnecting with
Last-Event-ID after every cut, as EventSource does). The tally adds, over every
stream followed, the tokens it got twice and those it never got against the
reference (tests.faults.followers.TokenDiff); with its guards on a scenario
must show none, every final text equal to its reference, and each event
stream's output events joined equal to its job's outputs.text.

The guard these scenarios switch off is `resume`: a retried generation goes on
from the tokens its dead attempt recorded. Without it the retry starts again
from the prompt and records its text anew, so an event stream, which already
sent the dead attempt's pieces, sends them twice.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest
import sqlalchemy as sa

from tests.faults.followers import StreamingCall, TokenDiff, chat, greedy_references
from tests.faults.harness import DECODE_CRASH_VARIABLE, FaultStack, Tally
from tests.faults.scenarios import GUARD, check

pytestmark = [pytest.mark.faults, pytest.mark.processes]

MAX_TOKENS = 64
PROMPTS = [
    "Write a short story about a lighthouse keeper.",
    "Explain how a bicycle works.",
    "Describe a walk through a forest in autumn.",
    "Tell me about the history of bread.",
]
RESUMING = "resume"


def guard_name(guarded: bool) -> str:
    return "on" if guarded else f"off: {RESUMING}"


def recorded_tokens(stack: FaultStack, job_id: str) -> int:
    with stack.engine.connect() as conn:
        found = conn.scalar(
            sa.text("SELECT coalesce(sum(cardinality(tokens)), 0) FROM job_events "
                    "WHERE job_id = CAST(:id AS uuid) AND status = 'output'"), {"id": job_id},
        )  # fmt: skip
    return int(found or 0)


def all_recorded(stack: FaultStack, calls: list[StreamingCall], tokens: int) -> Callable[[], bool]:
    """Whether each call's job has recorded `tokens` tokens or more."""

    def recorded() -> bool:
        return all(call.job_id is not None and recorded_tokens(stack, call.job_id) >= tokens
                   for call in calls)  # fmt: skip

    return recorded


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def join(calls: list[StreamingCall], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    for call in calls:
        call.join(deadline)


def followed_tally(
    stack: FaultStack,
    scenario: str,
    guarded: bool,
    calls: list[StreamingCall],
    references: list[str],
    diff: TokenDiff,
) -> tuple[Tally, list[str]]:
    """The jobs' tally, with the tokens every stream followed got twice or never; and
    what else went wrong: calls cut off, final texts unlike the reference, output
    events that do not join to their job's outputs.text."""
    join(calls, 90)
    ids = [call.job_id for call in calls if call.job_id is not None]
    tally = stack.tally(scenario, guard_name(guarded), ids, len(calls))
    duplicate = missing = 0
    finals = equal = joined = 0
    for call, reference in zip(calls, references, strict=True):
        events = call.events
        assert events is not None, call.error
        for got in (call.text, events.text):
            extra, lacking = diff(got, reference)
            duplicate, missing = duplicate + extra, missing + lacking
        finals += events.final_text is not None
        equal += events.final_text == reference
        joined += events.final_text is not None and events.text == events.final_text
    tally.duplicate_tokens, tally.missing_tokens = duplicate, missing
    with stack.engine.connect() as conn:
        retried = conn.scalar(
            sa.text("SELECT count(*) FROM jobs WHERE id::text = ANY(:ids) AND attempts > 1"),
            {"ids": ids},
        )
    reconnects = sum(call.events.connections - 1 for call in calls if call.events)
    broken = [call.error for call in calls if not call.done]
    tally.notes.append(
        f"calls: {len(calls)}, each followed by 2 streams; jobs retried: {retried}; "
        f"final texts equal to the greedy run: {equal}/{len(calls)}; output events "
        f"joined equal to outputs.text: {joined}/{len(calls)}; event-stream "
        f"reconnects: {reconnects}" + (f"; calls cut off: {len(broken)}" if broken else "")
    )
    wrong = [f"a call cut off: {error}" for error in broken]
    if equal < len(calls):
        wrong.append(f"final texts unlike the greedy run: {len(calls) - equal}")
    if joined < len(calls):
        wrong.append(f"output events not joining to outputs.text: {len(calls) - joined}")
    return tally, wrong


# Scenario 20 ---------------------------------------------------------------------


@GUARD
def test_20_sigkill_the_decode_loop_at_staged_points(
    make_stack: Callable[..., FaultStack], model_repository: Path, guarded: bool
) -> None:
    """A worker child SIGKILLs itself (tests.faults.decode_crash) inside a prompt's
    prefill while another generation decodes, inside a decode call, and right after
    recording a piece it had not yet published; each time the sweep takes the jobs
    back when their lease runs out and a new child goes on from their recorded
    tokens (taking over the dead loop's lock)."""
    stack = make_stack("" if guarded else RESUMING, DRAIN_SECONDS="60")
    crash = stack.root / "decode-crash"
    stack.start_api()
    stack.start_worker("worker0", concurrency=1, **{DECODE_CRASH_VARIABLE: str(crash)})
    stack.start_beat()
    body = chat(PROMPTS[0], MAX_TOKENS)
    (reference,) = greedy_references(stack, [body])
    calls: list[StreamingCall] = []
    fired: list[str] = []
    recoveries: list[float] = []
    for point in ("prefill", "decode", "recorded"):
        crash.write_text(point)
        call = StreamingCall(stack, body).start()
        calls.append(call)
        if point == "prefill":  # a second call joins the batch while the first decodes
            assert call.job_id is not None, call.error
            wait_for(all_recorded(stack, [call], 1), 60, "the first call's text")
            calls.append(StreamingCall(stack, body).start())
        wait_for(lambda: not crash.exists(), 60, f"the crash at {point}")
        fired.append(point)
        killed = time.monotonic()
        join(calls, 90)
        recoveries.append(time.monotonic() - killed)
    tally, wrong = followed_tally(
        stack, "20. SIGKILL the decode loop at staged points", guarded, calls,
        [reference] * len(calls), TokenDiff(model_repository),
    )  # fmt: skip
    tally.recovery_s = round(max(recoveries), 1)  # the longest of the three
    tally.notes.append("killed in a prefill, in a decode call, between a piece's record "
                       "and its publication")  # fmt: skip
    check(tally, guarded, lambda t: bool(t.duplicate_tokens))
    assert not guarded or not wrong, wrong
    assert fired == ["prefill", "decode", "recorded"]


# Scenario 21 ---------------------------------------------------------------------

CALLS = 16


@GUARD
def test_21_redis_restarts_under_16_streaming_calls(
    make_stack: Callable[..., FaultStack], model_repository: Path, guarded: bool
) -> None:
    """Redis (the broker, and the pub/sub the calls' pieces go by) is killed while
    16 streaming calls decode together, and comes back from its AOF 2 s later."""
    stack = make_stack("" if guarded else RESUMING, DRAIN_SECONDS="60")
    stack.start_all(concurrency=1)
    bodies = [chat(PROMPTS[i % len(PROMPTS)], MAX_TOKENS) for i in range(CALLS)]
    references = greedy_references(stack, bodies[: len(PROMPTS)])
    calls = [StreamingCall(stack, body).start() for body in bodies]
    wait_for(all_recorded(stack, calls, 8), 120, "every call's first text")
    stack.kill_redis()
    time.sleep(2.0)
    stack.restart_redis()
    restarted = time.monotonic()
    join(calls, 90)
    tally, wrong = followed_tally(
        stack, "21. Redis restarted under 16 streaming calls", guarded, calls,
        [references[i % len(PROMPTS)] for i in range(CALLS)], TokenDiff(model_repository),
    )  # fmt: skip
    tally.recovery_s = round(time.monotonic() - restarted, 1)
    tally.notes.append("Redis down 2 s, back from its AOF")
    check(tally, guarded, lambda t: bool(t.duplicate_tokens))
    assert not guarded or not wrong, wrong


# Scenario 22 ---------------------------------------------------------------------

CUTS = 10


@GUARD
def test_22_a_client_reconnects_ten_times_during_one_generation(
    make_stack: Callable[..., FaultStack], model_repository: Path, guarded: bool
) -> None:
    """A call's event stream is cut after each of its first ten events, and
    its client connects again each time with Last-Event-ID; meanwhile the worker
    child decoding it is killed in a decode call, so a retry goes on with it."""
    stack = make_stack("" if guarded else RESUMING, DRAIN_SECONDS="60")
    crash = stack.root / "decode-crash"
    stack.start_api()
    stack.start_worker("worker0", concurrency=1, **{DECODE_CRASH_VARIABLE: str(crash)})
    stack.start_beat()
    body = chat(PROMPTS[1], MAX_TOKENS)
    (reference,) = greedy_references(stack, [body])
    crash.write_text("decode")
    call = StreamingCall(stack, body, cut=lambda n: n <= CUTS).start()
    wait_for(lambda: not crash.exists(), 60, "the crash in a decode call")
    killed = time.monotonic()
    join([call], 90)
    tally, wrong = followed_tally(
        stack, "22. A client reconnects ten times during one generation", guarded, [call],
        [reference], TokenDiff(model_repository),
    )  # fmt: skip
    tally.recovery_s = round(time.monotonic() - killed, 1)
    assert call.events is not None
    tally.notes.append(f"its event stream cut {call.events.cuts} times, "
                       "its worker child killed once")  # fmt: skip
    check(tally, guarded, lambda t: bool(t.duplicate_tokens))
    assert not guarded or not wrong, wrong
    # Cut after each of its first ten events but the last (how many pieces a
    # generation is recorded in depends on the machine's speed): at least five.
    events = call.events
    assert events.cuts == min(CUTS, len(events.event_ids) - 1) >= 5, events.cuts
    assert events.connections == events.cuts + 1


# Scenario 23 ---------------------------------------------------------------------


@GUARD
def test_23_postgres_restarts_mid_generation(
    make_stack: Callable[..., FaultStack], model_repository: Path, guarded: bool
) -> None:
    """PostgreSQL stops (immediate: a crash) while four streaming calls decode, and
    starts again 3 s later: the decode loop cannot record their text, their event
    streams break (their clients reconnect with Last-Event-ID), the calls' door
    cannot read their record."""
    stack = make_stack("" if guarded else RESUMING, DRAIN_SECONDS="60")
    stack.start_all(concurrency=1)
    bodies = [chat(prompt, MAX_TOKENS) for prompt in PROMPTS]
    references = greedy_references(stack, bodies)
    calls = [StreamingCall(stack, body).start() for body in bodies]
    wait_for(all_recorded(stack, calls, 8), 120, "every call's first text")
    stack.stop_postgres()
    time.sleep(3.0)
    stack.start_postgres()
    restarted = time.monotonic()
    join(calls, 90)
    tally, wrong = followed_tally(
        stack, "23. PostgreSQL restarted mid-generation", guarded, calls, references,
        TokenDiff(model_repository),
    )  # fmt: skip
    tally.recovery_s = round(time.monotonic() - restarted, 1)
    tally.notes.append("PostgreSQL stopped (immediate) for 3 s")
    check(tally, guarded, lambda t: bool(t.duplicate_tokens))
    assert not guarded or not wrong, wrong
