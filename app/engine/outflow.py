"""What a decode step's tokens become (app.engine.core steps the engine):
text published to the job's followers and recorded in pieces for a retry, each
token counted for its tenant, log-probabilities and label scores kept for the
job's outcome; and a generation dropped from the loop with its unrecorded text."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable

from app.cards import ModelCard
from app.engine.loop import Loop, LoopMeter, Running
from app.generation.chat import ChatFormat
from app.generation.formats import chat_format
from app.generation.pieces import PiecePublisher
from app.jobs.outputs import Recorder
from app.runtime.labels import LabelScores
from app.runtime.sequences import Emitted

logger = logging.getLogger(__name__)


class Outflow:
    def __init__(
        self, publisher: PiecePublisher, recorder: Recorder, meter: LoopMeter,
        formats: Callable[[ModelCard], ChatFormat] = chat_format,
    ) -> None:  # fmt: skip
        self.publisher, self.recorder, self.meter = publisher, recorder, meter
        self._formats = formats

    def emit(self, loop: Loop, item: Emitted) -> Running | None:
        """A step's token for its generation: its text published and recorded, its
        log-probability kept, its cost counted; the generation, when it ended."""
        running = loop.running.get(item.sequence.key)
        if running is None:
            return None
        job = running.job
        if item.token is not None:
            self.meter.charge(job, loop.card.name, "completion", 1)
            if running.first:
                running.first = False
                self.meter.first_token(job, loop.card.name)
            piece = running.text.add(item.token)
            entry = None
            if item.logprob is not None and running.logprobs is not None:
                entry = self._formats(loop.card).logprob_entry(item.logprob)
                running.logprobs.append(entry)
            if piece.text or entry:
                self.publisher.add(job.id, piece.text, entry)
            self.recorder.add(job.id, job.attempt, piece.text, item.token, time.monotonic(),
                              entry)  # fmt: skip
            if piece.stopped:
                loop.engine.cancel(running.job.id)
                running.stopped = "stop"
                return running
        if item.finished:
            if item.sequence.scores is not None:
                self._answer_label(loop, running, item.sequence.scores)
            self.tail(running)
            return running
        return None

    def _answer_label(self, loop: Loop, running: Running, scores: LabelScores) -> None:
        """A scored request's answer: the likeliest label as its text, every label's
        probability beside it. Published, not recorded: a retry scores afresh."""
        probabilities = scores.probabilities()
        running.label_scores = dict(zip(running.labels, probabilities, strict=True))
        best = scores.labels[probabilities.index(max(probabilities))]
        running.sequence.generated = list(best)
        self.meter.charge(running.job, loop.card.name, "completion", len(best))
        for token in best:
            if text := running.text.add(token).text:
                self.publisher.add(running.job.id, text)

    def tail(self, running: Running) -> None:
        """Text held back for stop sequences, out once the sequence ended."""
        if tail := running.text.finish().text:
            self.publisher.add(running.job.id, tail)
            self.recorder.add(running.job.id, running.job.attempt, tail, None, time.monotonic())

    def drop(self, loop: Loop, job_id: uuid.UUID) -> None:
        """A generation out of the loop, its lease no longer renewed, its text not
        recorded yet dropped (it is made again from the recorded tokens)."""
        running = loop.running.pop(job_id)
        running.leases.close()
        loop.overtime.discard(job_id)
        loop.engine.cancel(job_id)
        loop.schedule.left(job_id)
        self.publisher.forget(job_id)
        self.recorder.take([job_id])

    def drop_lost(self, loop: Loop) -> None:
        """Generations whose job went to another attempt while this loop was cut off
        from the database past their lease leave the batch: their writes would be
        refused, and their text would go on reaching the job's followers."""
        while loop.lost:
            job_id, attempt = loop.lost.pop()
            if (running := loop.running.get(job_id)) is not None and running.job.attempt == attempt:
                logger.warning("generation %s: its lease was lost; it leaves the batch", job_id)
                self.drop(loop, job_id)
