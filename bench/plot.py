"""The run as one picture: throughput, POST latency and CPU per job by role."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.report import NOOP, find

ORDER = ("celery-noop", "textbook", "bentoml", "service")


def render(data: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = data["results"]
    contenders = [c for c in ORDER if any(r["contender"] == c for r in results)]
    http = [c for c in contenders if c != NOOP]
    fig, (ax_rate, ax_lat, ax_cpu) = plt.subplots(1, 3, figsize=(16, 5))

    # Throughput: (a) per client count, and the Celery no-op's tasks/s.
    variants = sorted({r["variant"] for r in results if r["workload"] == "a"},
                      key=lambda v: int(v.split()[0]))  # fmt: skip
    width = 0.8 / max(1, len(variants))
    for i, variant in enumerate(variants):
        values = []
        for c in contenders:
            row = next((r for r in results if (r["contender"], r["workload"], r["variant"])
                        == (c, "a", variant)), None)  # fmt: skip
            noop = find(results, NOOP, "noop") if c == NOOP else None
            values.append((row or {}).get("jobs_per_s") or (noop or {}).get("tasks_per_s") or 0)
        xs = [j + i * width for j in range(len(contenders))]
        bars = ax_rate.bar(xs, values, width, label=f"(a) {variant}")
        ax_rate.bar_label(bars, fmt="%.0f", fontsize=8)
    ax_rate.set_xticks([j + width * (len(variants) - 1) / 2 for j in range(len(contenders))])
    ax_rate.set_xticklabels(contenders)
    ax_rate.set_ylabel("jobs/s (Celery no-op: tasks/s)")
    ax_rate.set_title("Throughput, single-row digits jobs")
    if variants:
        ax_rate.legend(fontsize=8)

    # POST latency: p50 and p99 in (a) and (d).
    series = [("a", "p50"), ("a", "p99"), ("d", "p50"), ("d", "p99")]
    width = 0.8 / len(series)
    highest = 0.0
    for i, (workload, q) in enumerate(series):
        values = [((find(results, c, workload) or {}).get("post_ms") or {}).get(q) or 0
                  for c in http]  # fmt: skip
        xs = [j + i * width for j in range(len(http))]
        ax_lat.bar(xs, values, width, label=f"({workload}) {q}")
        highest = max([highest, *values])
    ax_lat.set_xticks([j + width * (len(series) - 1) / 2 for j in range(len(http))])
    ax_lat.set_xticklabels(http)
    ax_lat.set_ylabel("POST latency, ms")
    if highest > 0:  # a run without (a) and (d) has no latency to plot
        ax_lat.set_yscale("log")
    ax_lat.set_title("Submit latency: (a) closed loop, (d) open loop at half rate")
    ax_lat.legend(fontsize=8)

    # CPU per job by role in (a), stacked.
    served = {k for c in contenders for k in _cpu_row(results, c) or {}} - {"total", "client"}
    roles = [*sorted(served), "client"]  # the load generator last, hatched: not the service's
    bottoms = [0.0] * len(contenders)
    for role in roles:
        values = [(_cpu_row(results, c) or {}).get(role, 0.0) for c in contenders]
        hatch, label = ("//", "client (load generator)") if role == "client" else (None, role)
        ax_cpu.bar(contenders, values, bottom=bottoms, label=label, hatch=hatch,
                   color="white" if role == "client" else None, edgecolor="grey")  # fmt: skip
        bottoms = [b + v for b, v in zip(bottoms, values, strict=True)]
    ax_cpu.set_ylabel("CPU ms per job")
    ax_cpu.set_title("Where a job's CPU goes, (a) fewest clients")
    if bottoms:
        ax_cpu.set_ylim(top=max(bottoms) * 1.5 or 1)  # room for the legend above the bars
    ax_cpu.legend(fontsize=8, ncol=3, loc="upper center")

    fig.suptitle(f"{data['run']['started']} — {data['machine']['cpu_model']}, "
                 f"{data['machine']['logical_cores']} cores", fontsize=10)  # fmt: skip
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _cpu_row(results: list[dict[str, Any]], contender: str) -> dict[str, float] | None:
    workload = "noop" if contender == NOOP else "a"
    row = find(results, contender, workload)
    return row.get("cpu_ms_per_job") if row else None
