"""Generation jobs on the workers: claimed, leased, decoded together, finished.

A wake-up for a generative model runs `Generation.drain`, the one decode loop of
its worker machine for that model (a Redis lock keeps a second worker process
from starting another: they would split the same cores). The loop claims queued
jobs of the model while it has free slots, as `Execution` does (one UPDATE ...
SKIP LOCKED, fair between tenants, a lease each), adds them to the decode batch
at the next step, publishes their text as it comes (app.generation.pieces), and
writes each finished job in a unit of work with its text, finish reason and
token counts, its cost its share of the steps it was in. A job whose
cancellation is requested (DELETE, or a streaming client that went away) leaves
the batch within a step and ends `cancelled` with the text made so far.

The slots are shared fairly between tenants (app.generation.sharing): a loop
whose slots are all taken pauses generations of the tenant holding the most to
start a waiting tenant's, and goes on with them when a slot frees. The tokens
each tenant's generations take are counted for its budget (app.tenancy.tokens).
A worker shutting down asks its loops to hand their generations over: each
records its text and queues its jobs again, and another worker goes on from
their recorded tokens.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from contextlib import ExitStack
from functools import partial
from typing import Any

from app.cards import ModelCard
from app.engine.loop import (
    LOCK_S,
    GenerationSettings,
    Loop,
    LoopMeter,
    Running,
    ended_outcome,
    hand_over_key,
    take_lock,
)
from app.engine.outflow import Outflow
from app.engine.scheduler import WATCH_S, Scheduler
from app.engine.store import MONOTONIC, Clock, GenerationStore, JobStore
from app.execution.dispatch import Dispatcher
from app.execution.runner import Runner
from app.generation.chat import ChatFormat
from app.generation.formats import chat_format
from app.generation.pieces import PiecePublisher
from app.generation.requests import stored_request
from app.generation.sharing import Waiter
from app.jobs import claims
from app.jobs.claims import ClaimedJob
from app.jobs.outputs import Piece, Recorder
from app.jobs.transitions import Outcome
from app.observability import metrics
from app.platform.database import Database
from app.runtime.engines import EnginePool
from app.runtime.labels import LabelScores
from app.runtime.sequences import Emitted, Sequence
from app.runtime.sessions import SessionPool
from app.runtime.tensors import InvalidInputs
from app.statuses import JobStatus
from app.tenancy.tokens import TokenMeter

logger = logging.getLogger(__name__)

# An idle loop keeps watching this long at least (DRAIN_LINGER_MS if longer; none
# with 0), unless other work waits for its worker past DRAIN_SECONDS: the next
# call finds it running, with its model loaded and its prefixes kept, instead of
# waiting for a wake-up that may reach a worker process that has yet to load the
# model. (When it claims, shares and stops: app.engine.scheduler.)
LINGER_S = 10.0
_VERSIONS_LOOKED = 8  # versions whose waiting jobs a starting loop sends elsewhere, at most


class Generation:
    """The core: one decode loop per model and machine, driving the scheduler (its
    policy), the decode engine (the model runner) and the outflow, through the
    job store (`JobStore`). Tests run it in process with a store, an engine pool,
    a format and a clock of their own (tests/engine)."""

    def __init__(
        self,
        store: JobStore,
        runner: Runner,
        dispatcher: Dispatcher,
        redis: Any,
        settings: GenerationSettings,
        engines: EnginePool,
        formats: Callable[[ModelCard], ChatFormat] = chat_format,
        clock: Clock = MONOTONIC,
    ) -> None:
        """`redis`: a client (made on call) for the loop's lock, its pieces and its
        token counts; `clock`: what the scheduler's timers read and idle waits sleep."""
        self.store, self.runner, self.settings = store, runner, settings
        self._dispatcher, self._redis = dispatcher, redis
        self.engines, self._formats, self._clock = engines, formats, clock
        self.publisher = PiecePublisher(lambda: self._redis())
        self.recorder = Recorder()  # the text recorded in pieces (app.jobs.outputs)
        self.meter = LoopMeter(TokenMeter(lambda: self._redis(), settings.database))
        self.outflow = Outflow(self.publisher, self.recorder, self.meter, formats)

    @classmethod
    def of(
        cls, database: Database, runner: Runner, dispatcher: Dispatcher, redis: Any,
        settings: GenerationSettings, provider: str = "auto",
    ) -> Generation:  # fmt: skip
        """The workers' core: its jobs in PostgreSQL, its models on ONNX Runtime."""
        engines = EnginePool(
            SessionPool(provider, settings.threads), settings.slots, settings.prefill_tokens,
            settings.prefix_bytes, settings.prefill_rows,
        )  # fmt: skip
        return cls(GenerationStore(database, runner), runner, dispatcher, redis, settings, engines)

    def drain(self, model: str) -> int:
        """Decode `model`'s queued jobs until none is left for DRAIN_LINGER_MS (new
        ones are claimed as slots free up, as long as any runs) or, idle, once
        DRAIN_SECONDS passed. Returns the jobs finished.

        The loop serves one version, the one the first job in line names (the
        newest when none waits), and closes when another version's job waits
        (app.engine.scheduler): each job runs on the version it names."""
        queue = self._dispatcher.queue_for(model)
        lock = f"inference:generating:{queue}:{model}:{socket.gethostname()}"
        token = f"{os.getpid()}:{uuid.uuid4().hex}"  # the holder's process, on this machine
        if not take_lock(self._redis(), lock, token):
            # This machine's loop for the model is running and claims the jobs: the
            # wake-up this task took (and cleared) is passed on to it, else it would
            # see the new jobs only at its next timed claim (CLAIM_EVERY_S).
            self._dispatcher.pass_to_loop(model)
            return 0
        try:
            card = self._first_in_line(model)
            if card is None or card.generation is None:
                return 0
            with self.engines.running(card) as engine:
                # The structured-output tables, made beside the loop rather than
                # at its first schema (once per process and model version).
                threading.Thread(target=self._formats(card).grammars, daemon=True).start()
                linger = max(self.settings.linger_s, LINGER_S) if self.settings.linger_s else 0
                schedule = Scheduler(engine.slots, self._clock.now(), self.settings.drain_s, linger)
                loop = Loop(card, engine, schedule)
                try:
                    return self._loop(model, loop, lock, token)
                except BaseException:
                    self._let_go(loop)
                    raise
        finally:
            if self._redis().get(lock) == token.encode():
                self._redis().delete(lock)
            if self.store.claimable(model):
                self._dispatcher.wake(model)

    def _first_in_line(self, model: str) -> ModelCard | None:
        """The card of the version the first waiting job names, or the newest when
        none waits. Jobs of a version no loop can serve (removed, or out of its
        version policy, since they were queued; or one that does not generate) go
        to the runner, which fails them `model_unavailable` (or runs them) as it
        does any job's: they are not left to wait for a loop."""
        for _ in range(_VERSIONS_LOOKED):
            heads = self.store.heads(model)
            if not heads:
                return self.runner.card(model)
            card = self.runner.card(model, heads[0].version)
            if card is not None and card.generation is not None:
                return card
            self._not_generated(model, heads[0].version)
        return None

    def _not_generated(self, model: str, version: str) -> None:
        while claimed := self.store.claim_next(model, version, 64)[0]:
            self._finish(self.store.run(claimed), claimed)

    def _let_go(self, loop: Loop) -> None:
        """A loop that failed (its database or Redis went away, or its task was
        terminated) lets its jobs go: their leases stop being renewed, so they run
        out and the sweep queues the jobs again, for a retry that goes on from
        their recorded tokens; their slots are freed. Else this process would go on
        renewing those leases, with nothing decoding the jobs, until the time limit."""
        for job_id in list(loop.running):
            self.outflow.drop(loop, job_id)

    def _loop(self, model: str, loop: Loop, lock: str, token: str) -> int:
        """The loop's passes: what to do at each is the scheduler's (see its module);
        the claims, steps, writes and publishing are done here."""
        schedule, done = loop.schedule, 0
        pending = partial(self._dispatcher.pending, model)

        def backlog() -> bool:  # (its worker shutting down wants its process back too)
            return self._asked_to_hand_over() or self._dispatcher.backlog(model)

        try:
            while True:
                now = self._clock.now()
                turn = schedule.turn(now, loop.engine.room(), pending)
                if turn.renew_lock:
                    self._redis().set(lock, token, px=int(LOCK_S * 1000))
                if turn.resume:
                    self._go_on(loop, schedule.resumable(turn.resume, now))
                # (one look at the tenants' next jobs serves both the sharing and
                # the look for another version's)
                heads = self.store.heads(model) if turn.look or turn.share else []
                if turn.claim:
                    self._dispatcher.taken(model)
                    claimed, more = self.store.claim_next(model, loop.card.version, turn.claim)
                    for job in claimed:
                        done += self._start(loop, job)
                    schedule.claimed(now, more, len(claimed))
                elif turn.share:
                    done += self._share(model, loop, heads)
                if turn.look and any(h.version != loop.card.version for h in heads):
                    schedule.close()
                then = schedule.then(now, backlog)
                if then.stop:
                    return done
                if then.idle:
                    self._clock.sleep(WATCH_S)
                    continue
                if then.cancels:
                    if self._asked_to_hand_over():
                        self._hand_over(model, loop)
                        return done
                    done += self._cancels(loop)
                done += self._step(loop)
                if then.count:
                    self.meter.count(model, loop)
        finally:
            self.meter.count(model, None, loop.engine.prefixes)

    def _share(self, model: str, loop: Loop, heads: list[claims.Head]) -> int:
        """Pause generations of the tenants holding more than their share, each for
        a waiting tenant's job that takes its slot (app.generation.sharing)."""
        version = loop.card.version
        waiters = [Waiter(h.id, h.tenant_id, h.priority)
                   for h in heads if h.version == version]  # fmt: skip
        pairs = loop.schedule.preempt(waiters)
        if not pairs:
            return 0
        claimed = self.store.claim([waiter.key for _, waiter in pairs])
        for holder, _ in pairs[: len(claimed)]:  # (others may have claimed some)
            loop.engine.cancel(holder.key)
            loop.schedule.pause(holder.key)
        metrics.GENERATION_PAUSES.labels(model).inc(len(claimed))
        return sum(self._start(loop, job) for job in claimed)

    def _go_on(self, loop: Loop, keys: list[uuid.UUID]) -> None:
        """Paused generations back into free slots: their prompt and tokens
        prefilled again (their prompt's rows kept, mostly), their sampler where it was."""
        for key in keys:
            if (running := loop.running.get(key)) is not None:
                running.sequence = running.sequence.going_on(running.prompt)
                loop.engine.add(running.sequence)

    def _asked_to_hand_over(self) -> bool:
        try:
            return bool(self._redis().exists(hand_over_key(socket.gethostname(), os.getppid())))
        except Exception:  # Redis away: no hand-over asked (the loop's own calls will tell)
            return False

    def _hand_over(self, model: str, loop: Loop) -> None:
        """The worker is shutting down: record every running generation's text and
        queue its job again, for another worker to go on from its tokens."""
        running = list(loop.running.values())
        for item in running:
            loop.engine.cancel(item.job.id)
            item.leases.close()
        pieces = self.recorder.take([item.job.id for item in running])
        self.publisher.flush()
        handed = self.store.give_back(pieces, [item.job for item in running])
        loop.running.clear()
        loop.schedule.clear()
        logger.info("handed %d generation(s) of %s over as this worker shuts down",
                    len(handed), model)  # fmt: skip
        self._dispatcher.wake(model)

    def _start(self, loop: Loop, job: ClaimedJob) -> int:
        """Add a claimed job to the batch; a request that cannot run fails at once."""
        if job.id in loop.running:
            # An earlier attempt of it still decodes here: cut off from the database
            # past its lease (a partition), this loop lost the job to the sweep, and
            # claimed it again. Its writes would be refused, and its tokens, beside
            # the new attempt's, would go into the new attempt's text twice.
            self.outflow.drop(loop, job.id)
        fmt = self._formats(loop.card)
        try:
            request = stored_request(bytes(job.input_data or b""))
            prompt = fmt.prompt_of(request)
            guide = fmt.guide(request)
            labels = fmt.label_ids(request)
        except (KeyError, TypeError, ValueError, InvalidInputs) as exc:
            failed = Outcome(job.id, job.attempt, JobStatus.FAILED, error_code="invalid_input",
                             error_message=f"{type(exc).__name__}: {exc}",
                             error_class=type(exc).__name__)  # fmt: skip
            self._finish([failed], [job])
            return 1
        # A retry goes on from the tokens its earlier attempts recorded; the text they
        # made (recorded and sent already) is replayed into the text stream unsent.
        # (Only the fault suite turns the `resume` guard off: a retry starts afresh.)
        # Read before its lease is held: a read that fails (the database gone) must
        # not leave a lease renewed for a job no loop holds, which no sweep takes back.
        resume = job.attempt > 1 and self.runner.guards.resume and labels is None
        made = self.store.recorded(job.id) if resume else []
        wants_logprobs = request.sampling.logprobs is not None
        logprobs = self.store.recorded_logprobs(job.id) if made and wants_logprobs else []
        leases = ExitStack()
        run = self.runner.settings
        leases.enter_context(self.runner.leases.holding(
            [job], run.lease_s / 3, run.time_limit_s,
            lambda jobs: loop.overtime.update(j.id for j in jobs),
            lambda jobs: loop.lost.update((j.id, j.attempt) for j in jobs)))  # fmt: skip
        sequence = Sequence.resumed(job.id, prompt, made, request.sampling, guide,
                                    job.tenant_id)  # fmt: skip
        if labels is not None:  # (scored afresh by a retry: nothing of it is recorded)
            sequence.scores = LabelScores(labels)
        running = Running(job, sequence, fmt.text_stream(request.sampling.stop), leases,
                          prompt=prompt, first=not made)  # fmt: skip
        if wants_logprobs:
            running.logprobs = logprobs
        running.labels = request.labels or ()
        loop.running[job.id] = running
        loop.schedule.admitted(job.id, job.tenant_id, job.priority, self._clock.now())
        if not made:  # (a retry's prompt was counted by its first attempt)
            self.meter.charge(job, loop.card.name, "prompt", len(prompt))
        for token in made:
            running.text.add(token)
        if made:
            self.publisher.start(job.id, len(running.text.text))
        if made and len(made) >= request.sampling.max_tokens:
            sequence.finish_reason = "length"  # all made; the finish was not written
            return self._end(loop, [running])
        loop.engine.add(sequence)
        return 0

    def _step(self, loop: Loop) -> int:
        """A step: prefill (the step's budget of prompt tokens), then decode. Each
        prompt's first token is published as soon as its prefill ends, so its time
        to first token waits neither for the other prompts' prefill nor for the
        decode call."""
        engine, budget = loop.engine, loop.engine.prefill_tokens
        ended: list[Running] = []
        while engine.waiting and budget > 0:
            ended += self._run(loop, partial(engine.prefill, budget, 1))
            self.publisher.flush()  # (nothing to send costs nothing)
            if not engine.prefilled and not engine.joined:
                break
            budget -= engine.prefilled
        ended += self._run(loop, engine.decode)
        self.outflow.drop_lost(loop)
        for job_id in list(loop.overtime):
            loop.overtime.discard(job_id)
            if (running := loop.running.get(job_id)) is not None:
                loop.engine.cancel(job_id)
                running.sequence.finish_reason = "time_limit"
                ended.append(running)
        if not ended:
            self.publisher.flush()
            if due := self.recorder.due(time.monotonic()):
                self._record(due)
            return 0
        return self._end(loop, ended)

    def _run(self, loop: Loop, call: Callable[[], list[Emitted]]) -> list[Running]:
        """One engine call; its time shared among the sequences it served (their cost)."""
        began = time.perf_counter()
        emitted = call()
        if emitted:
            share = (time.perf_counter() - began) / len(emitted)
            for item in emitted:
                if (running := loop.running.get(item.sequence.key)) is not None:
                    running.compute_s += share
        return [r for item in emitted if (r := self.outflow.emit(loop, item)) is not None]

    def _cancels(self, loop: Loop) -> int:
        asked = self.store.cancel_requested(list(loop.running))
        ended = [loop.running[job_id] for job_id in asked]
        for running in ended:
            loop.engine.cancel(running.job.id)
        return self._end(loop, ended) if ended else 0

    def _end(self, loop: Loop, ended: list[Running]) -> int:
        outcomes, finals = [], {}
        for running in ended:
            loop.running.pop(running.job.id, None)
            loop.schedule.left(running.job.id)
            running.leases.close()
            self.outflow.tail(running)  # (a cancelled one's too: its outputs hold all its text)
            outcome, finals[running.job.id] = ended_outcome(running)
            outcomes.append(outcome)
        # The ended jobs' last pieces go in their finishing unit, before their terminal
        # events; the other jobs' due pieces ride along.
        pieces = self.recorder.take([r.job.id for r in ended])
        pieces += self.recorder.due(time.monotonic())
        rows = self._finish(outcomes, [r.job for r in ended], pieces)
        statuses = {row.id: row.status for row in rows}
        for job_id, final in finals.items():
            final["status"] = statuses.get(job_id, "lost")
        self.publisher.flush(finals)
        return len(rows)

    def _finish(
        self, outcomes: list[Outcome], jobs: list[ClaimedJob], pieces: list[Piece] | None = None
    ) -> list[Any]:
        """Record the pieces, write the outcomes, answer sync callers, then finish the
        batches whose last chunk (a row of a batch of generations) this was."""
        rows = self.store.write(outcomes, jobs, pieces or [])
        self.runner.answer(jobs, outcomes, rows)
        if batches := {job.batch_id for job in jobs if job.batch_id is not None}:
            self.store.settle(list(batches))  # after the commit: the last chunk's writer sees all
        return rows

    def _record(self, pieces: list[Piece]) -> None:
        """(A method of the loop's own: the fault suite stages a crash after it.)"""
        self.store.record(pieces)
