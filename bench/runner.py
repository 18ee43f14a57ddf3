"""One benchmark run: every contender in turn on the same machine, then the report.

Contenders run one at a time, never side by side, so each has both cores; a
contender that cannot start is reported with its reason and the run goes on.
"""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from app.platform.settings import ROOT, Settings
from bench import machine, progress, report
from bench.contenders.base import Context, HttpContender
from bench.contenders.bento import VENV, Unavailable
from bench.infra import VAR_DIR, Servers
from bench.report import CONTENDERS
from bench.workloads import ASKED_ONLY, Bodies, Plan, run_all, run_sync

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Options:
    quick: bool
    out: Path
    repeat: int | None
    heavy_model: str
    heavy_rows: int
    only: tuple[str, ...]
    plot: bool
    argv: tuple[str, ...]
    jobs: int | None = None
    clients: tuple[int, ...] = ()
    burst_s: float | None = None
    open_s: float | None = None
    heavy_jobs: int | None = None
    batch_rows: int | None = None
    workloads: tuple[str, ...] = ()
    soak_minutes: float = 20.0
    soak_kill_minutes: float = 2.0
    soak_rate: float | None = None


def make_plan(o: Options, heavy_model: str | None) -> Plan:
    quick = o.quick
    # A run of the soak alone: one start of the service, not one per repeat.
    once = quick or (bool(o.workloads) and all(w in ASKED_ONLY for w in o.workloads))
    return Plan(
        jobs=o.jobs or (1000 if quick else 3000),
        clients=o.clients or ((16,) if quick else (16, 32)),
        heavy_model=heavy_model,
        heavy_rows=o.heavy_rows,
        heavy_jobs=o.heavy_jobs or (300 if quick else 1000),
        heavy_clients=16,
        burst_s=o.burst_s or (5.0 if quick else 10.0),
        burst_clients=32,
        open_s=o.open_s or (5.0 if quick else 10.0),
        open_clients=32,
        drain_timeout_s=120.0 if quick else 300.0,
        repeat=o.repeat or (1 if once else 3),
        raw_ort_s=0.3 if quick else 1.0,
        batch_rows=o.batch_rows if o.batch_rows is not None else (200_000 if quick else 1_000_000),
        bulk_jobs=4 * (o.jobs or (1000 if quick else 3000)),
        embed_jobs=60 if quick else 200,
        workloads=o.workloads,
        soak_s=60 * o.soak_minutes,
        soak_kill_s=60 * o.soak_kill_minutes,
        soak_rate=o.soak_rate,
    )


def skipped(plan: Plan) -> dict[str, str]:
    """Why the plan leaves a workload out, by letter."""
    out = {w: "not selected (--workload)" for w in report.WORKLOADS if not plan.runs(w)}
    if not plan.runs("n"):
        out["n"] = "runs only when asked (--workload n)"
    if plan.heavy_model is None:
        out.setdefault("b", "skipped: heavy model not built")
    if not plan.batch_rows:
        out.setdefault("g", "skipped: --batch-rows 0")
    if not plan.runs("a"):
        out.setdefault("d", "skipped: its rate comes from (a)")
    return out


def _ensure_models(repository: Path, heavy: str) -> str | None:
    """Build missing models with the project's own command; the heavy model's name
    if it is there afterwards."""
    from bench.peers.raw_ort import model_file

    if model_file(repository, "digits") is None or model_file(repository, heavy) is None:
        logger.info("building missing models: python manage.py models build")
        subprocess.run([sys.executable, "manage.py", "models", "build"], cwd=ROOT, check=True)
    if model_file(repository, "digits") is None:
        raise SystemExit(f"no digits model in {repository} after `manage.py models build`")
    return heavy if model_file(repository, heavy) is not None else None


def _bodies(plan: Plan) -> Bodies:
    from sklearn.datasets import load_digits

    from bench.bulk import BULK_SIZE
    from bench.grpc_load import infer_messages
    from bench.load import bulk_bodies, infer_bodies, job_bodies, text_bodies
    from bench.peers.raw_ort import EMBED_MODEL, EMBED_ROWS, SENTENCES
    from bench.stream import entry_fields

    rows = load_digits().data.tolist()
    heavy = job_bodies(plan.heavy_model, rows, plan.heavy_rows) if plan.heavy_model else []
    stream = entry_fields(rows, 2 * plan.jobs)
    digits = job_bodies("digits", rows, 1)
    return Bodies(
        digits, heavy, infer_bodies(rows), stream, infer_messages(rows),
        bulk_bodies(digits, BULK_SIZE), text_bodies(EMBED_MODEL, SENTENCES, EMBED_ROWS),
    )  # fmt: skip


