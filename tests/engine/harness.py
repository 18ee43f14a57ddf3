"""The engine's core (app.engine.core.Generation) in process: a job store in
memory (the JobStore port), a decode engine that makes known tokens, a chat
format whose tokens read `<id>`, and a clock that moves only as the engine's
calls take time. Redis (the loop's lock, its pieces, the token counts) is the
run's own, in a database of these tests' own; no worker, no PostgreSQL, no model.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, cast

import redis

from app.cards import ModelCard
from app.engine.core import Generation
from app.engine.loop import GenerationSettings
from app.engine.store import Clock, JobStore
from app.execution.dispatch import Dispatcher
from app.execution.leases import LeaseKeeper
from app.execution.runner import Runner
from app.generation.chat import ChatFormat, TextStream
from app.generation.requests import GenerationRequest, request_arrays
from app.jobs.claims import ClaimedJob, Head
from app.jobs.outputs import Piece
from app.jobs.transitions import Outcome
from app.runtime.engines import EnginePool
from app.runtime.sampling import Sampling
from app.runtime.sequences import Emitted, Sequence
from app.runtime.tensors import pack, unpack
from app.statuses import JobStatus

FIRST_TOKEN = 1000  # a sequence's n-th generated token is FIRST_TOKEN + n
DECODE_S = 0.010  # what one decode call takes on the test's clock
PREFILL_TOKEN_S = 0.0001  # and each prompt token a prefill call takes
OWN_DB = 12  # the Redis database of these tests (the run's workers use 0 or 15)


def text_of(tokens: int) -> str:
    """The text of a generation's first `tokens` tokens."""
    return "".join(f"<{FIRST_TOKEN + i}>" for i in range(tokens))


