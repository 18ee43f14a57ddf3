"""Collects each scenario's tally and writes docs/reliability.md at the end of the run."""

from __future__ import annotations

import json
import os
import platform
import shutil
import time
from dataclasses import asdict
from pathlib import Path

from tests.faults.harness import Tally

TALLIES: dict[tuple[str, str], Tally] = {}

INTRO = """# Reliability: the fault suite's figures

`make test-faults` (also run by CI) starts the whole service on loopback for
each scenario (the API under granian, Celery workers, beat, a private PostgreSQL
and Redis with AOF), injects the fault, and tallies from the database what
became of every job: a trigger logs each change of a job's status, attempt or
result. Each scenario also runs with the guard that handles it switched off
and must then fail: that is what shows the guard is doing the work. No setting
switches a guard off: the suite then starts its workers and beat from its own
entry point (`tests/faults/worker.py`), which builds their container with that
guard off (`app.jobs.guards.Guards`). Workers run as in production: one
wake-up message per model, claims of many jobs at once, and micro-batching
(`digits` runs up to 64 rows per ONNX Runtime call).

- **acknowledged**: jobs answered 202 (or rows committed, where the scenario
  stages a crash); **completed**: reached the expected terminal state;
- **lost**: acknowledged but not terminal when the scenario ended;
- **dup. exec.**: a second claim while another attempt still held a live lease
  (inference running twice at once); **dup. results**: a result written over a
  result; **illegal**: a status change outside the state machine;
- **recovery**: seconds from the end of the fault (restart) until every job was
  terminal; empty when they never were.

The stream door's scenarios (9, 10) count input entries appended to a
binding's log, read by real consumer processes (`python -m app.streams`; where a
crash is staged or a guard is off, the suite's own entry point,
`tests/faults/consumer.py`): **completed** is an entry with a succeeded output
entry; **lost** one with no output entry; **dup. exec.** also counts jobs
beyond one per entry; **dup. results** also counts output entries beyond one
per entry. Their guards: `ack` (an entry is acknowledged only after its job's
record is committed), `redelivery` (a redelivered entry finds its job by the
entry's id), `dedupe` (a result is appended under a mark set in the same step).

Scenarios 12-19 (their modules: `tests/faults/test_faults_*.py`):
**12** runs the worker in a memory cgroup of its own (its usage once up plus
384 MiB) and a batch's row makes the kernel OOM-kill the child running its
chunk at every attempt; **completed** counts the poison chunk when it ends
failed with a dead letter, as expected. **13** puts PostgreSQL's data directory
on a 160 MiB tmpfs and fills it: first its tables (submits needing a page are
refused 503), then its WAL (PostgreSQL panics and stays down until space
returns and it is started again, as a supervisor would). **14** fills the file
store (a 16 MiB tmpfs) under an upload (507, nothing kept) and under batches'
result writes (retried while attempts remain, then the batch fails; none ends
succeeded with a cut-off result). **15** and **16** send one worker's traffic to
PostgreSQL, then to Redis, through a TCP proxy the test cuts for 6 s (four
leases) without closing anything, then heals; there **dup. results** also
counts writes that finish a job twice with the same bytes. **17** runs a worker
whose wall clock is an hour ahead (the suite's entry point shifts every
`datetime`/`time` read of the service's own code); **18** keeps a webhook
receiver down for six simulated hours (the test moves the stored webhook times
back to the next due one whenever nothing is in flight); neither has a guard
to switch off: every time is PostgreSQL's `now()`. **19** empties Redis during
a 10 s burst of submits.

Scenarios 20-23 (`tests/faults/test_faults_generation.py`) follow generations
of the chat model (`smollm2`, greedy, 64 tokens) through a fault, each call
twice: as a client of the OpenAI-compatible door streams it, and by its job's
event stream (`GET /jobs/<id>/events`, connecting again with `Last-Event-ID`
after every cut). **dup. tokens** and **missing tokens** add up, over every
stream followed, the tokens it got twice and those it never got against an
uninterrupted run of the same call (in the model's tokens; empty where a
scenario follows no stream). **20** SIGKILLs the worker child at staged points
of its decode loop (`tests/faults/decode_crash.py`): in a prompt's prefill while
another generation decodes, in a decode call, right after recording a piece
not yet published. **21** kills Redis under 16 streaming calls and restarts it
from its AOF 2 s later; **22** cuts one call's event stream ten times, its
worker child killed once meanwhile; **23** stops PostgreSQL (immediate) for 3 s
under four calls. Their guard, `resume`: a retried generation goes on from the
tokens its dead attempt recorded; off, it starts again from its prompt and its
event stream sends the text recorded before the fault twice.

Scenarios 25-27 (`tests/faults/test_faults_repository.py`) change the model
repository while the service serves, with the operator's commands
(`manage.py models add|unload|remove`) against the running processes. **25**
runs the churn of `tests/churn.py`: 16 clients of four tenants on every door
(KServe v2 over HTTP in JSON and binary, gRPC unary and streaming, an inline
model, async jobs on two models) while a model is added and called on every
door, `digits` is rolled to version 2, version 1 is unloaded and the added model
removed; **acknowledged** counts the async jobs accepted, **completed** those
that ended succeeded (or failed `model_unavailable`, being of version 1 when it
was unloaded), and the notes count the sync calls by status: 2xx, 404 only for
what was gone, 503 or 429 with `Retry-After`, never a 504. **26** SIGKILLs a
worker child twice while `models add` runs, under sync calls: the added model
answers at once, and every answered call has its record. **27** removes two
models while calls of both are taken, and SIGKILLs the worker children holding
them: **completed** counts calls answered 200 (finished on the removed version),
404 (the model gone) or 503 (a model not idempotent whose worker died). None of
the three has a guard to switch off.

Scenario 28 (`tests/faults/test_faults_pipelines.py`) runs 40 pipeline jobs
(a code step that splits a text into six words, then a code step mapped over the
words, each word a slice recorded on its own) on two workers while worker
children are SIGKILLed six times and Redis is killed and restarted from its AOF.
Each code call logs when it started: a call that started after its step's
record was written is a finished step run twice, and the notes count them. Its
guard, `steps`: a retried pipeline job reads its finished steps and resumes at
the first unfinished one; off, it runs them all again.

Timings: leases 1.5 s, sweeps every 0.5 s, republish after 3 s, retry backoff
0.2-1 s, consumers claim entries idle for 1.5 s (the production defaults are
60 s, 5 s, 60 s, 2-300 s and 30 s).
"""