def _raw_ort(ctx: Context, plan: Plan, rows: list[dict[str, Any]]) -> None:
    import numpy as np
    from sklearn.datasets import load_digits

    from bench.peers import raw_ort

    data = np.asarray(load_digits().data, dtype=np.float32)
    for repeat in range(plan.repeat):
        for model in filter(None, ("digits", plan.heavy_model)):
            path = raw_ort.model_file(ctx.model_repository, model)
            assert path is not None
            measured = raw_ort.measure(path, data, plan.raw_ort_s)
            for r in measured:
                variant = f"{model} t{r['threads']} b{r['batch']}"
                rows.append({"contender": report.RAW, "workload": "raw", "variant": variant,
                             "repeat": repeat, "model": model, **r})  # fmt: skip
            best = max(r["rows_per_s"] for r in measured)
            logger.info("raw ORT %s: best %s rows/s", model, best)
        if plan.embed_jobs and raw_ort.model_file(ctx.model_repository, raw_ort.EMBED_MODEL):
            model = raw_ort.EMBED_MODEL
            for r in raw_ort.measure_pipeline(ctx.model_repository, model, plan.raw_ort_s):
                variant = f"{model} t{r['threads']} b{r['batch']}"
                rows.append({"contender": report.RAW, "workload": "raw", "variant": variant,
                             "repeat": repeat, "model": model, **r})  # fmt: skip


def _celery_noop(ctx: Context, plan: Plan, rows: list[dict[str, Any]]) -> None:
    from bench.contenders.celery_noop import CeleryNoop

    with CeleryNoop(ctx) as noop:
        for repeat in range(plan.repeat):
            row = {
                "contender": report.NOOP,
                "workload": "noop",
                "variant": f"{plan.jobs} tasks",
                "repeat": repeat,
                **noop.run(plan.jobs),
            }
            logger.info("celery no-op: %s tasks/s", row["tasks_per_s"])
            rows.append(row)


def _http(
    factory: type[HttpContender], ctx: Context, plan: Plan, bodies: Bodies, rows: list[Any]
) -> None:
    # A fresh start per repeat (its own database; for BentoML its own task store,
    # which slows as it fills), so repeats measure the same thing.
    for repeat in range(plan.repeat):
        with factory(ctx) as contender:
            run_all(contender, bodies, plan, repeat, rows)


def _flask_ort(ctx: Context, plan: Plan, bodies: Bodies, rows: list[Any]) -> str | None:
    """The bare sync endpoint runs (f) only; the reason when the plan has no (f)."""
    from bench.contenders.flask_ort import FlaskOrt

    if not plan.runs("f"):
        return "not run: (f) not selected (--workload)"
    for repeat in range(plan.repeat):
        with FlaskOrt(ctx) as contender:
            run_sync(contender, bodies, plan, repeat, rows)
    return None


def _contenders(
    ctx: Context, plan: Plan, bodies: Bodies, only: tuple[str, ...], rows: list[dict[str, Any]]
) -> list[dict[str, str]]:
    """Each contender in turn; rows are kept as they come, so one that fails
    halfway still reports what it did. Returns each one's status."""
    from bench.contenders.bento import Bento
    from bench.contenders.flask_ort import FlaskOrt
    from bench.contenders.service import Service
    from bench.contenders.textbook import Textbook

    http: dict[str, type[HttpContender]] = {
        report.TEXTBOOK: Textbook, report.BENTO: Bento, report.SERVICE: Service,
    }  # fmt: skip
    descriptions = {
        report.RAW: "raw ONNX Runtime in one process, threads 1 and 2, batch 1 to 512",
        report.NOOP: "bare Celery round trip: prefork 2, acks_late, prefetch 1, no-op task",
        report.FLASK: FlaskOrt.description,
        **{name: factory.description for name, factory in http.items()},
    }
    statuses = []
    selected = [name for name in CONTENDERS if not only or name in only]
    with progress.contenders(len(selected)) as bar:
        for name in selected:
            bar.set_postfix_str(name)
            began = time.monotonic()
            try:
                not_run = None
                if name == report.RAW:
                    _raw_ort(ctx, plan, rows)
                elif name == report.NOOP:
                    _celery_noop(ctx, plan, rows)
                elif name == report.FLASK:
                    not_run = _flask_ort(ctx, plan, bodies, rows)
                else:
                    _http(http[name], ctx, plan, bodies, rows)
                status = not_run or f"ran in {time.monotonic() - began:.0f} s"
            except Exception as exc:  # one contender's failure must not end the run
                kind = "unavailable" if isinstance(exc, Unavailable) else "failed"
                status = f"{kind}: {type(exc).__name__}: {exc}"
                logger.exception("%s %s", name, kind)
            statuses.append({"name": name, "description": descriptions[name], "status": status})
            bar.update()
    return statuses


