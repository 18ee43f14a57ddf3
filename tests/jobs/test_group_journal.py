"""Inline calls journaling at once share one XADD, and each still returns only
once its own record is in the journal (real Redis)."""

from __future__ import annotations

import threading
import uuid
from datetime import UTC, datetime
from typing import Any

import numpy as np
import pytest
import redis

from app.jobs import staging
from app.platform.settings import Settings
from app.sync import records
from app.sync.records import GroupJournal, Record
from tests.support import wait_until


def _record(tenant_id: int = 1) -> Record:
    return staging.call_record(
        ("digits", "1"), 1, tenant_id, datetime.now(UTC), 0.001, outputs={"label": np.array([1])}
    )


def _ids_in(client: redis.Redis, entry: bytes) -> set[uuid.UUID]:
    found: Any = client.xrange(records.JOURNAL, entry, entry)
    return {records.decode(payload)["id"] for _, fields in found for payload in fields.values()}


@pytest.fixture
def client(settings: Settings) -> redis.Redis:
    made = redis.Redis.from_url(settings.redis_url)
    made.delete(records.JOURNAL)
    return made


def test_callers_waiting_while_one_journals_share_the_next_xadd(client: redis.Redis) -> None:
    appended: list[list[Record]] = []
    handed: list[tuple[bytes | None, list[Record]]] = []
    first_in, release = threading.Event(), threading.Event()

    def append(these: list[Record]) -> bytes:
        appended.append(these)
        if len(appended) == 1:
            first_in.set()
            assert release.wait(30)
        return records.journal(client, these)

    group = GroupJournal(append, lambda entry, these: handed.append((entry, these)))
    made = [_record() for _ in range(6)]
    answers: dict[uuid.UUID, bytes] = {}

    def call(record: Record) -> None:
        answers[record["id"]] = group.journal([record])

    threads = [threading.Thread(target=call, args=(made[0],))]
    threads[0].start()
    assert first_in.wait(30)
    threads += [threading.Thread(target=call, args=(record,)) for record in made[1:]]
    for thread in threads[1:]:
        thread.start()
    wait_until(lambda: len(group._waiting) == 5, "five callers waiting", 30)
    assert answers == {}  # nobody returns before its record is journaled
    release.set()
    for thread in threads:
        thread.join(30)

    assert [len(these) for these in appended] == [1, 5]
    assert [these for _, these in handed] == appended  # each group written behind once
    for record in made:
        assert record["id"] in _ids_in(client, answers[record["id"]])
    assert answers[made[1]["id"]] == answers[made[5]["id"]] != answers[made[0]["id"]]


def test_every_caller_of_a_failed_xadd_hears_it_and_the_next_round_journals(
    client: redis.Redis,
) -> None:
    failing = [True]

    def append(these: list[Record]) -> bytes:
        if failing[0]:
            raise redis.ConnectionError("Redis away")
        return records.journal(client, these)

    group = GroupJournal(append, lambda entry, these: None)
    with pytest.raises(redis.ConnectionError):
        group.journal([_record()])
    failing[0] = False
    record = _record()
    assert record["id"] in _ids_in(client, group.journal([record]))


def test_many_callers_at_once_each_find_their_record_journaled(client: redis.Redis) -> None:
    handed: list[Record] = []
    lock = threading.Lock()

    def write_later(entry: bytes | None, these: list[Record]) -> None:
        with lock:
            handed.extend(these)

    group = GroupJournal(lambda these: records.journal(client, these), write_later)
    missing: list[uuid.UUID] = []

    def calls() -> None:
        for _ in range(40):
            record = _record()
            if record["id"] not in _ids_in(client, group.journal([record])):
                missing.append(record["id"])

    threads = [threading.Thread(target=calls) for _ in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert missing == []
    assert len(handed) == len({record["id"] for record in handed}) == 16 * 40
