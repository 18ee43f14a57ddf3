"""Fault scenario 28: pipeline jobs under worker kills and a Redis restart.

Pipeline jobs (a code step that splits a text into words, then a code step mapped
over the words, each word a slice of its own) run on two workers while worker
children are SIGKILLed repeatedly and Redis is killed and restarted from its AOF.
Every accepted job must end with its answer, and no step that had finished (its
record written) may run again: each code call logs when it started, and a call
that started after its step's record was written is a finished step run twice.
With the `steps` guard off (a retried job does not read its finished steps) the
finished steps of every retried job run again.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import sqlalchemy as sa

from tests.faults.harness import FaultStack
from tests.faults.scenarios import GUARD, check

pytestmark = [pytest.mark.faults, pytest.mark.processes]

JOBS = 40
WORDS = 6

SPLIT = """
import os, time
import numpy as np
INPUTS = [{"name": "text", "datatype": "BYTES", "shape": [1]}]
OUTPUTS = [{"name": "words", "datatype": "BYTES", "shape": [-1]}]

def preprocess(batch):
    out = []
    for request in batch:
        text = request["text"][0].decode()
        with open(os.environ["COUNT_LOG"], "a") as log:
            log.write(f"split {text.split()[0]} {time.time()}\\n")
        out.append({"words": np.array(text.split(), dtype=object)})
    return out
"""

SHOUT = """
import os, time
import numpy as np
INPUTS = [{"name": "text", "datatype": "BYTES", "shape": [-1]}]
OUTPUTS = [{"name": "shout", "datatype": "BYTES", "shape": [-1]}]

def one(word):
    with open(os.environ["COUNT_LOG"], "a") as log:
        log.write(f"shout {word.decode()} {time.time()}\\n")
    time.sleep(0.08)
    return word.upper()

def postprocess(batch):
    return [{"shout": np.array([one(w) for w in r["text"]], dtype=object)} for r in batch]
"""


def repository(root: Path) -> Path:
    words = {"name": "text", "datatype": "BYTES", "shape": [-1]}
    models = {
        "count-split": (SPLIT, {
            "inputs": [{"name": "text", "datatype": "BYTES", "shape": [1]}],
            "outputs": [{"name": "words", "datatype": "BYTES", "shape": [-1]}],
            "batching": {"max_batch_size": 0}}),
        "count-shout": (SHOUT, {  # one word a slice: each finished word is recorded
            "inputs": [words], "outputs": [{**words, "name": "shout"}],
            "batching": {"max_batch_size": 1}}),
    }  # fmt: skip
    for name, (source, card) in models.items():
        folder = root / name / "1"
        folder.mkdir(parents=True)
        (folder / "model.py").write_text(source)
        (folder / "card.json").write_text(json.dumps(card))
    pipeline = root / "durable" / "1"
    pipeline.mkdir(parents=True)
    pipeline.joinpath("card.json").write_text(json.dumps({
        "platform": "ensemble",
        "inputs": [{"name": "text", "datatype": "BYTES", "shape": [1]}],
        "outputs": [{"name": "shouts", "datatype": "BYTES", "shape": [-1],
                     "from": "each.shout"}],
        "steps": [
            {"name": "split", "model": "count-split", "inputs": {"text": "text"}},
            {"name": "each", "model": "count-shout", "map": "split.words",
             "inputs": {"text": "split.words"}},
        ],
        "batching": {"max_batch_size": 4},
    }))  # fmt: skip
    return root


def reruns(stack: FaultStack, log: Path, ids: dict[str, str]) -> tuple[int, int]:
    """Calls of a finished step (one started after its record was written), and
    calls in all."""
    with stack.engine.connect() as conn:
        query = sa.text("SELECT job_id::text, step, element, extract(epoch FROM finished_at) "
                        "AS at FROM job_steps WHERE job_id::text = ANY(:ids)")  # fmt: skip
        rows = conn.execute(query, {"ids": list(ids.values())}).all()
    finished = {(r.job_id, r.step, r.element): float(r.at) for r in rows}
    late = calls = 0
    for line in log.read_text().splitlines():
        kind, word, started = line.split()
        job = ids[word.split("w")[0]]
        key = (job, "split", -1) if kind == "split" else (job, "each", int(word.split("w")[1]))
        calls += 1
        # (a margin for the two clocks' reading: the record's is the database's)
        if key in finished and float(started) > finished[key] + 0.005:
            late += 1
    return late, calls


@GUARD
def test_28_pipelines_under_worker_kills_and_a_redis_restart(
    make_stack: Callable[..., FaultStack], guarded: bool, tmp_path: Path
) -> None:
    log = tmp_path / "calls.log"
    stack = make_stack("" if guarded else "steps", models=repository(tmp_path / "models"),
                       COUNT_LOG=str(log), JOB_MAX_ATTEMPTS="8")  # fmt: skip
    stack.start_all(workers=2, concurrency=2)
    texts = {f"j{i}": " ".join(f"j{i}w{k}" for k in range(WORDS)) for i in range(JOBS)}
    bodies = [{"model": "durable", "inputs": {"text": [text]}} for text in texts.values()]
    acked = stack.submit(bodies)
    kills, redis_restarted = 0, False
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and stack.wait_terminal(acked, timeout=0.5) is None:
        if kills == 3 and not redis_restarted:
            stack.kill_redis()
            time.sleep(0.5)
            stack.restart_redis(keep_data=True)
            redis_restarted = True
        children = [c for n in ("worker0", "worker1") for c in stack.services[n].children()]
        if children and kills < 6:
            random.choice(children).kill()
            kills += 1
    started = time.monotonic()
    done = stack.wait_terminal(acked, timeout=120)
    tally = stack.tally("28. Pipelines: worker children killed, Redis restarted",
                        "on" if guarded else "off: steps", acked, JOBS)  # fmt: skip
    tally.recovery_s = None if done is None else round(time.monotonic() - started, 1)
    with stack.engine.connect() as conn:
        query = sa.text("SELECT id::text, status FROM jobs WHERE id::text = ANY(:ids)")
        answers = {row[0]: row[1] for row in conn.execute(query, {"ids": acked})}
    ids = dict(zip(texts, acked, strict=True)) if len(acked) == JOBS else {}
    late, calls = reruns(stack, log, ids) if ids else (-1, 0)
    tally.notes.append(f"{kills} kills, Redis restarted; {late} finished steps ran again "
                       f"({calls} code calls for {JOBS * (WORDS + 1)} steps)")  # fmt: skip
    check(tally, guarded, lambda t: late > 0)
    if guarded:
        assert len(acked) == JOBS and set(answers.values()) == {"succeeded"}, answers
        assert late == 0, f"{late} finished steps ran again"
        assert kills >= 3 and redis_restarted
