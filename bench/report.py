"""Medians over repeats, ratios between contenders, targets, and the markdown page.

Absolute figures move with the machine and its neighbours; ratios between
contenders measured in the same run, one after the other on the same cores, are
what to compare across runs.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable
from typing import Any

from bench.windows import P99_FACTOR, P99_FLOOR_MS, RSS_GROWTH_MB

TEXTBOOK, NOOP, BENTO, SERVICE, RAW = "textbook", "celery-noop", "bentoml", "service", "raw-ort"
FLASK = "flask-ort"
CONTENDERS = (RAW, NOOP, TEXTBOOK, BENTO, FLASK, SERVICE)  # the order they run in
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
    "k": "(k) bulk submit",
    "l": "(l) sync infer, inline model",
    "m": "(m) embeddings",
    "n": "(n) soak",
    "o": "(o) a model added while it serves",
    "p": "(p) pipelines",
}
# The goals of "a lean data plane", each a ratio (or a bound) within one run.
TEXTBOOK_GOAL = 4.0  # (a) jobs/s vs the textbook design's
NOOP_GOAL = 1.0  # (a) jobs/s vs a bare Celery round trip's tasks/s
SYNC_GOAL = 0.6  # (f) calls/s vs the bare Flask + ORT endpoint's, 16 clients
ADDED_ANSWER_MS = 1000.0  # (o): a model added is answered within the same second
INLINE_GOAL = 0.8  # (l) the same, on an inline model
PIPELINE_GOAL = 0.8  # (p) digit-photo's jobs/s vs the same steps as one model.py
INGEST_GOAL = 0.8  # (p) ingest's chunks/s vs raw ORT embedding the chunks in one batch
# One client: a call's p50 (p99) at most the bare endpoint's plus this many ms.
SYNC_P50_EXTRA_MS, SYNC_P99_EXTRA_MS, INLINE_P50_EXTRA_MS = 2.0, 5.0, 1.0
GRPC_GOAL = 1.0  # (h) unary gRPC calls/s vs (f)'s
BATCH_GOAL = 0.6  # (g) rows/s vs raw ORT's, best of 1 and 2 threads, calls of 4096
BATCH_RSS_GOAL_MB = 500
HEAVY_GOAL = 0.9  # (b) rows/s vs raw ORT's best on the heavy model
# (m) sentences/s vs raw ORT's best running minilm's pipeline: the bar for
# the GPU (85% of raw ORT's CUDA rows/s at its best batch), the same on the CPU.
EMBED_GOAL = 0.85
EMBED_MODEL = "minilm"
# (j): the stream door against the async HTTP door (a) of the same run.
STREAM_GOAL = 1.5
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


def _share(row: dict[str, Any], best: dict[str, Any] | None) -> float | None:
    """A workload's rows/s over raw ORT's best on its model."""
    if not best or not row.get("rows_per_s"):
        return None
    return round(row["rows_per_s"] / best["rows_per_s"], 3)


def _on(raw: dict[str, Any]) -> str:
    """Where raw ORT ran, when not on the CPU (ORT_PROVIDER=cuda on a GPU)."""
    provider = raw.get("provider", "CPUExecutionProvider")
    short = provider.removesuffix("ExecutionProvider")
    return "" if short == "CPU" else f", {short}"


def raw_best(raw: list[dict[str, Any]], model: str) -> dict[str, Any] | None:
    rows = [r for r in raw if r["model"] == model]
    return max(rows, key=lambda r: r["rows_per_s"]) if rows else None


Needed = tuple[str, str]  # (contender, workload)
OPS: dict[str, Callable[[float, float], bool]] = {
    ">=": lambda value, bound: value >= bound,
    "<=": lambda value, bound: value <= bound,
    "<": lambda value, bound: value < bound,
}


class Absent:
    """Why a figure a target needs is not in this run's results."""

    def __init__(
        self,
        results: list[dict[str, Any]],
        statuses: list[dict[str, str]],
        skipped: dict[str, str],
    ) -> None:
        self.results = results
        self.statuses = {s["name"]: s["status"] for s in statuses}
        self.skipped = skipped  # workload -> why the plan left it out

    def why(self, *needed: Needed) -> str | None:
        """The reason for the first (contender, workload) without a figure, or None."""
        for contender, workload in needed:
            row = find(self.results, contender, workload)
            if row is not None and row.get("missing"):
                return f"{contender}: {row['missing']}"
            if row is not None:
                continue
            status = self.statuses.get(contender)
            if status is None:
                return f"{contender} not run (--only)"
            if not status.startswith("ran"):
                return f"{contender} {status}"
            if workload in self.skipped:
                return f"{WORKLOADS.get(workload, workload)} {self.skipped[workload]}"
            return f"no {WORKLOADS.get(workload, workload)} row for {contender}"
        return None


