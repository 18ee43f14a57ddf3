"""A pipeline job's finished steps (`job_steps`): written as each step (or each
slice of a mapped step's elements) finishes, read when a retried job resumes.
A row is written once: a second writer of the same step (a duplicate delivery,
an attempt whose lease ran out) keeps the first one's outputs."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from sqlalchemy import bindparam, text
from sqlalchemy.dialects.postgresql import ARRAY, BYTEA, INTEGER, TEXT
from sqlalchemy.orm import Session

from app.jobs.transitions import UUIDS

WHOLE = -1  # the element of a step that is not mapped


@dataclass(frozen=True, slots=True)
class StepRow:
    job_id: uuid.UUID
    step: str
    element: int
    attempt: int
    outputs: bytes  # packed (app.runtime.tensors.pack)


_RECORD = text(
    """
    INSERT INTO job_steps (job_id, step, element, attempt, outputs)
    SELECT * FROM unnest(:ids, :steps, :elements, :attempts, :outputs)
    ON CONFLICT (job_id, step, element) DO NOTHING
    """
).bindparams(
    bindparam("ids", type_=UUIDS),
    bindparam("steps", type_=ARRAY(TEXT)),
    bindparam("elements", type_=ARRAY(INTEGER)),
    bindparam("attempts", type_=ARRAY(INTEGER)),
    bindparam("outputs", type_=ARRAY(BYTEA)),
)

_RECORDED = text(
    "SELECT job_id, step, element, outputs FROM job_steps WHERE job_id = ANY(:ids)"
).bindparams(bindparam("ids", type_=UUIDS))


def record(session: Session, rows: list[StepRow]) -> None:
    if rows:
        session.execute(_RECORD, {
            "ids": [r.job_id for r in rows], "steps": [r.step for r in rows],
            "elements": [r.element for r in rows], "attempts": [r.attempt for r in rows],
            "outputs": [r.outputs for r in rows],
        })  # fmt: skip


def recorded(
    session: Session, job_ids: list[uuid.UUID]
) -> dict[uuid.UUID, dict[tuple[str, int], bytes]]:
    """Each job's finished steps: (step, element) -> packed outputs."""
    found: dict[uuid.UUID, dict[tuple[str, int], bytes]] = {}
    for row in session.execute(_RECORDED, {"ids": job_ids}):
        found.setdefault(row.job_id, {})[(row.step, row.element)] = bytes(row.outputs)
    return found


def count(session: Session, job_id: uuid.UUID) -> int:
    return int(session.execute(text("SELECT count(*) FROM job_steps WHERE job_id = :id"),
                               {"id": job_id}).scalar_one())  # fmt: skip
