"""Medians over repeats, ratios between contenders, targets, and the markdown page.

Absolute figures move with the machine and its neighbours; ratios between
contenders measured in the same run, one after the other on the same cores, are
what to compare across runs.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from typing import Any

TEXTBOOK, NOOP, BENTO, SERVICE, RAW = "textbook", "celery-noop", "bentoml", "service", "raw-ort"
CONTENDERS = (RAW, NOOP, TEXTBOOK, BENTO, SERVICE)  # the order they run in
WORKLOADS = {
    "noop": "Celery no-op round trip",
    "a": "(a) async digits",
    "b": "(b) compute-bound",
    "c": "(c) burst",
    "d": "(d) open loop",
    "e": "(e) after idle",
    "f": "(f) sync infer",
    "g": "(g) batch",
    "h": "(h) gRPC unary infer",
    "i": "(i) gRPC stream infer",
    "j": "(j) stream door",
}
# (j): the stream door against the async HTTP door (a) of the same run.
STREAM_GOAL = 1.5
BATCH_RSS_GOAL_MB = 500
# (e): a lone job may wait the card's batching delay (digits: 2 ms), one batch,
# and the wake-up's trip through Redis and Celery; 20 ms leaves room for those.
IDLE_START_GOAL_S = 0.02


def _median_of(values: list[Any]) -> Any:
    present = [v for v in values if v is not None]
    if not present:
        return None
    first = present[0]
    if isinstance(first, bool):
        return all(present)
    if isinstance(first, int | float):
        return round(statistics.median(present), 3)
    if isinstance(first, dict):
        keys = {k for v in present for k in v}
        return {k: _median_of([v.get(k) for v in present]) for k in sorted(keys)}
    return first


def aggregate(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (contender, workload, variant): the median of every figure."""
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault((row["contender"], row["workload"], row["variant"]), []).append(row)
    merged = []
    for group in groups.values():
        keys = [k for k in group[0] if k != "repeat"]
        row = {k: _median_of([g.get(k) for g in group]) for k in keys}
        row["repeats"] = len(group)
        merged.append(row)
    return merged


def find(results: list[dict[str, Any]], contender: str, workload: str) -> dict[str, Any] | None:
    """The first (fewest clients) row of a contender's workload."""
    return next(
        (r for r in results if r["contender"] == contender and r["workload"] == workload), None
    )


def _match(results: list[dict[str, Any]], contender: str, row: dict[str, Any]) -> Any:
    for r in results:
        if (r["contender"], r["workload"]) == (contender, row["workload"]) and (
            r["variant"] == row["variant"] or row["workload"] == "d"
        ):
            return r
    return None


def raw_best(raw: list[dict[str, Any]], model: str) -> dict[str, Any] | None:
    rows = [r for r in raw if r["model"] == model]
    return max(rows, key=lambda r: r["rows_per_s"]) if rows else None


def targets(
    results: list[dict[str, Any]], raw: list[dict[str, Any]], heavy: str | None
) -> list[dict[str, Any]]:
    """The goals of the fast core, each with its figure and whether it is met."""
    service_a = find(results, SERVICE, "a")
    out: list[dict[str, Any]] = []

    def add(name: str, value: float | None, goal: float, higher: bool = True) -> None:
        met = None if value is None else (value >= goal if higher else value <= goal)
        out.append({"target": name, "value": value, "goal": goal, "met": met})

    def ratio(row: dict[str, Any] | None, other: dict[str, Any] | None, key: str) -> float | None:
        if not row or not other or not row.get("jobs_per_s") or not other.get(key):
            return None
        return round(row["jobs_per_s"] / other[key], 2)

    add("service jobs/s >= 3x textbook (a)", ratio(service_a, find(results, TEXTBOOK, "a"),
                                                  "jobs_per_s"), 3.0)  # fmt: skip
    add("service jobs/s >= 1.0x Celery no-op tasks/s", ratio(service_a, find(results, NOOP,
                                                  "noop"), "tasks_per_s"), 1.0)  # fmt: skip
    add("service jobs/s ahead of BentoML (a)", ratio(service_a, find(results, BENTO, "a"),
                                                    "jobs_per_s"), 1.0)  # fmt: skip
    service_b, best = find(results, SERVICE, "b"), raw_best(raw, heavy) if heavy else None
    share = None
    if service_b and best and service_b.get("rows_per_s"):
        share = round(service_b["rows_per_s"] / best["rows_per_s"], 3)
    add("compute-bound rows/s >= 85% of raw ORT (b)", share, 0.85)
    service_d = find(results, SERVICE, "d")
    add("POST p99 <= 50 ms at half load (d)",
        service_d["post_ms"]["p99"] if service_d else None, 50.0, higher=False)  # fmt: skip
    service_c = find(results, SERVICE, "c")
    add("burst: 0 accepted jobs lost (c)", service_c["lost"] if service_c else None, 0,
        higher=False)  # fmt: skip
    service_e = find(results, SERVICE, "e")
    add("first job after idle starts within T + one batch, s (e)",
        service_e["max_queued_s"] if service_e else None, IDLE_START_GOAL_S,
        higher=False)  # fmt: skip
    add("gRPC stream calls/s >= 2x the HTTP sync door's (i vs f)",
        ratio(find(results, SERVICE, "i"), find(results, SERVICE, "f"), "jobs_per_s"),
        2.0)  # fmt: skip
    add(f"stream door jobs/s >= {STREAM_GOAL}x the async HTTP door (j / a)",
        ratio(find(results, SERVICE, "j"), service_a, "jobs_per_s"), STREAM_GOAL)  # fmt: skip
    service_g = find(results, SERVICE, "g")
    add("batch rows/s >= 50% of raw ORT on the same rows (g)",
        service_g["share_of_raw_ort"] if service_g else None, 0.5)  # fmt: skip
    peak = max((service_g or {}).get("peak_rss_mb", {}).values(), default=None)
    add("batch: every API and worker process under 500 MB RSS, MB (g)", peak,
        BATCH_RSS_GOAL_MB, higher=False)  # fmt: skip
    return out