def targets(
    results: list[dict[str, Any]],
    raw: list[dict[str, Any]],
    heavy: str | None,
    statuses: list[dict[str, str]] | None = None,
    skipped: dict[str, str] | None = None,
) -> list[dict[str, Any]]:
    """The goals, each with its figure, whether it is met and, where it cannot be
    told, why (a contender not run or unavailable, a workload skipped, a route
    missing)."""
    absent = Absent(results + raw, statuses or [], skipped or {})
    out: list[dict[str, Any]] = []

    def add(name: str, value: float | None, op: str, bound: float, *needed: Needed) -> None:
        met = None if value is None else OPS[op](value, bound)
        target = {"target": name, "value": value, "goal": bound, "op": op, "met": met}
        if value is None:
            target["why"] = absent.why(*needed) or "no figure"
        out.append(target)

    def row(needed: Needed) -> dict[str, Any]:
        return find(results, *needed) or {}

    def ratio(mine: Needed, other: Needed, key: str = "jobs_per_s") -> float | None:
        a, b = row(mine).get("jobs_per_s"), row(other).get(key)
        return round(a / b, 2) if a and b else None

    a, f, g = (SERVICE, "a"), (SERVICE, "f"), (SERVICE, "g")
    add("service jobs/s vs textbook, (a) 16 clients",
        ratio(a, (TEXTBOOK, "a")), ">=", TEXTBOOK_GOAL, a, (TEXTBOOK, "a"))  # fmt: skip
    add("service jobs/s vs Celery no-op tasks/s, (a)",
        ratio(a, (NOOP, "noop"), "tasks_per_s"), ">=", NOOP_GOAL, a, (NOOP, "noop"))  # fmt: skip
    add("service CPU per job vs BentoML's task, (a)",
        _cpu_ratio(row(a), row((BENTO, "a"))), "<", 1.0, a, (BENTO, "a"))  # fmt: skip
    add("service jobs/s vs BentoML, (a)", ratio(a, (BENTO, "a")), ">=", 1.0, a, (BENTO, "a"))

    def alone_over_bare(mine: Needed, q: str) -> float | None:
        """A lone caller's latency (p50 or p99) minus the bare endpoint's, ms."""
        a = row(mine).get("one_client_ms", {}).get(q)
        b = row((FLASK, "f")).get("one_client_ms", {}).get(q)
        return round(a - b, 2) if a is not None and b is not None else None

    bare = (FLASK, "f")
    add("sync calls/s vs bare Flask + ORT, (f) 16 clients",
        ratio(f, bare), ">=", SYNC_GOAL, f, bare)  # fmt: skip
    add("sync call p50 over the bare endpoint's, 1 client, ms (f)",
        alone_over_bare(f, "p50"), "<=", SYNC_P50_EXTRA_MS, f, bare)  # fmt: skip
    add("sync call p99 over the bare endpoint's, 1 client, ms (f)",
        alone_over_bare(f, "p99"), "<=", SYNC_P99_EXTRA_MS, f, bare)  # fmt: skip
    inline = (SERVICE, "l")
    add("sync calls/s on an inline model vs bare Flask + ORT, (l) 16 clients",
        ratio(inline, bare), ">=", INLINE_GOAL, inline, bare)  # fmt: skip
    add("inline sync call p50 over the bare endpoint's, 1 client, ms (l)",
        alone_over_bare(inline, "p50"), "<=", INLINE_P50_EXTRA_MS, inline, bare)  # fmt: skip
    h = (SERVICE, "h")
    add("gRPC unary calls/s vs the HTTP sync door's, (h / f) 16 clients",
        ratio(h, f), ">=", GRPC_GOAL, h, f)  # fmt: skip
    rows = f", {row(g)['rows']:,} rows" if row(g).get("rows") else ""
    add(f"batch rows/s vs raw ORT on the same rows, (g){rows}",
        row(g).get("share_of_raw_ort"), ">=", BATCH_GOAL, g)  # fmt: skip
    add("batch: largest RSS of any service process, MB (g)",
        max(row(g).get("peak_rss_mb", {}).values(), default=None), "<", BATCH_RSS_GOAL_MB,
        g)  # fmt: skip
    add("compute-bound rows/s vs raw ORT's best, (b)",
        _share(row((SERVICE, "b")), raw_best(raw, heavy) if heavy else None), ">=", HEAVY_GOAL,
        (SERVICE, "b"), (RAW, "raw"))  # fmt: skip
    add("embedding sentences/s vs raw ORT's best on the same pipeline, (m)",
        _share(row((SERVICE, "m")), raw_best(raw, EMBED_MODEL)), ">=", EMBED_GOAL,
        (SERVICE, "m"), (RAW, "raw"))  # fmt: skip
    add("POST p99 ms at half load, (d)",
        row((SERVICE, "d")).get("post_ms", {}).get("p99"), "<=", 50.0, (SERVICE, "d"))  # fmt: skip
    add("burst: accepted jobs lost, (c)", row((SERVICE, "c")).get("lost"), "<=", 0, (SERVICE, "c"))
    add("first job after idle starts within T + one batch, s (e)",
        row((SERVICE, "e")).get("max_queued_s"), "<=", IDLE_START_GOAL_S,
        (SERVICE, "e"))  # fmt: skip
    add("gRPC stream calls/s vs the HTTP sync door's, (i / f)",
        ratio((SERVICE, "i"), f), ">=", 2.0, (SERVICE, "i"), f)  # fmt: skip
    add("stream door jobs/s vs the async HTTP door, (j / a)",
        ratio((SERVICE, "j"), a), ">=", STREAM_GOAL, (SERVICE, "j"), a)  # fmt: skip
    o = (SERVICE, "o")
    for door in ("http", "grpc"):
        add(f"first sync answer of a model added while it serves, ms after `models add` "
            f"returned, p50 of 10, {door.upper() if door == 'http' else 'gRPC'} (o)",
            row(o).get(f"{door}_first_answer_ms"), "<=", ADDED_ANSWER_MS, o)  # fmt: skip
    p = (SERVICE, "p")
    pipes = {r["variant"]: r for r in results if (r["contender"], r["workload"]) == p}
    pipe, one = (next((r.get("jobs_per_s") for v, r in pipes.items() if v.startswith(name)), None)
                 for name in ("digit-photo pipeline", "digit-photo-code"))  # fmt: skip
    add("digit-photo pipeline jobs/s vs the same steps as one model.py, 16 clients (p)",
        round(pipe / one, 2) if pipe and one else None, ">=", PIPELINE_GOAL, p)  # fmt: skip
    for variant, r in sorted(pipes.items()):
        if variant.startswith("ingest") and r.get("rows_per_s") and r.get("raw_rows_per_s"):
            add(f"{variant}: chunks/s vs raw ORT in one batch at {r['raw_threads']} thread(s) (p)",
                round(r["rows_per_s"] / r["raw_rows_per_s"], 2), ">=", INGEST_GOAL, p)  # fmt: skip
    n = (SERVICE, "n")
    add("soak: accepted jobs lost, (n)", row(n).get("lost"), "<=", 0, n)
    add("soak: largest RSS growth of a service process after warm-up, MB (n)",
        row(n).get("rss_growth_mb"), "<", RSS_GROWTH_MB, n)  # fmt: skip
    add(f"soak: last window's p99 over the first's (at least {P99_FLOOR_MS:g} ms), worst "
        "door (n)", row(n).get("p99_drift_worst"), "<=", P99_FACTOR, n)  # fmt: skip
    return out


