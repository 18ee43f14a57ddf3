"""The decode loop's state and its machine lock (app.engine.core runs it).

One loop per machine and model, serving one version at a time: its Redis lock
names the holder process, so a lock whose holder died is taken over at once. A
worker's main process, as it shuts down, asks its children's loops to hand their
generations over.
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from collections import Counter
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import orjson
import psutil

from app.cards import ModelCard
from app.engine.scheduler import Scheduler
from app.generation.chat import TextStream
from app.jobs.claims import ClaimedJob
from app.jobs.transitions import Outcome
from app.observability import metrics
from app.platform.broker import redis_client
from app.platform.settings import Settings
from app.runtime.decode import DecodeEngine
from app.runtime.prefixes import PrefixCache
from app.runtime.sequences import Sequence
from app.runtime.tensors import pack
from app.statuses import JobStatus
from app.tenancy.tokens import TokenMeter, namespace

LOCK_S = 10.0
HAND_OVER_S = 60.0  # how long a worker's request to hand over stands
_DELETE_IF = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end"


def hand_over_key(host: str, worker_pid: int) -> str:
    """Where a worker's main process asks its pool's decode loops to hand over."""
    return f"inference:hand-over:{host}:{worker_pid}"


def ask_hand_over(redis_url: str) -> None:
    """Called by a worker's main process as it shuts down: its children's decode
    loops hand their generations to other workers instead of finishing them."""
    key = hand_over_key(socket.gethostname(), os.getpid())
    redis_client(redis_url).set(key, "1", px=int(HAND_OVER_S * 1000))


def alive(held: bytes) -> bool:
    """Whether the process named in a loop lock's value still runs on this machine
    (the lock's key names the machine). A value without a process id is taken to
    be alive: it runs out by itself."""
    pid = held.split(b":", 1)[0]
    if not pid.isdigit():
        return True
    try:  # a killed worker's child can stay a zombie where nothing reaps it (PID 1)
        return bool(psutil.Process(int(pid)).status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:  # another user's process: it runs
        return True


def take_lock(client: Any, lock: str, token: str) -> bool:
    """The machine's lock for the model's loop; a lock whose holder process is
    gone (a worker killed with its loop running) is taken over at once rather
    than left to run out (LOCK_S), which would leave a wake-up now to the sweep."""
    if client.set(lock, token, nx=True, px=int(LOCK_S * 1000)):
        return True
    held = client.get(lock)
    if held is None or alive(held):
        return False
    # Only that dead holder's value is deleted: another process may have taken over.
    client.eval(_DELETE_IF, 1, lock, held)
    return bool(client.set(lock, token, nx=True, px=int(LOCK_S * 1000)))


@dataclass(frozen=True)
class GenerationSettings:
    slots: int
    threads: int
    prefill_tokens: int
    prefix_bytes: int
    drain_s: float
    linger_s: float
    database: str  # (the namespace of the tenants' token counts)
    prefill_rows: int = 0  # fresh prompts a prefill call takes (0: by the provider)

    @classmethod
    def of(cls, settings: Settings) -> GenerationSettings:
        return cls(settings.generation_slots, settings.generation_threads,
                   settings.generation_prefill_tokens,
                   settings.generation_prefix_cache_mb * 1024 * 1024, settings.drain_seconds,
                   settings.drain_linger_ms / 1000, namespace(settings.database_url),
                   settings.generation_prefill_rows)  # fmt: skip


@dataclass(eq=False)
class Running:
    job: ClaimedJob
    sequence: Sequence
    text: TextStream
    leases: ExitStack
    prompt: list[int]
    compute_s: float = 0.0
    stopped: str | None = None  # a stop sequence ended it
    first: bool = True  # its first token is still to come (time to first token)
    logprobs: list[dict[str, Any]] | None = None  # each token's, when asked for
    labels: tuple[str, ...] = ()  # a scored request's candidates
    label_scores: dict[str, float] | None = None  # and their probabilities, once scored


@dataclass
class Loop:
    card: ModelCard
    engine: DecodeEngine
    schedule: Scheduler  # its policy: admitted, paused, when to claim (no I/O)
    running: dict[uuid.UUID, Running] = field(default_factory=dict)  # paused ones too
    overtime: set[uuid.UUID] = field(default_factory=set)
    lost: set[tuple[uuid.UUID, int]] = field(default_factory=set)  # (job, attempt) taken back


def ended_outcome(running: Running) -> tuple[Outcome, dict[str, Any]]:
    """A finished (stopped, cancelled, timed out) generation's outcome, with its
    text, finish reason and token counts; and its final piece for followers."""
    sequence = running.sequence
    reason = running.stopped or sequence.finish_reason or "cancelled"
    usage = {"prompt_tokens": len(running.prompt), "completion_tokens": len(sequence.generated)}
    usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
    arrays = {
        "text": np.array(running.text.text, dtype=object),
        "finish_reason": np.array(reason, dtype=object),
        **{k: np.array(v, np.int64) for k, v in usage.items()},
    }
    if running.logprobs is not None:  # (OpenAI's chat `logprobs.content`, as JSON)
        arrays["logprobs"] = np.array(orjson.dumps(running.logprobs).decode(), dtype=object)
    if running.label_scores is not None:
        arrays["label_scores"] = np.array(orjson.dumps(running.label_scores).decode(),
                                          dtype=object)  # fmt: skip
    outputs = pack(arrays)
    job = running.job
    if reason == "time_limit":
        outcome = Outcome(job.id, job.attempt, JobStatus.FAILED, error_code="time_limit",
                          error_message="the job ran past JOB_TIME_LIMIT_SECONDS",
                          output_data=outputs)  # fmt: skip
    else:
        status = JobStatus.CANCELLED if reason == "cancelled" else JobStatus.SUCCEEDED
        outcome = Outcome(job.id, job.attempt, status, output_data=outputs)
    outcome = replace(outcome, compute_seconds=running.compute_s,
                      prompt_tokens=usage["prompt_tokens"],
                      completion_tokens=usage["completion_tokens"])  # fmt: skip
    final = {"final": True, "finish_reason": reason, "usage": usage, "output": running.text.text}
    if running.logprobs is not None:
        final["logprobs"] = running.logprobs
    if running.label_scores is not None:
        final["label_scores"] = running.label_scores
    return outcome, final


class LoopMeter:
    """What a loop's generations take: tokens per tenant (their budgets, counted in
    Redis at each `count`), per model and kind, time to first token, the slots."""

    def __init__(self, tokens: TokenMeter) -> None:
        self.tokens = tokens
        self._charges: Counter[int] = Counter()  # tokens per tenant, not yet counted
        self._made: Counter[tuple[str, str]] = Counter()  # (model, kind): for the metric

    def charge(self, job: ClaimedJob, model: str, kind: str, tokens: int) -> None:
        if job.tenant_id is not None:
            self._charges[job.tenant_id] += tokens
        self._made[(model, kind)] += tokens

    @staticmethod
    def first_token(job: ClaimedJob, model: str) -> None:
        if job.created_at is not None:
            waited = max(0.0, time.time() - job.created_at.timestamp())
            metrics.GENERATION_FIRST_TOKEN_SECONDS.labels(model).observe(waited)

    def count(self, model: str, loop: Loop | None, prefixes: PrefixCache | None = None) -> None:
        """The tokens taken since the last count, the prefix cache's lookups (the
        loop's, or `prefixes` as a loop ends); the loop's slots (None: it ended,
        its slots are gone)."""
        charges, self._charges = self._charges, Counter()
        self.tokens.add(dict(charges))
        for (name, kind), n in self._made.items():
            metrics.GENERATION_TOKENS.labels(name, kind).inc(n)
        self._made.clear()
        prefixes = loop.engine.prefixes if loop is not None else prefixes
        if prefixes is not None:
            counts = prefixes.take_counts()
            metrics.GENERATION_PREFIX_LOOKUPS.labels(model, "hit").inc(counts.hits)
            metrics.GENERATION_PREFIX_LOOKUPS.labels(model, "miss").inc(counts.misses)
            metrics.GENERATION_PREFIX_TOKENS_SAVED.labels(model).inc(counts.tokens_saved)
        paused = len(loop.schedule.paused) if loop else 0
        busy = loop.engine.busy if loop else 0
        free = loop.engine.room() if loop else 0
        for state, value in (("busy", busy), ("free", free), ("paused", paused)):
            metrics.GENERATION_SLOTS.labels(model, state).set(value)
