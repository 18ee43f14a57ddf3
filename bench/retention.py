"""Tables that stay flat: jobs go through their life at a constant rate for a
while, with a short JOB_RETENTION_SECONDS and the hourly purge run every
`--purge-every` seconds instead, and the job tables' size (heap, TOAST and
indexes) is sampled as it goes. Once retention is reached the size should stop
growing: deleted rows leave space that autovacuum hands to new ones.

Each job is written as the service writes it, three commits apart: submitted
(queued, its inputs as JSON), claimed (running, a lease), finished (succeeded,
its packed outputs); the trigger on `jobs` adds an event row at each step. Only
the database works here (no API or worker), so the figures are the tables' own.

    .venv/bin/python -m bench.retention --minutes 30 --rate 100 --retention 120

PostgreSQL reuses a deleted row's space only once VACUUM has passed: on a server
with autovacuum off (`SHOW autovacuum`, in the report), pass `--vacuum`.

Prints a sample a line and writes `bench/results/retention.json`: per sample the
sizes and live rows, and at the end the bytes per job row and per event row (table
plus indexes over live rows) and the growth over the run's second half.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg2.extensions

from app.container import Container
from app.platform.migrate import upgrade
from app.platform.settings import ROOT, Settings
from bench.infra import Database, Servers

TABLES = ("jobs", "job_events")
INPUTS = json.dumps({"pixels": [[0.5] * 64]})
OUTPUT = bytes(range(256)) * 2  # a packed answer's size for digits, about


def write_jobs(database: Database, rate: float, stop: threading.Event, done: list[int]) -> None:
    """Jobs at `rate` a second, a tick of them every 100 ms, each tick three commits."""
    conn = database.connect()
    conn.autocommit = False
    with conn.cursor() as cur:
        cur.execute("INSERT INTO tenants (name, webhook_secret) VALUES (%s, 'x') RETURNING id",
                    (f"flat-{uuid.uuid4().hex[:8]}",))  # fmt: skip
        tenant = cur.fetchone()[0]
    conn.commit()
    tick, owed, started = 0.1, 0.0, time.monotonic()
    while not stop.is_set():
        owed += rate * tick
        n, owed = int(owed), owed - int(owed)
        if n:
            life(conn, tenant, n)
            done[0] += n
        started += tick
        stop.wait(max(0.0, started - time.monotonic()))
    conn.close()


def life(conn: psycopg2.extensions.connection, tenant: int, n: int) -> None:
    ids = [str(uuid.uuid4()) for _ in range(n)]
    with conn.cursor() as cur:
        cur.execute(
            "INSERT INTO jobs (id, tenant_id, model, model_version, status, inputs, attempts) "
            "SELECT CAST(i AS uuid), %s, 'digits', '1', 'queued', CAST(%s AS jsonb), 0 "
            "FROM unnest(CAST(%s AS text[])) AS i",
            (tenant, INPUTS, ids),
        )
        conn.commit()
        cur.execute(
            "UPDATE jobs SET status = 'running', attempts = 1, started_at = now(), "
            "lease_expires_at = now() + interval '30 seconds' WHERE id = ANY(CAST(%s AS uuid[]))",
            (ids,),
        )
        conn.commit()
        cur.execute(
            "UPDATE jobs SET status = 'succeeded', finished_at = now(), lease_expires_at = NULL, "
            "output_data = %s WHERE id = ANY(CAST(%s AS uuid[]))",
            (psycopg2.Binary(OUTPUT), ids),
        )
        conn.commit()


def sample(database: Database) -> dict[str, Any]:
    conn = database.connect()
    try:
        with conn.cursor() as cur:
            found: dict[str, Any] = {"t": time.time()}
            for table in TABLES:
                cur.execute(f"SELECT pg_total_relation_size('{table}'), count(*) FROM {table}")
                size, rows = cur.fetchone()
                found[table] = {"bytes": int(size), "rows": int(rows)}
            return found
    finally:
        conn.close()


def vacuum(database: Database) -> None:
    conn = database.connect()
    try:
        with conn.cursor() as cur:
            cur.execute("VACUUM " + ", ".join(TABLES))
    finally:
        conn.close()


def widths(database: Database) -> dict[str, int]:
    """Each table's live rows' own size (pg_column_size, TOAST pointers as stored)."""
    conn = database.connect()
    try:
        with conn.cursor() as cur:
            found = {}
            for table in TABLES:
                cur.execute(f"SELECT coalesce(avg(pg_column_size(t.*)), 0) FROM {table} t")
                found[table] = round(float(cur.fetchone()[0]))
            return found
    finally:
        conn.close()


def setting(database: Database, name: str) -> str:
    conn = database.connect()
    try:
        with conn.cursor() as cur:
            cur.execute(f"SHOW {name}")
            return str(cur.fetchone()[0])
    finally:
        conn.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--rate", type=float, default=100.0, help="jobs a second")
    parser.add_argument("--retention", type=float, default=120.0, help="JOB_RETENTION_SECONDS")
    parser.add_argument("--purge-every", type=float, default=30.0, help="seconds")
    parser.add_argument("--sample-every", type=float, default=30.0, help="seconds")
    parser.add_argument(
        "--vacuum",
        action="store_true",
        help="VACUUM the tables after each purge (a server with autovacuum off)",
    )
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args()
    with Servers() as servers:
        database = servers.create_database("retention", uuid.uuid4().hex[:8])
        try:
            run(servers, database, args)
        finally:
            servers.drop_database(database)


def run(servers: Servers, database: Database, args: argparse.Namespace) -> None:
    upgrade(database.psycopg2_url)
    settings = Settings(
        database_url=database.psycopg2_url, redis_url=servers.service_redis().client_url,
        var_dir=ROOT / "var" / "bench", retention_seconds=args.retention / 2,
        job_retention_seconds=args.retention, job_event_retention_seconds=args.retention,
    )  # fmt: skip
    container = Container(settings)
    stop, done = threading.Event(), [0]
    writer = threading.Thread(target=write_jobs, args=(database, args.rate, stop, done))
    writer.start()
    samples: list[dict[str, Any]] = []
    started = next_purge = next_sample = time.monotonic()
    end = started + args.minutes * 60
    try:
        while (now := time.monotonic()) < end:
            if now >= next_purge:
                with container.scope():
                    container.worker.maintenance.purge()
                if args.vacuum:
                    vacuum(database)
                next_purge += args.purge_every
            if now >= next_sample:
                samples.append({**sample(database), "jobs_written": done[0]})
                s = samples[-1]
                jobs, events = s["jobs"], s["job_events"]
                print(f"{now - started:7.0f} s  jobs {jobs['rows']:7d} rows "
                      f"{jobs['bytes'] / 2**20:7.1f} MiB   events {events['rows']:7d} rows "
                      f"{events['bytes'] / 2**20:7.1f} MiB", flush=True)  # fmt: skip
                next_sample += args.sample_every
            time.sleep(max(0.0, min(next_purge, next_sample, end) - time.monotonic()))
    finally:
        stop.set()
        writer.join()
        container.close()
    report = {**summary(samples, args), "row_width_bytes": widths(database),
              "autovacuum": setting(database, "autovacuum")}  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "retention.json").write_text(json.dumps({**report, "samples": samples}, indent=1))
    print(json.dumps(report, indent=1))


def summary(samples: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    """Bytes per row at the end, and each table's growth over the second half."""
    half, last = samples[len(samples) // 2], samples[-1]
    per_row = {t: round(last[t]["bytes"] / max(1, last[t]["rows"])) for t in TABLES}
    growth = {t: round(last[t]["bytes"] / max(1, half[t]["bytes"]) - 1, 3) for t in TABLES}
    return {
        "minutes": args.minutes, "rate": args.rate, "retention_s": args.retention,
        "purge_every_s": args.purge_every, "vacuum_after_purge": args.vacuum,
        "jobs_written": last["jobs_written"],
        "bytes_per_row": per_row, "growth_second_half": growth,
        "peak_bytes": {t: max(s[t]["bytes"] for s in samples) for t in TABLES},
    }  # fmt: skip


if __name__ == "__main__":
    main()