def record(tally: Tally) -> None:
    TALLIES[(tally.scenario, tally.guard)] = tally


def hand_over(path: Path) -> None:
    """This test process's tallies, for the run's controller (pytest-xdist) to write."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps([asdict(t) for t in TALLIES.values()]))


def take_over(folder: Path) -> None:
    """The tallies the test processes handed over (none when the run had one)."""
    for path in sorted(folder.glob("*.json")):
        for each in json.loads(path.read_text()):
            record(Tally(**each))
    shutil.rmtree(folder, ignore_errors=True)


def order(scenario: str) -> tuple[int, str]:
    """Scenarios in their numbers' order (10 after 9, not after 1)."""
    number = scenario.split(".", 1)[0]
    return (int(number) if number.isdigit() else 0, scenario)


TABLE_CELLS = 13
TOKEN_CELLS = 2  # dup. tokens, missing tokens: just before recovery, newer than the rest


def earlier_rows(text: str, cells: int) -> dict[tuple[str, str], str]:
    """The table rows of an earlier run (`cells` columns), by (scenario, guard).
    A row written before the token columns gets them empty."""
    rows: dict[tuple[str, str], str] = {}
    for line in text.splitlines():
        found = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.startswith("| ") or found[0] == "scenario":
            continue
        if len(found) == cells - TOKEN_CELLS:
            recovery = len(found) - (2 if cells == TABLE_CELLS else 1)
            found[recovery:recovery] = [""] * TOKEN_CELLS
            line = "| " + " | ".join(found) + " |"
        if len(found) != cells:
            continue
        rows[(found[0], found[1] if cells == TABLE_CELLS else "on")] = line
    return rows


def _tokens(t: Tally) -> str:
    """The token cells: empty where the scenario followed no generation's stream."""
    return " | ".join("" if n is None else str(n) for n in (t.duplicate_tokens, t.missing_tokens))


def _carried(kept: dict[tuple[str, str], str]) -> list[str]:
    if not kept:
        return []
    names = ", ".join(sorted({s.split(".", 1)[0] for s, _ in kept}, key=lambda n: order(n)))
    return [f"Scenarios {names}: rows of an earlier run (not run this time).", ""]


def write(path: Path) -> None:
    """docs/reliability.md with this run's tallies; rows of scenarios this run left
    out (a selection with -k) are kept from the file as it was."""
    if not TALLIES:
        return
    kept = earlier_rows(path.read_text(), TABLE_CELLS) if path.exists() else {}
    kept = {key: row for key, row in kept.items() if key not in TALLIES}
    lines = [
        INTRO,
        f"Last run: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
        f"{os.cpu_count()} cores, {platform.system()} {platform.machine()}.",
        "",
        *_carried(kept),
        "| scenario | guard | jobs | acknowledged | completed | lost | dup. exec. | "
        "dup. results | illegal | dup. tokens | missing tokens | recovery (s) | notes |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    rows = dict(kept)
    for t in TALLIES.values():
        recovery = "" if t.recovery_s is None else f"{t.recovery_s:g}"
        rows[(t.scenario, t.guard)] = (
            f"| {t.scenario} | {t.guard} | {t.jobs} | {t.acknowledged} | {t.completed} | "
            f"{t.lost} | {t.duplicate_executions} | {t.duplicate_results} | "
            f"{t.illegal_transitions} | {_tokens(t)} | {recovery} | {'; '.join(t.notes)} |"
        )
    for key in sorted(rows, key=lambda k: (order(k[0]), k[1] != "on", k[1])):
        lines.append(rows[key])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