class TestClock(Clock):
    """Moves when the engine works (DECODE_S a decode call) and when the loop sleeps."""

    def __init__(self) -> None:
        self.t = 1000.0

    def now(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.t += seconds


class Format:
    """A chat format whose prompt is the stored ids and whose token `n` reads `<n>`."""

    def prompt_of(self, request: GenerationRequest) -> list[int]:
        assert request.prompt_ids is not None
        return list(request.prompt_ids)

    def guide(self, request: GenerationRequest) -> None:
        return None

    def label_ids(self, request: GenerationRequest) -> None:
        return None

    def text_stream(self, stop: tuple[str, ...]) -> TextStream:
        return TextStream(lambda token: b"<%d>" % token, stop)

    def grammars(self) -> None:
        return None


@dataclass
class Engine:
    """The decode engine's contract as the core uses it (app.runtime.decode): slots,
    prompts prefilled within a budget (a prompt may take several calls), a token
    per decoding sequence per decode call, a sequence out when cancelled."""

    clock: TestClock
    slots: int
    prefill_tokens: int
    waiting: list[Sequence] = field(default_factory=list)
    decoding: list[Sequence] = field(default_factory=list)
    prefilled: int = 0
    joined: int = 0
    prefixes: None = None
    steps: int = 0
    prefills: list[int] = field(default_factory=list)  # tokens each prefill call took
    added: list[Sequence] = field(default_factory=list)
    after_step: Callable[[int], None] = lambda step: None

    @property
    def busy(self) -> int:
        return len(self.waiting) + len(self.decoding)

    def room(self) -> int:
        return self.slots - self.busy

    def add(self, sequence: Sequence) -> None:
        assert self.room() > 0, "a sequence added with no slot free"
        sequence.filled = 0
        self.waiting.append(sequence)
        self.added.append(sequence)

    def cancel(self, key: Any) -> Sequence | None:
        for sequence in [*self.waiting, *self.decoding]:
            if sequence.key == key:
                (self.waiting if sequence in self.waiting else self.decoding).remove(sequence)
                sequence.finish_reason = "cancelled"
                return sequence
        return None

    def prefill(self, budget: int | None = None, prompts: int | None = None) -> list[Emitted]:
        self.prefilled = self.joined = 0
        left = budget if budget is not None else 1 << 30
        emitted: list[Emitted] = []
        for _ in range(prompts or len(self.waiting)):
            if not self.waiting or left <= 0:
                break
            sequence = self.waiting[0]
            took = min(len(sequence.prompt) - sequence.filled, left)
            sequence.filled += took
            left -= took
            self.prefilled += took
            if sequence.filled < len(sequence.prompt):
                break  # the rest of this prompt at the next call
            self.waiting.pop(0)
            self.decoding.append(sequence)
            self.joined += 1
            emitted.append(self._next(sequence))
        self.prefills.append(self.prefilled)
        self.clock.t += self.prefilled * PREFILL_TOKEN_S
        return emitted

    def decode(self) -> list[Emitted]:
        emitted = [self._next(sequence) for sequence in list(self.decoding)]
        self.steps += 1
        self.prefills.append(-1)  # (a step's end, between its prefills)
        self.clock.t += DECODE_S
        self.after_step(self.steps)
        return emitted

    def _next(self, sequence: Sequence) -> Emitted:
        token = FIRST_TOKEN + len(sequence.generated)
        sequence.generated.append(token)
        finished = "length" if len(sequence.generated) >= sequence.sampling.max_tokens else None
        if finished:
            sequence.finish_reason = finished
            self.decoding.remove(sequence)
        return Emitted(sequence, token, finished)


class Engines:
    """The engine pool: one engine, whatever the card."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    @contextmanager
    def running(self, card: ModelCard) -> Iterator[Engine]:
        yield self.engine


@dataclass
class Stored:
    job: ClaimedJob
    status: str = JobStatus.QUEUED
    cancel: bool = False


class Store:
    """The JobStore port in memory: claims fair between tenants (one job of each
    in turn, oldest first), pieces kept, the finishing writes in order."""

    def __init__(self, model: str) -> None:
        self.model = model
        self.jobs: dict[uuid.UUID, Stored] = {}
        self.pieces: list[Piece] = []
        self.finished: list[Outcome] = []  # in the order they were written
        self._order = itertools.count()

    def submit(self, tenant: int, prompt: int, max_tokens: int, *, attempt: int = 1,
               version: str = "1") -> uuid.UUID:  # fmt: skip
        """A queued generation of `prompt` tokens, at most `max_tokens` made."""
        request = GenerationRequest(None, "p", Sampling(max_tokens, temperature=0.0),
                                    prompt_ids=tuple(range(1, prompt + 1)))  # fmt: skip
        job = ClaimedJob(uuid.uuid4(), self.model, version, None, pack(request_arrays(request)),
                         attempt, 3, tenant_id=tenant)  # fmt: skip
        self.jobs[job.id] = Stored(job)
        return job.id

    def queued(self, version: str | None = None) -> list[ClaimedJob]:
        return [s.job for s in self.jobs.values() if s.status == JobStatus.QUEUED
                and (version is None or s.job.model_version == version)]  # fmt: skip

    def outcome(self, job_id: uuid.UUID) -> tuple[str, str, int]:
        """A finished job's status, text and completion tokens."""
        [outcome] = [o for o in self.finished if o.job_id == job_id]
        outputs = unpack(outcome.output_data or b"")
        return outcome.status, str(outputs["text"]), int(outputs["completion_tokens"])

    # The port.

    def heads(self, model: str) -> list[Head]:
        firsts: dict[int, ClaimedJob] = {}
        for job in self.queued():
            firsts.setdefault(job.tenant_id or 0, job)
        return [Head(j.id, t, j.priority, j.model_version) for t, j in firsts.items()]

    def claim(self, job_ids: list[uuid.UUID]) -> list[ClaimedJob]:
        claimed = [self.jobs[i].job for i in job_ids if self.jobs[i].status == JobStatus.QUEUED]
        for job in claimed:
            self.jobs[job.id].status = JobStatus.RUNNING
        return claimed

    def claim_next(self, model: str, version: str, room: int) -> tuple[list[ClaimedJob], bool]:
        by_tenant: dict[int, list[ClaimedJob]] = {}
        for job in self.queued(version):
            by_tenant.setdefault(job.tenant_id or 0, []).append(job)
        turns = itertools.chain.from_iterable(itertools.zip_longest(*by_tenant.values()))
        picked = [job for job in turns if job is not None][:room]
        claimed = self.claim([job.id for job in picked])
        return claimed, bool(self.queued(version))

    def claimable(self, model: str) -> bool:
        return bool(self.queued())

    def cancel_requested(self, job_ids: list[uuid.UUID]) -> list[uuid.UUID]:
        return [i for i in job_ids if self.jobs[i].cancel]

    def give_back(self, pieces: list[Piece], jobs: list[ClaimedJob]) -> set[uuid.UUID]:
        self.record(pieces)
        for job in jobs:
            self.jobs[job.id].status = JobStatus.QUEUED
        return {job.id for job in jobs}

    def recorded(self, job_id: uuid.UUID) -> list[int]:
        return [t for p in self.pieces if p.job_id == job_id for t in p.tokens]

    def recorded_logprobs(self, job_id: uuid.UUID) -> list[dict[str, Any]]:
        return []

    def record(self, pieces: list[Piece]) -> None:
        self.pieces += pieces

    def settle(self, batch_ids: list[uuid.UUID]) -> None:
        raise AssertionError("no batches here")

    def write(
        self, outcomes: list[Outcome], jobs: list[ClaimedJob], pieces: list[Piece]
    ) -> list[Any]:
        self.record(pieces)
        for outcome in outcomes:
            self.jobs[outcome.job_id].status = outcome.status
        self.finished += outcomes
        return [SimpleNamespace(id=o.job_id, status=o.status) for o in outcomes]

    def run(self, jobs: list[ClaimedJob]) -> list[Outcome]:
        raise AssertionError("every job here names the loop's version")


class Wakes:
    """The dispatcher as the loop sees it: a wake-up pending while jobs wait."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def queue_for(self, model: str) -> str:
        return "engine-tests"

    def pending(self, model: str) -> bool:
        return bool(self.store.queued())

    def backlog(self, model: str) -> bool:
        return False

    def taken(self, model: str, *_: Any) -> None:
        pass

    def wake(self, model: str) -> None:
        pass

    def pass_to_loop(self, model: str) -> None:
        pass


def own_redis(url: str) -> redis.Redis:
    """A client of the run's Redis, on these tests' own database."""
    pool = redis.Redis.from_url(url).connection_pool
    kwargs = {**pool.connection_kwargs, "db": OWN_DB, "socket_timeout": 5}
    return redis.Redis(connection_pool=redis.ConnectionPool(pool.connection_class, **kwargs))


@dataclass
class Core:
    generation: Generation
    store: Store
    engine: Engine
    clock: TestClock
    model: str

    def drain(self) -> int:
        return self.generation.drain(self.model)


def core(redis_url: str, slots: int = 2, prefill_tokens: int = 512) -> Core:
    """A core over a store, an engine and a clock of its own, for a model of its own."""
    model = f"engine-{uuid.uuid4().hex[:8]}"
    clock, store = TestClock(), Store(model)
    engine = Engine(clock, slots, prefill_tokens)
    card = SimpleNamespace(name=model, version="1", ref=f"{model}:1", generation=object())
    runner = SimpleNamespace(
        leases=LeaseKeeper(lambda held: {job.id for job in held}),
        settings=SimpleNamespace(lease_s=30.0, time_limit_s=600.0),
        guards=SimpleNamespace(resume=True),
        card=lambda name, version=None: card,
        answer=lambda jobs, outcomes, rows: None,
    )
    client = own_redis(redis_url)
    settings = GenerationSettings(slots, 1, prefill_tokens, 0, drain_s=1.0, linger_s=0.0,
                                  database="engine-tests")  # fmt: skip
    port: JobStore = store  # (mypy holds the store in memory to the port)
    generation = Generation(
        port, cast(Runner, runner), cast(Dispatcher, Wakes(store)), lambda: client,
        settings, cast(EnginePool, Engines(engine)), cast(Callable[[ModelCard], ChatFormat],
                                                          lambda card: Format()), clock,
    )  # fmt: skip
    return Core(generation, store, engine, clock, model)
