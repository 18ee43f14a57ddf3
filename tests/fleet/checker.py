"""Reads a fault run's history (tests.fleet.client) and the database afterwards, and
says what went wrong, as Jepsen's checkers do: nothing is asserted while the run
is under way.

- lost: an acknowledged submit (or one whose answer was lost but whose
  Idempotency-Key the database holds) whose job is missing or not terminal;
- finished twice: a job with more than one terminal event;
- late: a job terminal later than `bound_s` after the later of its submit and the
  end of the last fault that began before it finished, that end moved on by the
  time the backlog left at it takes at the completion rate before the faults;
- sync: every call answered (200) or refused with 429, 503 or 504; one left
  hanging (the client's timeout) or answered otherwise is counted, but for calls
  to an API host while it was cut off (counted apart: nothing reaches it);
- recovery: after each fault's end, how long until the completion rate (5 s
  windows) is back to 95% of the rate before the first fault.
"""

from __future__ import annotations

import bisect
import itertools
import json
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import sqlalchemy as sa

TERMINAL = ("succeeded", "failed", "cancelled", "expired")
REFUSALS = (429, 503, 504)


@dataclass
class Fault:
    name: str
    start: float  # epoch seconds
    end: float
    cut_api: str | None = None  # the API host (its URL) this fault cut off

    def unreachable(self, event: dict[str, Any]) -> bool:
        """A call to the API host this fault cut off, while it was: no host can
        answer while no packet reaches it (a load balancer would send it elsewhere)."""
        return event.get("api") == self.cut_api and self.start <= event["t"] <= self.end


@dataclass
class Verdict:
    submits: int = 0
    acknowledged: int = 0
    indeterminate: int = 0
    accepted_unacknowledged: int = 0
    lost: list[str] = field(default_factory=list)
    finished_twice: list[str] = field(default_factory=list)
    late: list[tuple[str, float]] = field(default_factory=list)
    sync: Counter[str] = field(default_factory=Counter)
    sync_bad: int = 0
    sync_unreachable: int = 0
    sync_slowest_s: float = 0.0
    recovery_s: dict[str, float | None] = field(default_factory=dict)
    baseline_rate: float = 0.0
    drain_s: dict[str, float] = field(default_factory=dict)  # per fault: its backlog's
    # Per fault: of the jobs submitted while it lasted, how many were lost or
    # finished twice, and the last one's time to terminal after the fault's end.
    per_fault: dict[str, dict[str, float | None]] = field(default_factory=dict)

    def problems(self) -> list[str]:
        found = []
        if self.lost:
            found.append(f"{len(self.lost)} accepted job(s) lost: {self.lost[:5]}")
        if self.finished_twice:
            found.append(f"{len(self.finished_twice)} job(s) finished twice")
        if self.late:
            found.append(f"{len(self.late)} job(s) terminal late: {self.late[:5]}")
        if self.sync_bad:
            found.append(f"{self.sync_bad} sync call(s) hanging or answered wrongly: {self.sync}")
        return found

    def report(self) -> dict[str, Any]:
        return {
            "submits": self.submits, "acknowledged": self.acknowledged,
            "indeterminate": self.indeterminate,
            "accepted_unacknowledged": self.accepted_unacknowledged,
            "lost": len(self.lost), "finished_twice": len(self.finished_twice),
            "late": len(self.late), "sync": dict(self.sync), "sync_bad": self.sync_bad,
            "sync_to_a_host_cut_off": self.sync_unreachable,
            "sync_slowest_answer_s": round(self.sync_slowest_s, 2),
            "baseline_jobs_per_s": round(self.baseline_rate, 1), "drain_s": self.drain_s,
            "recovery_s": self.recovery_s, "per_fault": self.per_fault,
        }  # fmt: skip


