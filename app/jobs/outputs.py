"""A generation's output, recorded in pieces as `job_events` rows (status `output`).

The decoding worker writes every due piece of every job in one statement per
step, guarded as a finish is: only the attempt that holds the job, while it is
running, records anything, so a worker that lost its lease adds nothing and no
token is recorded twice. The rows share the job events' id sequence (an event
stream resumes after any of them) and are announced on the channel
`job_outputs`, apart from state changes, so a long-poll waiting for the job to
change is not woken by every piece. A job whose webhook asks for `job.output`
gets a delivery with a piece, at most every OUTPUT_WEBHOOK_MS (Replicate's
throttle); it says the text so far when it is sent. Nothing here commits.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

import orjson
from sqlalchemy import bindparam, text
from sqlalchemy.dialects.postgresql import ARRAY, INTEGER, TEXT, UUID
from sqlalchemy.orm import Session

OUTPUT = "output"  # the status of a piece's row
CHANNEL = "job_outputs"
OUTPUT_WEBHOOK_MS = 500


@dataclass(frozen=True)
class Piece:
    job_id: uuid.UUID
    attempt: int
    text: str
    tokens: tuple[int, ...]
    logprobs: tuple[dict[str, Any], ...] = ()  # the tokens', when asked for


_RECORD = text(
    f"""
    WITH v AS (
        SELECT * FROM unnest(:ids, :attempts, :texts, :tokens, :logprobs)
            AS v(id, attempt, text, tokens, logprobs)
    ),
    recorded AS (
        INSERT INTO job_events (job_id, status, attempt, text, tokens, logprobs)
        SELECT v.id, '{OUTPUT}', v.attempt, v.text,
               CAST(string_to_array(v.tokens, ',') AS integer[]), CAST(v.logprobs AS jsonb)
        FROM v JOIN jobs AS j ON j.id = v.id
        WHERE j.status = 'running' AND j.attempts = v.attempt
        RETURNING job_id
    ),
    hooked AS (  -- (a data-modifying CTE runs whether or not it is read)
        -- created_at on the clock the throttle below reads (now() is the start of
        -- the transaction, which may be well before this statement)
        INSERT INTO webhook_deliveries (job_id, tenant_id, event_type, message_id, url,
                                        created_at)
        SELECT j.id, j.tenant_id, 'job.output',
               'msg_' || replace(CAST(gen_random_uuid() AS text), '-', ''), j.webhook_url,
               clock_timestamp()
        FROM jobs AS j
        WHERE j.id IN (SELECT job_id FROM recorded) AND j.webhook_url IS NOT NULL
          AND 'job.output' = ANY (j.webhook_events)
          AND NOT EXISTS (
              SELECT 1 FROM webhook_deliveries AS d
              WHERE d.job_id = j.id AND d.event_type = 'job.output'
                AND d.created_at > clock_timestamp() - interval '{OUTPUT_WEBHOOK_MS} milliseconds')
        RETURNING 1
    )
    SELECT pg_notify('{CHANNEL}', string_agg(DISTINCT CAST(job_id AS text), ','))
    FROM recorded HAVING count(*) > 0
    """
).bindparams(
    bindparam("ids", type_=ARRAY(UUID(as_uuid=True))),
    bindparam("attempts", type_=ARRAY(INTEGER)),
    bindparam("texts", type_=ARRAY(TEXT)),
    bindparam("tokens", type_=ARRAY(TEXT)),
    bindparam("logprobs", type_=ARRAY(TEXT)),
)


def record(session: Session, pieces: list[Piece]) -> None:
    """Insert the pieces (at most one a job: rows of one job keep their order)."""
    if not pieces:
        return
    session.execute(
        _RECORD,
        {
            "ids": [p.job_id for p in pieces],
            "attempts": [p.attempt for p in pieces],
            "texts": [p.text for p in pieces],
            "tokens": [",".join(map(str, p.tokens)) for p in pieces],
            "logprobs": [orjson.dumps(p.logprobs).decode() if p.logprobs else None for p in pieces],
        },
    )


_TEXT_SO_FAR = text(
    f"SELECT string_agg(text, '' ORDER BY id) FROM job_events "
    f"WHERE job_id = :id AND status = '{OUTPUT}'"
)


def text_so_far(session: Session, job_id: uuid.UUID) -> str | None:
    """The text a running generation has recorded, None if none yet."""
    found: str | None = session.execute(_TEXT_SO_FAR, {"id": job_id}).scalar()
    return found


RECORD_S = 0.1  # a running generation's text is recorded at least this often
RECORD_TOKENS = 16  # or every this many tokens


@dataclass
class _Open:
    attempt: int
    text: str = ""
    tokens: list[int] | None = None
    since: float = 0.0
    recorded: bool = False  # a first piece went
    logprobs: list[dict[str, Any]] = field(default_factory=list)


class Recorder:
    """Coalesces each running generation's tokens into pieces: a job's first text
    at once (its time to first token, for a follower of its event stream), then
    every RECORD_S or RECORD_TOKENS, and the rest when it ends."""

    def __init__(self) -> None:
        self._open: dict[uuid.UUID, _Open] = {}

    def add(
        self, job_id: uuid.UUID, attempt: int, text: str, token: int | None, now: float,
        logprob: dict[str, Any] | None = None,
    ) -> None:  # fmt: skip
        """A token and the text it let out; `token` None for text without one (a tail
        held back for stop sequences, out once the sequence ended)."""
        piece = self._open.setdefault(job_id, _Open(attempt))
        if not piece.tokens:
            piece.tokens, piece.since = [], now
        if token is not None:
            piece.tokens.append(token)
        if logprob is not None:
            piece.logprobs.append(logprob)
        piece.text += text

    def due(self, now: float) -> list[Piece]:
        return [self._cut(job_id) for job_id, piece in list(self._open.items())
                if (piece.tokens or piece.text) and (
                    (piece.text and not piece.recorded) or now - piece.since >= RECORD_S
                    or len(piece.tokens or ()) >= RECORD_TOKENS)]  # fmt: skip

    def take(self, job_ids: list[uuid.UUID]) -> list[Piece]:
        """What is left of these jobs (they ended), and forget them."""
        pieces = []
        for job_id in job_ids:
            piece = self._open.pop(job_id, None)
            if piece is not None and (piece.tokens or piece.text):
                pieces.append(Piece(job_id, piece.attempt, piece.text, tuple(piece.tokens or ()),
                                    tuple(piece.logprobs)))  # fmt: skip
        return pieces

    def _cut(self, job_id: uuid.UUID) -> Piece:
        piece = self._open[job_id]
        cut = Piece(job_id, piece.attempt, piece.text, tuple(piece.tokens or ()),
                    tuple(piece.logprobs))  # fmt: skip
        piece.text, piece.tokens, piece.logprobs = "", [], []
        piece.recorded = piece.recorded or bool(cut.text)
        return cut


_RECORDED = text(
    f"SELECT tokens FROM job_events WHERE job_id = :id AND status = '{OUTPUT}' ORDER BY id"
)
_RECORDED_LOGPROBS = text(
    f"SELECT logprobs FROM job_events WHERE job_id = :id AND status = '{OUTPUT}' "
    "AND logprobs IS NOT NULL ORDER BY id"
)


def recorded_tokens(session: Session, job_id: uuid.UUID) -> list[int]:
    """Every token a job's earlier attempts recorded, in order: where a retry of a
    generation goes on from."""
    return [t for tokens in session.execute(_RECORDED, {"id": job_id}).scalars() for t in tokens]


def recorded_logprobs(session: Session, job_id: uuid.UUID) -> list[dict[str, Any]]:
    """The log-probabilities of those tokens (a generation that asked for them)."""
    rows = session.execute(_RECORDED_LOGPROBS, {"id": job_id}).scalars()
    return [entry for entries in rows for entry in entries]