def goal(target: dict[str, Any]) -> str:
    """`>= 4.0`, `< 500`: the goal with its comparison."""
    return f"{target.get('op', '>=')} {target['goal']:g}"


def _cpu_ratio(row: dict[str, Any] | None, other: dict[str, Any] | None) -> float | None:
    """`row`'s CPU per job (every role but the client) over `other`'s."""
    mine = (row or {}).get("cpu_ms_per_job", {}).get("total")
    theirs = (other or {}).get("cpu_ms_per_job", {}).get("total")
    return round(mine / theirs, 2) if mine and theirs else None


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
            f"| {RAW} | best of 1-2 threads x batch sizes, {model} (t{best['threads']}, "
            f"b{best['batch']}{_on(best)}) | ({_fmt(best['rows_per_s'], 0)} rows/s) | "
            "- | - | - | - | "
            f"{best['cpu_ms_per_1000_rows']:.2f} per 1000 rows |"
        )
    for row in results:
        if row["workload"] in ("g", "o"):
            continue  # (g): its own table; (o): its figures are targets
        per_s = row.get("jobs_per_s", row.get("tasks_per_s"))
        shown = _fmt(per_s) if not row.get("missing") else f"n/a ({row['missing']})"
        if row.get("rows_per_s"):
            model = EMBED_MODEL if row["workload"] == "m" else heavy
            best = raw_best(raw, model) if model else None
            share = f", {row['rows_per_s'] / best['rows_per_s']:.0%} of raw ORT" if best else ""
            shown += f" ({_fmt(row['rows_per_s'], 0)} rows/s{share})"
        tb = _match(results, TEXTBOOK, row)
        x_tb = per_s / tb["jobs_per_s"] if tb and tb.get("jobs_per_s") and per_s else None
        single_row = row["workload"] in ("a", "c", "j", "k", "noop")
        x_noop = per_s / noop["tasks_per_s"] if noop and per_s and single_row else None
        post = row.get("post_ms") or {}
        latency = f"{_fmt(post.get('p50'))} / {_fmt(post.get('p99'))}" if post else "-"
        if alone := row.get("one_client_ms"):
            latency += f" (1 client: {_fmt(alone.get('p50'))} / {_fmt(alone.get('p99'))})"
        name = WORKLOADS.get(row["workload"], row["workload"])
        lines.append(
            f"| {row['contender']} | {name}, {row['variant']} | {shown} | {_fmt(x_tb, 2)} | "
            f"{_fmt(x_noop, 2)} | {latency} | {_fmt(row.get('max_queued_s'), 2)} | "
            f"{_roles(row.get('cpu_ms_per_job'))} |"
        )
    lines += _burst_table(results) + _open_table(results) + _idle_table(results)
    lines += _batch_table(results)
    lines += _soak_tables(results)
    lines += _raw_table(raw)
    lines += ["", "## Targets", "", "| target | figure | goal | met |", "|---|---:|---:|---|"]
    for t in data["targets"]:
        met = {True: "yes", False: "**no**", None: f"n/a: {t.get('why')}"}[t["met"]]
        lines.append(f"| {t['target']} | {_fmt(t['value'], 2)} | {goal(t)} | {met} |")
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