def run(o: Options) -> dict[str, Any]:
    started = time.time()
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(started))
    repository = Settings.from_env().model_repository
    heavy = _ensure_models(repository, o.heavy_model)
    plan = make_plan(o, heavy)
    notes: list[str] = []
    if heavy is None:
        notes.append(f"(b) skipped: no model '{o.heavy_model}' in {repository} after "
                     "`manage.py models build`")  # fmt: skip
    bodies = _bodies(plan)
    log_dir = VAR_DIR / "logs" / stamp
    log_dir.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    with Servers() as servers:
        redis_info = servers.redis_info()
        extra = {"postgresql": servers.postgres_version(), "redis-server": redis_info["version"]}
        if bento := _bento_version():
            extra["bentoml (bench/.venv-peers)"] = bento
        machine_info = machine.describe(extra)
        ctx = Context(
            servers=servers,
            run_id=stamp.replace("-", "_"),
            log_dir=log_dir,
            model_repository=repository,
            postgres_pid=servers.postgres_pid(),
            redis_pid=int(redis_info["pid"]) if redis_info["pid"].isdigit() else None,
        )
        statuses = _contenders(ctx, plan, bodies, o.only, rows)
    results = report.aggregate(r for r in rows if r["workload"] != "raw")
    raw = report.aggregate(r for r in rows if r["workload"] == "raw")
    data = {
        "run": {
            "started": time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(started)),
            "stamp": stamp,
            "argv": list(o.argv),
            "mode": "quick" if o.quick else "full",
            "repeat": plan.repeat,
            "seconds": round(time.time() - started, 1),
            "plan": asdict(plan),
            "logs": str(log_dir),
        },
        "machine": machine_info,
        "contenders": statuses,
        "results": results,
        "raw_ort": raw,
        "targets": report.targets(results, raw, plan.heavy_model, statuses, skipped(plan)),
        "notes": notes + _standing_notes(),
        "runs": rows,
    }
    _write(data, o, stamp)
    return data


def _standing_notes() -> list[str]:
    return [
        "jobs/s: accepted jobs / (last job's own finished_at - first submit); "
        "Celery no-op: tasks / (queue and unacked hash first seen empty - first publish), "
        "polled every 20 ms.",
        "CPU ms per job: /proc CPU time of each role's processes (and their reaped "
        "children) over the workload, divided by its jobs; 'total' leaves out the client. "
        "PostgreSQL and Redis are shared servers: their role includes the bench's own "
        "0.5 s progress query.",
        "BentoML's result store keeps created_at to the second, so its max queued time "
        "is not measured.",
    ]


def _bento_version() -> str | None:
    found = list((VENV / "lib").glob("python*/site-packages/bentoml-*.dist-info"))
    return found[0].name.removesuffix(".dist-info").split("-", 1)[1] if found else None


def _write(data: dict[str, Any], o: Options, stamp: str) -> None:
    o.out.mkdir(parents=True, exist_ok=True)
    base = o.out / stamp
    base.with_suffix(".json").write_text(json.dumps(data, indent=2) + "\n")
    base.with_suffix(".md").write_text(report.markdown(data))
    shutil.copyfile(base.with_suffix(".md"), o.out / "latest.md")
    if o.plot:
        from bench.plot import render

        render(data, base.with_suffix(".png"))
        shutil.copyfile(base.with_suffix(".png"), o.out / "latest.png")
    logger.info("wrote %s.{json,md%s}", base, ",png" if o.plot else "")