def _fmt(value: Any, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return str(value)


def _roles(cpu: dict[str, float] | None) -> str:
    if not cpu:
        return "-"
    parts = [f"{k} {v:.2f}" for k, v in sorted(cpu.items(), key=lambda kv: -kv[1])
             if k not in ("total", "client") and v >= 0.005]  # fmt: skip
    total = f"**{cpu.get('total', 0):.2f}**"
    client = f" (client {cpu['client']:.2f})" if "client" in cpu else ""
    return f"{total} = " + ", ".join(parts) + client


def markdown(data: dict[str, Any]) -> str:
    results, raw = data["results"], data["raw_ort"]
    heavy = data["run"]["plan"]["heavy_model"]
    noop = find(results, NOOP, "noop")
    lines = [f"# Benchmark {data['run']['started']}", ""]
    lines += [f"`python manage.py bench {' '.join(data['run']['argv'])}` — {data['run']['mode']}, "
              f"{data['run']['repeat']} repeat(s), medians; wall time "
              f"{data['run']['seconds']:.0f} s.", ""]  # fmt: skip
    m = data["machine"]
    lines += [
        "## Machine",
        "",
        f"{m['cpu_model']}, {m['logical_cores']} logical cores ({m['physical_cores']} physical), "
        f"{m['memory_gib']} GiB; GPU: {', '.join(m['gpus']) or 'none'}; {m['os']}; "
        f"load average at start {m['load_average_at_start']}; commit {m['git']}.",
        "",
        "Versions: " + ", ".join(f"{k} {v}" for k, v in m["versions"].items()) + ".",
        "",
        "## Results",
        "",
        "| contender | workload | jobs/s (rows/s) | x textbook | x Celery no-op | "
        "POST p50 / p99 ms | max queued s | CPU ms per job by role |",
        "|---|---|---:|---:|---:|---:|---:|---|",
    ]
    for model in sorted({r["model"] for r in raw}):
        best = raw_best(raw, model)
        assert best is not None
        lines.append(
            f"| {RAW} | best of 1-2 threads x batch 1-512, {model} (t{best['threads']}, "
            f"b{best['batch']}) | ({_fmt(best['rows_per_s'], 0)} rows/s) | - | - | - | - | "
            f"{best['cpu_ms_per_1000_rows']:.2f} per 1000 rows |"
        )
    for row in results:
        if row["workload"] == "g":
            continue  # its own table
        per_s = row.get("jobs_per_s", row.get("tasks_per_s"))
        shown = _fmt(per_s)
        if row.get("rows_per_s"):
            best = raw_best(raw, heavy) if heavy else None
            share = f", {row['rows_per_s'] / best['rows_per_s']:.0%} of raw ORT" if best else ""
            shown += f" ({_fmt(row['rows_per_s'], 0)} rows/s{share})"
        tb = _match(results, TEXTBOOK, row)
        x_tb = per_s / tb["jobs_per_s"] if tb and tb.get("jobs_per_s") and per_s else None
        single_row = row["workload"] in ("a", "c", "j", "noop")
        x_noop = per_s / noop["tasks_per_s"] if noop and per_s and single_row else None
        post = row.get("post_ms") or {}
        latency = f"{_fmt(post.get('p50'))} / {_fmt(post.get('p99'))}" if post else "-"
        name = WORKLOADS.get(row["workload"], row["workload"])
        lines.append(
            f"| {row['contender']} | {name}, {row['variant']} | {shown} | {_fmt(x_tb, 2)} | "
            f"{_fmt(x_noop, 2)} | {latency} | {_fmt(row.get('max_queued_s'), 2)} | "
            f"{_roles(row.get('cpu_ms_per_job'))} |"
        )
    lines += _burst_table(results) + _open_table(results) + _idle_table(results)
    lines += _batch_table(results)
    lines += _raw_table(raw)
    lines += ["", "## Targets", "", "| target | figure | goal | met |", "|---|---:|---:|---|"]
    for t in data["targets"]:
        met = {True: "yes", False: "**no**", None: "n/a"}[t["met"]]
        lines.append(f"| {t['target']} | {_fmt(t['value'], 2)} | {t['goal']} | {met} |")
    lines += ["", "## Contenders", ""]
    for c in data["contenders"]:
        lines.append(f"- **{c['name']}**: {c['description']} — {c['status']}")
    if data["notes"]:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in data["notes"]]
    return "\n".join(lines) + "\n"


