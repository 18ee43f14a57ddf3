"""The job and batch statuses (app.statuses) are the words the database allows and
the API shows, in the same order; the open and terminal sets split them; the SQL
lists are quoted as PostgreSQL reads them."""

from __future__ import annotations

import ast
import re
from enum import StrEnum

import pytest
import sqlalchemy as sa

from app.batches.representation import BatchSchema
from app.jobs.representation import JobSchema
from app.platform.database import Database
from app.platform.settings import ROOT
from app.statuses import (
    BATCH_OPEN,
    BATCH_OPEN_SQL,
    BATCH_TERMINAL,
    BATCH_TERMINAL_SQL,
    OPEN,
    OPEN_SQL,
    TERMINAL,
    TERMINAL_SQL,
    BatchStatus,
    JobStatus,
    ordered,
    sql_list,
)

CONSTRAINTS = {"jobs_status_valid": JobStatus, "batches_status_valid": BatchStatus}


def _quoted(sql: str) -> list[str]:
    return re.findall(r"'((?:[^']|'')*)'", sql)


def _migrations_checks() -> dict[str, list[str]]:
    """Each status CHECK constraint's words, as the migrations create it."""
    found: dict[str, list[str]] = {}
    for path in sorted((ROOT / "migrations" / "versions").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and node.args):
                continue
            names = [k.value.value for k in node.keywords
                     if k.arg == "name" and isinstance(k.value, ast.Constant)]  # fmt: skip
            if len(names) == 1 and names[0] in CONSTRAINTS:
                assert names[0] not in found, f"{names[0]} made twice"
                found[names[0]] = _quoted(ast.literal_eval(node.args[0]))
    return found


def test_the_enums_are_the_migrations_check_constraints() -> None:
    checks = _migrations_checks()
    assert checks.keys() == CONSTRAINTS.keys()
    for name, enum in CONSTRAINTS.items():
        assert checks[name] == [s.value for s in enum], name


def test_the_enums_are_the_database_check_constraints(database: Database) -> None:
    with database.engine.connect() as conn:
        rows = conn.execute(
            sa.text(
                "SELECT conname, pg_get_constraintdef(oid) AS definition FROM pg_constraint "
                "WHERE conname = ANY(:names)"
            ),
            {"names": list(CONSTRAINTS)},
        ).all()
    assert {r.conname for r in rows} == CONSTRAINTS.keys()
    for r in rows:
        assert _quoted(r.definition) == [s.value for s in CONSTRAINTS[r.conname]], r.conname


def test_the_schemas_show_the_statuses_in_their_order() -> None:
    job = JobSchema().fields["status"].metadata["enum"]
    batch = BatchSchema().fields["status"].metadata["enum"]
    assert job == ["queued", "running", "succeeded", "failed", "cancelled", "expired"]
    assert batch == [
        "queued", "running", "succeeded", "partially_succeeded", "failed", "cancelled",
    ]  # fmt: skip
    assert all(type(word) is str for word in [*job, *batch])


@pytest.mark.parametrize(
    ("enum", "open_", "terminal"),
    [(JobStatus, OPEN, TERMINAL), (BatchStatus, BATCH_OPEN, BATCH_TERMINAL)],
)
def test_open_and_terminal_split_the_statuses(
    enum: type[StrEnum], open_: frozenset[StrEnum], terminal: frozenset[StrEnum]
) -> None:
    assert open_ | terminal == set(enum)
    assert not open_ & terminal
    assert {s.value for s in open_} == {"queued", "running"}


def test_the_members_are_their_words() -> None:
    assert JobStatus.SUCCEEDED == "succeeded"
    assert f"{BatchStatus.PARTIALLY_SUCCEEDED}" == "partially_succeeded"
    assert "expired" in TERMINAL and "queued" not in TERMINAL


def test_sql_lists_are_quoted_in_the_enums_order() -> None:
    assert sql_list([JobStatus.RUNNING, JobStatus.QUEUED]) == "'queued', 'running'"
    assert OPEN_SQL == BATCH_OPEN_SQL == "'queued', 'running'"
    assert TERMINAL_SQL == "'succeeded', 'failed', 'cancelled', 'expired'"
    assert BATCH_TERMINAL_SQL == "'succeeded', 'partially_succeeded', 'failed', 'cancelled'"
    assert ordered(TERMINAL) == ("succeeded", "failed", "cancelled", "expired")
    assert sql_list([]) == ""

    class Odd(StrEnum):
        QUOTED = "it's"
        PLAIN = "plain"

    assert sql_list(Odd) == "'it''s', 'plain'"
    assert _quoted(sql_list(Odd)) == ["it''s", "plain"]