def _soak_tables(results: list[dict[str, Any]]) -> list[str]:
    """(n): what became of the jobs, each door's latency per window, RSS per process."""
    lines: list[str] = []
    for r in (r for r in results if r["workload"] == "n"):
        kills = ", ".join(f"{k['at_s']:g} s" + ("" if k.get("pid") else " (no child)")
                          for k in r["kills"]) or "none"  # fmt: skip
        capacity = (f"half of {_fmt(r['capacity_jobs_per_s'])} jobs/s, {r['capacity_from']}"
                    if r.get("capacity_jobs_per_s") else r["capacity_from"])  # fmt: skip
        busy = 100 * r["cpu_busy"] if r.get("cpu_busy") is not None else None
        cost = (f"; CPU per job {_fmt(r['cpu_ms_per_job'].get('total'), 2)} ms (every role but "
                f"the client; (a): {_fmt(r.get('capacity_cpu_ms_per_job'), 2)} ms), the cores "
                f"{_fmt(busy, 0)}% busy (every process, the bench's too)")  # fmt: skip
        statuses = ", ".join(f"{k} {v}" for k, v in sorted(r["statuses"].items()))
        lines += ["", f"### (n) soak, {r['contender']}: {r['variant']}", "",
                  f"{_fmt(r['rate_per_s'])} jobs/s ({capacity}) for {r['seconds']:g} s; "
                  f"worker children killed at {kills}{cost}.", "",
                  f"Jobs created during the soak, by status: {statuses}. Lost: **{r['lost']}** "
                  f"(jobs not final {r['not_final']}, accepted async jobs not final "
                  f"{r['async_not_final']}, stream entries without a result "
                  f"{r['stream_unanswered']}); failed {r['failed']}; "
                  f"{'drained' if r['drained'] else '**not drained**'} "
                  f"{_fmt(r['drain_s'])} s after the load.", "",
                  "| door | rate /s | sent | answered | errors (refused) | p50 / p99 / max ms |",
                  "|---|---:|---:|---:|---:|---:|"]  # fmt: skip
        for name, d in r["doors"].items():
            p = d["post_ms"]
            lines.append(
                f"| {name} | {_fmt(d['rate_per_s'])} | {d['sent']} | {d['accepted']} | "
                f"{d['errors']} ({d['refused']}) | {_fmt(p['p50'], 2)} / {_fmt(p['p99'], 2)} / "
                f"{_fmt(p['max'], 2)} |"
            )
        lines += _soak_windows(r)
        lines += _soak_rss(r)
    return lines