def _burst_table(results: list[dict[str, Any]]) -> list[str]:
    rows = [r for r in results if r["workload"] == "c"]
    if not rows:
        return []
    lines = ["", "### (c) burst", "",
             "| contender | submitted/s | accepted | refused (with Retry-After) | errors | lost | "
             "drain s | POST p99 ms |", "|---|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for r in rows:
        lines.append(
            f"| {r['contender']} | {_fmt(r['submit_per_s'])} | {r['accepted']} | "
            f"{r['refused']} ({r['refused_with_retry_after']}) | {r['errors']} | "
            f"{r['lost']}{'' if r['drained'] else ' (not drained)'} | {_fmt(r['drain_s'], 2)} | "
            f"{_fmt(r['post_ms']['p99'])} |"
        )
    return lines


def _open_table(results: list[dict[str, Any]]) -> list[str]:
    rows = [r for r in results if r["workload"] == "d"]
    if not rows:
        return []
    lines = ["", "### (d) open loop at half of (a)'s rate", "",
             "| contender | rate /s | sent | errors | POST p50 / p99 / max ms |",
             "|---|---:|---:|---:|---:|"]  # fmt: skip
    for r in rows:
        p = r["post_ms"]
        lines.append(
            f"| {r['contender']} | {_fmt(r['rate_per_s'])} | {r['sent']} | {r['errors']} | "
            f"{_fmt(p['p50'])} / {_fmt(p['p99'])} / {_fmt(p['max'])} |"
        )
    return lines


def _idle_table(results: list[dict[str, Any]]) -> list[str]:
    rows = [r for r in results if r["workload"] == "e"]
    if not rows:
        return []
    lines = ["", "### (e) single jobs after idle", "",
             "| contender | jobs | queued max ms | created to finished p50 / max ms |",
             "|---|---:|---:|---:|"]  # fmt: skip
    for r in rows:
        queued = r["max_queued_s"] * 1000 if r.get("max_queued_s") is not None else None
        done = r["finished_ms"]
        lines.append(
            f"| {r['contender']} | {r['jobs']} | {_fmt(queued, 2)} | "
            f"{_fmt(done['p50'], 2)} / {_fmt(done['max'], 2)} |"
        )
    return lines


def _batch_table(results: list[dict[str, Any]]) -> list[str]:
    rows = [r for r in results if r["workload"] == "g"]
    if not rows:
        return []
    lines = ["", "### (g) batch: POST /batches to the last byte of the .npy results", "",
             "| contender | rows | status | seconds (run / all) | rows/s | raw ORT rows/s "
             "(1 / 2 threads) | share | peak RSS MB by role | upload s |",
             "|---|---:|---|---:|---:|---:|---:|---|---:|"]  # fmt: skip
    for r in rows:
        raw = r["raw_ort_rows_per_s"]
        rss = ", ".join(f"{k} {_fmt(v, 0)}" for k, v in r["peak_rss_mb"].items())
        lines.append(
            f"| {r['contender']} | {r['rows']} | {r['status']} | {_fmt(r['run_s'], 2)} / "
            f"{_fmt(r['seconds'], 2)} | {_fmt(r['rows_per_s'], 0)} | {_fmt(raw.get('1'), 0)} / "
            f"{_fmt(raw.get('2'), 0)} | {_fmt(r['share_of_raw_ort'] * 100, 0)}% | {rss} | "
            f"{_fmt(r['upload_s'], 2)} |"
        )
    return lines


def _raw_table(raw: list[dict[str, Any]]) -> list[str]:
    if not raw:
        return []
    lines = ["", "### Raw ONNX Runtime, one process (rows/s)", ""]
    models = sorted({r["model"] for r in raw})
    batches = sorted({r["batch"] for r in raw})
    lines += ["| model | threads | " + " | ".join(f"batch {b}" for b in batches) + " |",
              "|---|---:|" + "---:|" * len(batches)]  # fmt: skip
    for model in models:
        best = raw_best(raw, model)
        for threads in sorted({r["threads"] for r in raw if r["model"] == model}):
            cells = []
            for b in batches:
                r = next((x for x in raw if (x["model"], x["threads"], x["batch"]) ==
                          (model, threads, b)), None)  # fmt: skip
                cell = _fmt(r["rows_per_s"], 0) if r else "-"
                cells.append(f"**{cell}**" if r is best else cell)
            lines.append(f"| {model} | {threads} | " + " | ".join(cells) + " |")
    return lines
