"""The targets of the report: each met, not met, or n/a with the reason."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bench import report
from bench.runner import Options, make_plan, skipped

RAN = "ran in 1 s"


def _row(contender: str, workload: str, **figures: Any) -> dict[str, Any]:
    return {"contender": contender, "workload": workload, "variant": "v", **figures}


def _by_name(targets: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {t["target"].split(",")[0]: t for t in targets}


def test_ratios_within_the_run_decide_each_target() -> None:
    results = [
        _row("service", "a", jobs_per_s=900.0, cpu_ms_per_job={"total": 2.0}),
        _row("textbook", "a", jobs_per_s=200.0),
        _row("bentoml", "a", jobs_per_s=300.0, cpu_ms_per_job={"total": 3.0}),
        _row("celery-noop", "noop", tasks_per_s=800.0),
        _row(
            "service",
            "f",
            jobs_per_s=1000.0,
            post_ms={"p50": 12.0, "p99": 30.0},
            one_client_ms={"p50": 2.4, "p99": 7.5},
        ),
        _row(
            "flask-ort",
            "f",
            jobs_per_s=2500.0,
            post_ms={"p50": 5.0, "p99": 9.0},
            one_client_ms={"p50": 0.5, "p99": 1.0},
        ),
        _row("service", "h", jobs_per_s=1100.0),
        _row(
            "service",
            "g",
            rows=1_000_000,
            share_of_raw_ort=0.61,
            peak_rss_mb={"api": 150.0, "worker": 480.0},
        ),
    ]
    statuses = [{"name": n, "status": RAN} for n in report.CONTENDERS]
    t = _by_name(report.targets(results, [], None, statuses, {}))
    textbook = t["service jobs/s vs textbook"]
    assert (textbook["value"], textbook["met"]) == (4.5, True)
    assert t["service jobs/s vs Celery no-op tasks/s"]["met"] is True
    assert t["service CPU per job vs BentoML's task"]["value"] == 0.67
    assert t["service CPU per job vs BentoML's task"]["met"] is True
    assert t["sync calls/s vs bare Flask + ORT"]["value"] == 0.4
    assert t["sync calls/s vs bare Flask + ORT"]["met"] is False
    alone = t["sync call p50 over the bare endpoint's"]  # 2.4 - 0.5 ms, within 2 ms
    assert (alone["value"], alone["met"]) == (1.9, True)
    late = t["sync call p99 over the bare endpoint's"]  # 7.5 - 1.0 ms: more than 5 ms
    assert (late["value"], late["met"]) == (6.5, False)
    assert t["gRPC unary calls/s vs the HTTP sync door's"]["value"] == 1.1
    assert t["batch rows/s vs raw ORT on the same rows"]["met"] is True
    assert "1,000,000 rows" in next(x["target"] for x in t.values() if "(g), " in x["target"])
    assert t["batch: largest RSS of any service process"]["value"] == 480.0


GRPC_STREAM = "gRPC stream calls/s vs the HTTP sync door's"
STREAM_DOOR = "stream door jobs/s vs the async HTTP door"


def _door_targets(h: float, i: float | None, j: float) -> dict[str, dict[str, Any]]:
    """The targets of a run whose sync (f) made 1,000 calls/s and async (a) 800
    jobs/s, with the gRPC unary (h), gRPC stream (i) and stream door (j) rows."""
    results = [
        _row("service", "a", jobs_per_s=800.0),
        _row("service", "f", jobs_per_s=1000.0),
        _row("service", "h", jobs_per_s=h),
        _row("service", "j", jobs_per_s=j),
    ]
    if i is not None:
        results.append(_row("service", "i", jobs_per_s=i))
    statuses = [{"name": n, "status": RAN} for n in report.CONTENDERS]
    return _by_name(report.targets(results, [], None, statuses, {}))


def test_the_grpc_stream_and_stream_door_targets_are_decided_by_their_own_rows() -> None:
    """(i)/(f) >= 2 and (j)/(a) >= 1.5, each decided by its own row: a unary gRPC
    row (h) on the other side of the bound changes neither."""
    met = _door_targets(h=1500.0, i=2000.0, j=1200.0)  # exactly at both goals
    assert (met[GRPC_STREAM]["value"], met[GRPC_STREAM]["met"]) == (2.0, True)
    assert (met[STREAM_DOOR]["value"], met[STREAM_DOOR]["met"]) == (1.5, True)
    assert met[GRPC_STREAM]["goal"] == 2.0 and met[STREAM_DOOR]["goal"] == 1.5

    short = _door_targets(h=2500.0, i=1990.0, j=1192.0)
    assert (short[GRPC_STREAM]["value"], short[GRPC_STREAM]["met"]) == (1.99, False)
    assert (short[STREAM_DOOR]["value"], short[STREAM_DOOR]["met"]) == (1.49, False)

    no_stream = _door_targets(h=2500.0, i=None, j=1200.0)
    assert no_stream[GRPC_STREAM]["met"] is None
    assert no_stream[GRPC_STREAM]["why"] == "no (i) gRPC stream infer row for service"
    assert no_stream[STREAM_DOOR]["met"] is True


def test_a_figure_not_measured_says_why() -> None:
    results = [
        _row("service", "a", jobs_per_s=900.0),
        _row("service", "k", jobs_per_s=None, missing="route missing"),
    ]
    statuses = [
        {"name": "bentoml", "status": "unavailable: Unavailable: no venv"},
        {"name": "flask-ort", "status": "not run: (f) not selected (--workload)"},
        {"name": "service", "status": RAN},
    ]
    plan = make_plan(Options(quick=True, out=Path("unused"), repeat=None, heavy_model="heavy",
                             heavy_rows=16, only=(), plot=False, argv=(), batch_rows=0,
                             workloads=("a", "k")), None)  # fmt: skip
    t = _by_name(report.targets(results, [], None, statuses, skipped(plan)))
    assert t["service jobs/s vs textbook"]["met"] is None
    assert t["service jobs/s vs textbook"]["why"] == "textbook not run (--only)"
    assert t["service CPU per job vs BentoML's task"]["why"].startswith("bentoml unavailable")
    assert (
        t["sync calls/s vs bare Flask + ORT"]["why"] == "(f) sync infer not selected (--workload)"
    )
    assert t["batch rows/s vs raw ORT on the same rows"]["why"] == (
        "(g) batch not selected (--workload)"
    )
    assert t["compute-bound rows/s vs raw ORT's best"]["why"] == (
        "(b) compute-bound not selected (--workload)"
    )
    page = report.markdown(
        {
            "run": {"started": "now", "argv": [], "mode": "quick", "repeat": 1, "seconds": 1.0,
                    "plan": {"heavy_model": None}},
            "machine": {"cpu_model": "cpu", "logical_cores": 2, "physical_cores": 2,
                        "memory_gib": 1, "gpus": [], "os": "linux",
                        "load_average_at_start": [0, 0, 0], "git": "abc", "versions": {}},
            "results": results, "raw_ort": [], "contenders": [], "notes": [],
            "targets": report.targets(results, [], None, statuses, skipped(plan)),
        }
    )  # fmt: skip
    assert "n/a (route missing)" in page
    assert "n/a: textbook not run (--only)" in page


@pytest.mark.parametrize(
    ("provider", "shown"),
    [
        ("CUDAExecutionProvider", "heavy (t1, b512, CUDA) |"),
        ("CPUExecutionProvider", "heavy (t1, b512) |"),
    ],
)
def test_raw_ort_says_when_it_ran_on_cuda(provider: str, shown: str) -> None:
    """ORT_PROVIDER=cuda on a GPU: raw ORT's sessions ran on CUDA, and its row says so."""
    raw = [{"contender": "raw-ort", "model": "heavy", "threads": 1, "batch": 512,
            "rows_per_s": 9000.0, "cpu_ms_per_1000_rows": 0.1, "provider": provider}]  # fmt: skip
    page = report.markdown(
        {
            "run": {"started": "now", "argv": [], "mode": "quick", "repeat": 1, "seconds": 1.0,
                    "plan": {"heavy_model": "heavy"}},
            "machine": {"cpu_model": "cpu", "logical_cores": 2, "physical_cores": 2,
                        "memory_gib": 1, "gpus": [], "os": "linux",
                        "load_average_at_start": [0, 0, 0], "git": "abc", "versions": {}},
            "results": [], "raw_ort": raw, "contenders": [], "notes": [], "targets": [],
        }
    )  # fmt: skip
    assert shown in page


@pytest.mark.parametrize(("sentences_per_s", "met"), [(85.0, True), (84.9, False)])
def test_the_embedding_target_compares_with_raw_ort_on_minilm(
    sentences_per_s: float, met: bool
) -> None:
    """(m) against raw ORT's best minilm row, not the heavy model's or digits'."""
    results = [{"contender": "service", "workload": "m", "variant": "minilm x32",
                "jobs_per_s": sentences_per_s / 32, "rows_per_s": sentences_per_s}]  # fmt: skip
    raw = [{"contender": "raw-ort", "model": model, "threads": 1, "batch": 32,
            "rows_per_s": rate, "cpu_ms_per_1000_rows": 1.0}
           for model, rate in (("minilm", 100.0), ("heavy", 10.0), ("digits", 1e6))]  # fmt: skip
    [embedding] = [t for t in report.targets(results, raw, "heavy")
                   if t["target"].startswith("embedding")]  # fmt: skip
    assert embedding["value"] == round(sentences_per_s / 100, 3) and embedding["met"] is met
