"""Collects each scenario's tally and writes docs/reliability.md at the end of the run."""

from __future__ import annotations

import os
import platform
import time
from pathlib import Path

from tests.faults.harness import Tally

TALLIES: dict[tuple[str, str], Tally] = {}

INTRO = """# Reliability: the fault suite's figures

`make test-faults` (also run by CI) starts the whole service on loopback for
each scenario (API under gunicorn, Celery workers, beat, a private PostgreSQL
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

Timings: leases 1.5 s, sweeps every 0.5 s, republish after 3 s, retry backoff
0.2-1 s (the production defaults are 60 s, 5 s, 60 s and 2-300 s).
"""


def record(tally: Tally) -> None:
    TALLIES[(tally.scenario, tally.guard)] = tally


def write(path: Path) -> None:
    if not TALLIES:
        return
    lines = [
        INTRO,
        f"Last run: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
        f"{os.cpu_count()} cores, {platform.system()} {platform.machine()}.",
        "",
        "| scenario | guard | jobs | acknowledged | completed | lost | dup. exec. | "
        "dup. results | illegal | recovery (s) | notes |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for t in sorted(TALLIES.values(), key=lambda t: (t.scenario, t.guard != "on")):
        recovery = "" if t.recovery_s is None else f"{t.recovery_s:g}"
        lines.append(
            f"| {t.scenario} | {t.guard} | {t.jobs} | {t.acknowledged} | {t.completed} | "
            f"{t.lost} | {t.duplicate_executions} | {t.duplicate_results} | "
            f"{t.illegal_transitions} | {recovery} | {'; '.join(t.notes)} |"
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    write_readme(path.parent.parent / "README.md")


README_BEGIN = "<!-- reliability: the guard-on rows of docs/reliability.md -->"
README_END = "<!-- /reliability -->"


def write_readme(readme: Path) -> None:
    """The README's short table: each scenario with its guards on, as this run saw it."""
    text = readme.read_text()
    start, end = text.find(README_BEGIN), text.find(README_END)
    if start < 0 or end < 0:
        return
    rows = [
        f"Last run: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, every guard on:",
        "",
        "| scenario | jobs | completed | lost | dup. exec. | dup. results | illegal "
        "| recovery (s) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for t in sorted(TALLIES.values(), key=lambda t: t.scenario):
        if t.guard != "on":
            continue
        recovery = "" if t.recovery_s is None else f"{t.recovery_s:g}"
        rows.append(
            f"| {t.scenario} | {t.jobs} | {t.completed} | {t.lost} | {t.duplicate_executions} | "
            f"{t.duplicate_results} | {t.illegal_transitions} | {recovery} |"
        )
    block = "\n".join([README_BEGIN, *rows, README_END])
    readme.write_text(text[:start] + block + text[end + len(README_END) :])
