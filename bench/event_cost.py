"""What recording job events costs PostgreSQL, per job.

A job's life as the service lives it, in batches: one multi-row INSERT (the
API's coalesced submits), one claim and one finish (a worker's micro-batch),
each committed, while two connections LISTEN as two API processes do. Run once
with the jobs table's triggers on and once with them off, in a scratch
database; the difference is what events, webhook deliveries and NOTIFYs cost.
CPU is read from /proc for every backend involved (the writer's and the
listeners'), so PostgreSQL must run on this machine.

    python -m bench.event_cost [--jobs 12800] [--batch 64]
"""

from __future__ import annotations

import argparse
import json
import os
import select
import threading
import time
import uuid
from typing import Any

import psycopg2
import sqlalchemy as sa
from sqlalchemy.orm import Session

from app.jobs.claims import claim_next
from app.jobs.inserts import INSERT_JOBS
from app.jobs.transitions import Outcome, finish
from app.platform.migrate import upgrade
from app.tenancy.keys import create_api_key
from bench.infra import Database, Servers

TICK_S = 1 / os.sysconf("SC_CLK_TCK")


def backend_cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * TICK_S  # utime, stime


class Listener:
    """One LISTEN connection, drained in a thread; counts notifications and ids."""

    def __init__(self, dsn: str) -> None:
        self.conn = psycopg2.connect(dsn)
        self.conn.autocommit = True
        with self.conn.cursor() as cur:
            cur.execute("LISTEN job_events")
            cur.execute("SELECT pg_backend_pid()")
            self.pid = cur.fetchone()[0]  # type: ignore[index]
        self.notifies = self.ids = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._drain, daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        while not self._stop.is_set():
            if select.select([self.conn], [], [], 0.1) == ([], [], []):
                continue
            self.conn.poll()
            for note in self.conn.notifies:
                self.notifies += 1
                self.ids += len(note.payload.split(","))
            self.conn.notifies.clear()

    def stop(self) -> None:
        time.sleep(0.3)  # the last notifications arrive
        self._stop.set()
        self._thread.join()


def lifecycle(database: Database, jobs: int, batch: int, triggers: bool) -> dict[str, Any]:
    engine = sa.create_engine(database.psycopg2_url)
    with engine.begin() as conn:
        switch = "ENABLE" if triggers else "DISABLE"
        conn.execute(sa.text(f"ALTER TABLE jobs {switch} TRIGGER USER"))
    with Session(engine) as session:
        tenant_id = session.execute(sa.text("SELECT id FROM tenants LIMIT 1")).scalar_one()
        pid = session.execute(sa.text("SELECT pg_backend_pid()")).scalar_one()
        listeners = [Listener(database.dsn) for _ in range(2)]
        pids = [pid, *(listener.pid for listener in listeners)]
        before = sum(backend_cpu_s(p) for p in pids)
        started = time.perf_counter()
        for _ in range(jobs // batch):
            rows = [
                {
                    "id": uuid.uuid4(),
                    "tenant_id": tenant_id,
                    "model": "digits",
                    "model_version": "1",
                    "status": "queued",
                    "input_data": bytes(300),
                    "batch_rows": 1,
                    "attempts": 0,
                    "max_attempts": 3,
                }
                for _ in range(batch)
            ]
            session.execute(INSERT_JOBS, rows)
            session.commit()
            claimed, _ = claim_next(session, "digits", batch, lease_s=60)
            session.commit()
            outcomes = [
                Outcome(j.id, j.attempt, "succeeded", output_data=bytes(8)) for j in claimed
            ]
            finish(session, outcomes)
            session.commit()
        elapsed = time.perf_counter() - started
        for listener in listeners:
            listener.stop()
        cpu = sum(backend_cpu_s(p) for p in pids) - before
        for listener in listeners:
            listener.conn.close()
        events = session.execute(sa.text("SELECT count(*) FROM job_events")).scalar_one()
        session.execute(sa.text("TRUNCATE jobs, job_events CASCADE"))
        session.commit()
    engine.dispose()
    return {
        "triggers": triggers,
        "jobs": jobs,
        "postgres_cpu_ms_per_job": round(cpu * 1000 / jobs, 4),
        "wall_ms_per_job": round(elapsed * 1000 / jobs, 4),
        "job_events_per_job": round(events / jobs, 2),
        "notifies_per_job_per_listener": round(listeners[0].notifies / jobs, 4),
        "ids_per_job_per_listener": round(listeners[0].ids / jobs, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=12800)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with Servers() as servers:
        database = servers.create_database("events", uuid.uuid4().hex[:6])
        try:
            upgrade(database.psycopg2_url)
            engine = sa.create_engine(database.psycopg2_url)
            with sa.orm.Session(engine) as session, session.begin():
                create_api_key(session, "bench")
            engine.dispose()
            lifecycle(database, args.batch * 10, args.batch, True)  # warm caches
            runs = [
                lifecycle(database, args.jobs, args.batch, triggers)
                for _ in range(args.repeat)
                for triggers in (True, False)
            ]
        finally:
            servers.drop_database(database)
    for run in runs:
        print(json.dumps(run))
    on = sorted(r["postgres_cpu_ms_per_job"] for r in runs if r["triggers"])
    off = sorted(r["postgres_cpu_ms_per_job"] for r in runs if not r["triggers"])
    median_on, median_off = on[len(on) // 2], off[len(off) // 2]
    print(
        f"PostgreSQL CPU per job (medians of {args.repeat}): {median_on:.3f} ms with the "
        f"event triggers, {median_off:.3f} ms without: events cost "
        f"{median_on - median_off:.3f} ms a job ({args.batch} jobs per statement)"
    )


if __name__ == "__main__":
    main()