def read_history(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def check(
    history: list[dict[str, Any]], engine: sa.Engine, faults: list[Fault], bound_s: float,
    recover_within_s: float,
) -> Verdict:  # fmt: skip
    verdict = Verdict()
    submits = [e for e in history if e["kind"] == "submit"]
    verdict.submits = len(submits)
    with engine.connect() as conn:
        by_key = {key: job for key, job in conn.execute(sa.text(
            "SELECT key, job_id::text FROM idempotency_keys"))}  # fmt: skip
        jobs = {row[0]: row[1:] for row in conn.execute(sa.text(
            "SELECT id::text, status, extract(epoch FROM finished_at) FROM jobs"))}  # fmt: skip
        terminal_events = Counter({job: n for job, n in conn.execute(sa.text(
            "SELECT job_id::text, count(*) FROM job_events WHERE status = ANY(:t) "
            "GROUP BY job_id"), {"t": list(TERMINAL)})})  # fmt: skip
    accepted: dict[str, float] = {}  # job id -> when it was submitted
    for event in submits:
        job_id = event.get("id")
        if job_id:
            verdict.acknowledged += 1
        elif "error" in event or event.get("status", 0) >= 500:
            verdict.indeterminate += 1
            job_id = by_key.get(event["key"])
            if job_id:
                verdict.accepted_unacknowledged += 1
        if job_id:
            accepted[job_id] = event["t"]
    finished_at = sorted(float(row[1]) for row in jobs.values() if row[1] is not None)
    verdict.baseline_rate, verdict.recovery_s = recovery(finished_at, faults, recover_within_s)
    # A fault leaves a backlog (a partitioned host's jobs, requeued at once): the
    # bound starts once the fleet could have drained it at its rate before the faults.
    verdict.drain_s = drain_times(accepted, jobs, faults, verdict.baseline_rate)
    for job_id, submitted in accepted.items():
        row = jobs.get(job_id)
        if row is None or row[0] not in TERMINAL:
            verdict.lost.append(job_id)
            continue
        if terminal_events[job_id] > 1:
            verdict.finished_twice.append(job_id)
        finished = float(row[1])
        began = [f.end + verdict.drain_s[f.name] for f in faults if f.start < finished]
        allowed = max([submitted, *began]) + bound_s
        if finished > allowed:
            verdict.late.append((job_id, round(finished - allowed, 1)))
    for event in (e for e in history if e["kind"] == "sync"):
        if any(fault.unreachable(event) for fault in faults):
            verdict.sync_unreachable += 1
            continue
        status = event.get("status")
        if status:
            verdict.sync_slowest_s = max(verdict.sync_slowest_s, event["latency"])
        label = str(status) if status else event.get("error", "?")
        verdict.sync[label] += 1
        if status != 200 and status not in REFUSALS:
            verdict.sync_bad += 1
    for fault in faults:
        during = [j for j, t in accepted.items() if fault.start <= t <= fault.end]
        ends = [float(jobs[j][1]) for j in during if j in jobs and jobs[j][1] is not None]
        verdict.per_fault[fault.name] = {
            "jobs_submitted": len(during),
            "lost": sum(j in verdict.lost for j in during),
            "finished_twice": sum(j in verdict.finished_twice for j in during),
            "last_terminal_after_end_s": round(max(ends, default=fault.end) - fault.end, 1),
            "back_to_95pct_s": verdict.recovery_s.get(fault.name),
        }
    return verdict


def drain_times(
    accepted: dict[str, float], jobs: dict[str, Any], faults: list[Fault], rate_per_s: float
) -> dict[str, float]:
    """Per fault: the jobs submitted by its end and not terminal at it, over the
    completion rate before the faults: the seconds the fleet needs to catch up."""
    drain: dict[str, float] = {}
    for fault in faults:
        behind = sum(
            1 for job_id, submitted in accepted.items()
            if submitted <= fault.end and (job_id not in jobs or jobs[job_id][1] is None
                                           or float(jobs[job_id][1]) > fault.end)
        )  # fmt: skip
        drain[fault.name] = round(behind / rate_per_s, 1) if rate_per_s > 0 else 0.0
    return drain


def rate(finished: list[float], start: float, seconds: float) -> float:
    within = bisect.bisect_left(finished, start + seconds) - bisect.bisect_left(finished, start)
    return within / seconds


def recovery(
    finished: list[float], faults: list[Fault], within_s: float, window_s: float = 5.0
) -> tuple[float, dict[str, float | None]]:
    """The completion rate before the first fault, and after each fault's end the
    seconds until a window's rate is back to 95% of it (None: not within `within_s`)."""
    if not finished or not faults:
        return 0.0, {}
    first = min(f.start for f in faults)
    baseline = rate(finished, first - 30.0, 30.0)
    back: dict[str, float | None] = {}
    for fault in faults:
        back[fault.name] = None
        at = fault.end
        while at - fault.end <= within_s:
            if rate(finished, at, window_s) >= 0.95 * baseline:
                back[fault.name] = round(at - fault.end, 1)
                break
            at += 1.0
    return baseline, back


def when(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


def check_generations(history: list[dict[str, Any]], engine: sa.Engine) -> dict[str, Any]:
    """Every generation followed to its end: its streamed text equal to its final
    text, and each prompt's final text the same every time (greedy decoding), a
    generation resumed on another worker after its host died included."""
    runs = [e for e in history if e["kind"] == "generation"]
    with engine.connect() as conn:
        attempts = {job: n for job, n in conn.execute(sa.text(
            "SELECT id::text, attempts FROM jobs WHERE model = 'smollm2'"))}  # fmt: skip
    finals: dict[str, Counter[str]] = {}
    for run in runs:
        if run.get("status") == "succeeded":
            finals.setdefault(run["prompt"], Counter())[run["final"]] += 1
    expected = {prompt: texts.most_common(1)[0][0] for prompt, texts in finals.items()}
    problems = []
    for run in runs:
        if run.get("status") != "succeeded":
            problems.append(f"generation {run.get('id')} ended {run.get('status')}")
        elif run["streamed"] != run["final"]:
            problems.append(f"generation {run['id']}: streamed text differs from its result")
        elif run["final"] != expected[run["prompt"]]:
            problems.append(f"generation {run['id']}: text differs from the same prompt's")
    resumed = [r for r in runs if attempts.get(r.get("id") or "", 1) > 1]
    return {
        "generations": len(runs),
        "succeeded": sum(r.get("status") == "succeeded" for r in runs),
        "resumed_after_a_worker_was_lost": len(resumed),
        "resumed_equal_to_uninterrupted": sum(
            r.get("final") == expected.get(r["prompt"]) for r in resumed
        ),
        "stream_reconnects": sum(r.get("reconnects", 0) for r in runs),
        "problems": problems,
    }


def check_schedule(engine: sa.Engine, schedule_id: str, every_s: float, since: float,
                   until: float) -> dict[str, Any]:  # fmt: skip
    """Each tick of the schedule between `since` and `until` fired once: no tick
    twice (two runs of one scheduled_for), none skipped (a gap of two periods)."""
    with engine.connect() as conn:
        rows = conn.execute(sa.text(
            "SELECT extract(epoch FROM scheduled_for), status FROM batches "
            "WHERE schedule_id = CAST(:s AS uuid) ORDER BY scheduled_for"),
            {"s": schedule_id}).all()  # fmt: skip
    within = [(float(t), status) for t, status in rows if since <= float(t) <= until]
    ticks = [t for t, _ in within]
    gaps = [b - a for a, b in itertools.pairwise(ticks)]
    return {
        "runs": len(rows),
        "ticks_in_run": len(ticks),
        "expected_ticks": int((until - since) // every_s),
        "fired_twice": len(ticks) - len(set(ticks)),
        "skipped": sum(round(g / every_s) - 1 for g in gaps if g > 1.5 * every_s),
        "not_succeeded": sum(status != "succeeded" for _, status in within),
    }