def _soak_rss(r: dict[str, Any]) -> list[str]:
    """Each process's RSS after warm-up, at each window's end, and its growth."""
    ends = r.get("rss_by_window_mb") or []
    at = [min(r["seconds"], (i + 1) * r["window_s"]) for i in range(len(ends))]
    heads = ["process", "start", *(f"{_fmt(t, 0)} s" for t in at), "growth"]
    lines = ["", "RSS MB of every process of the service after warm-up, at the end of each "
             f"window, and its growth (flat: under {RSS_GROWTH_MB:g} MB):", "",
             "| " + " | ".join(heads) + " |", "|---|" + "---:|" * (len(heads) - 1)]  # fmt: skip
    for p in r["rss_mb"]:
        cells = [p["process"], _fmt(p["start_mb"]), *(_fmt(end.get(p["process"])) for end in ends),
                 _fmt(p["growth_mb"])]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _soak_windows(r: dict[str, Any]) -> list[str]:
    """p50 / p99 ms of each door in each window, answered (and not) below them."""
    names = list(r["windows"])
    lines = ["", f"Latency per window of {r['window_s']:g} s by send time (async, created to "
             "finished: by the job's created_at, from its row), p50 / p99 ms, answered "
             "(not answered):", "",
             "| from s | " + " | ".join(names) + " |", "|---:|" + "---:|" * len(names)]  # fmt: skip
    for i, first in enumerate(r["windows"][names[0]]):
        cells = []
        for name in names:
            w = r["windows"][name][i]
            missed = f" ({w['unanswered']})" if w["unanswered"] else ""
            cells.append(f"{_fmt(w['p50'], 2)} / {_fmt(w['p99'], 2)}, {w['answered']}{missed}")
        lines.append(f"| {_fmt(first['from_s'], 0)} | " + " | ".join(cells) + " |")
    drift = ", ".join(f"{k} {_fmt(v, 2)}" for k, v in r["p99_drift"].items())
    lines += ["", f"Last window's p99 over the first's (a first under {P99_FLOOR_MS:g} ms "
              f"counted as {P99_FLOOR_MS:g}): {drift}."]  # fmt: skip
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
