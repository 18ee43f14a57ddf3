"""(n) soak: its windows, its bounds and its verdicts, on made-up figures (no
processes, no clocks)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bench import report, windows
from bench.load import Schedule
from bench.runner import Options, make_plan, skipped

RAN = "ran in 1 s"


def test_latency_is_counted_in_the_window_its_request_was_sent_in() -> None:
    start = 1000.0
    # window 0: 1..98 ms and two of 500; window 1: 100 x 2 ms and one 900 ms; window 2: none
    sent = [start + 1 + i * 0.01 for i in range(100)] + [start + 61 + i * 0.01 for i in range(101)]
    lat = [float(i + 1) for i in range(98)] + [500.0, 500.0] + [2.0] * 100 + [900.0]
    rows = windows.windows(sent, lat, [start + 65, start + 66], start, 60.0, 3)
    assert [r["answered"] for r in rows] == [100, 101, 0]
    assert (rows[0]["p50"], rows[0]["p99"], rows[0]["max"]) == (50.0, 500.0, 500.0)
    assert (rows[1]["p50"], rows[1]["p99"], rows[1]["max"]) == (2.0, 2.0, 900.0)
    assert rows[2]["p99"] is None
    assert [r["unanswered"] for r in rows] == [0, 2, 0]
    assert [r["from_s"] for r in rows] == [0.0, 60.0, 120.0]


def test_a_time_just_outside_the_run_counts_in_the_nearest_window() -> None:
    """A job's row is created a moment after its request was sent at the very end."""
    rows = windows.windows([99.0, 180.5], [1.0, 3.0], [], 100.0, 60.0, 2)
    assert [r["answered"] for r in rows] == [1, 1]


def test_windows_cover_the_run_and_kills_fall_in_their_middles() -> None:
    assert windows.window_count(1200, 120) == 10
    assert windows.window_count(180, 60) == 3
    assert windows.window_count(190, 60) == 4  # the last one shorter
    assert windows.kill_times(1200, 120) == [60 + 120 * k for k in range(10)]
    assert windows.kill_times(180, 60) == [30.0, 90.0, 150.0]
    kills = windows.kill_times(190, 60)
    assert [int(t // 60) for t in kills] == [0, 1, 2]  # none in the short last window


def _w(*p99: float | None) -> list[dict[str, Any]]:
    return [{"p99": p} for p in p99]


def test_p99_drift_compares_the_last_window_with_the_first_above_a_floor() -> None:
    assert windows.p99_drift(_w(10.0, 50.0, 20.0)) == 2.0
    assert windows.p99_drift(_w(10.0, 10.0, 25.0)) == 2.5
    assert windows.p99_drift(_w(1.0, 9.0)) == 1.8  # a 1 ms first p99 counts as 5 ms
    assert windows.p99_drift(_w(10.0)) is None
    assert windows.p99_drift(_w(10.0, None)) is None
    assert windows.worst_drift({"sync": 1.2, "grpc": None, "async": 2.4}) == 2.4
    assert windows.worst_drift({"grpc": None}) is None


def test_rss_growth_is_taken_over_processes_found_at_both_ends() -> None:
    start = {"api 10": 100.0, "worker children (largest)": 300.0, "flower 12": 60.0}
    end = {"api 10": 104.0, "worker children (largest)": 290.0, "flower 12": 95.5,
           "api 30": 900.0}  # fmt: skip
    rows = {r["process"]: r for r in windows.rss_rows(start, end)}
    assert rows["api 10"]["growth_mb"] == 4.0
    assert rows["worker children (largest)"]["growth_mb"] == -10.0
    assert rows["api 30"]["growth_mb"] is None  # not there at the start
    assert windows.largest_growth(list(rows.values())) == 35.5
    assert windows.largest_growth(windows.rss_rows({"a 1": 5.0}, {})) is None


def test_lost_adds_every_way_a_job_can_be_lost() -> None:
    assert windows.lost(0, 0, 0) == 0
    assert windows.lost(1, 2, 3) == 6


def _soak_row(lost: int, growth: float | None, drift: float | None) -> dict[str, Any]:
    return {"contender": "service", "workload": "n", "variant": "v", "lost": lost,
            "rss_growth_mb": growth, "p99_drift_worst": drift}  # fmt: skip


def _soak_targets(row: dict[str, Any] | None, why: dict[str, str]) -> list[dict[str, Any]]:
    statuses = [{"name": n, "status": RAN} for n in report.CONTENDERS]
    found = report.targets([row] if row else [], [], None, statuses, why)
    return [t for t in found if t["target"].startswith("soak:")]


@pytest.mark.parametrize(
    ("lost", "growth", "drift", "met"),
    [
        (0, 19.9, 2.0, [True, True, True]),
        (1, 20.0, 2.01, [False, False, False]),
        (0, -3.0, 0.5, [True, True, True]),
    ],
)
def test_the_soak_verdicts_are_0_lost_rss_flat_and_p99_stable(
    lost: int, growth: float, drift: float, met: list[bool]
) -> None:
    targets = _soak_targets(_soak_row(lost, growth, drift), {})
    assert [t["met"] for t in targets] == met
    assert [t["goal"] for t in targets] == [0, windows.RSS_GROWTH_MB, windows.P99_FACTOR]


def test_a_run_without_the_soak_says_it_runs_only_when_asked(tmp_path: Path) -> None:
    plan = make_plan(Options(quick=True, out=tmp_path, repeat=None, heavy_model="heavy",
                             heavy_rows=16, only=(), plot=False, argv=()), "heavy")  # fmt: skip
    assert plan.runs("a") and not plan.runs("n")
    targets = _soak_targets(None, skipped(plan))
    assert {t["met"] for t in targets} == {None}
    assert all("--workload n" in t["why"] for t in targets)


def test_the_soak_runs_when_named_with_its_minutes_and_rate(tmp_path: Path) -> None:
    o = Options(quick=False, out=tmp_path, repeat=None, heavy_model="heavy", heavy_rows=16,
                only=(), plot=False, argv=(), workloads=("n",), soak_minutes=3,
                soak_kill_minutes=1, soak_rate=40.0)  # fmt: skip
    plan = make_plan(o, "heavy")
    assert plan.runs("n") and not plan.runs("a")
    assert (plan.soak_s, plan.soak_kill_s, plan.soak_rate) == (180, 60, 40.0)
    assert plan.repeat == 1  # the soak alone: the service is started once
    defaults = make_plan(Options(quick=False, out=tmp_path, repeat=None, heavy_model="heavy",
                                 heavy_rows=16, only=(), plot=False, argv=()), "heavy")  # fmt: skip
    assert (defaults.soak_s, defaults.soak_kill_s, defaults.soak_rate) == (1200, 120, None)
    assert defaults.repeat == 3


def test_an_open_loop_schedule_keeps_its_rate_and_hands_each_slot_out_once() -> None:
    schedule = Schedule.poisson(50.0, 200.0, seed=3, start=10.0)
    assert 9000 < len(schedule.offsets) < 11000  # 10,000 expected
    assert all(0 < t < 200 for t in schedule.offsets)
    assert list(schedule.offsets) == sorted(schedule.offsets)
    take = schedule.slots()
    slots = [take() for _ in range(len(schedule.offsets) + 2)]
    assert slots[0] == (0, 10.0 + schedule.offsets[0])
    assert slots[-2:] == [None, None]
    assert Schedule.poisson(50.0, 200.0, seed=3, start=0).offsets == schedule.offsets


def test_the_report_shows_each_door_per_window_and_each_process_rss() -> None:
    window = {"answered": 10, "p50": 1.5, "p99": 4.25, "max": 9.0, "unanswered": 2}
    three = [{**window, "from_s": 60.0 * i} for i in range(3)]
    door = {"rate_per_s": 20.0, "sent": 12, "accepted": 10, "errors": 2, "refused": 0,
            "post_ms": {"p50": 1.5, "p99": 4.25, "max": 9.0}}  # fmt: skip
    row = {
        **_soak_row(0, 3.5, 1.1), "variant": "3 min", "seconds": 180.0, "window_s": 60.0,
        "rate_per_s": 40.0, "capacity_jobs_per_s": 80.0, "capacity_from": "(a) run first",
        "kills": [{"at_s": 30.0, "pid": 7}, {"at_s": 90.0, "pid": None}],
        "statuses": {"succeeded": 7190, "failed": 1}, "failed": 1, "not_final": 0,
        "async_not_final": 0, "stream_unanswered": 0, "drained": True, "drain_s": 61.0,
        "doors": {"async": door, "sync": door},
        "windows": {"async": three, "sync": three},
        "p99_drift": {"async": 1.1, "sync": 1.0},
        "rss_mb": windows.rss_rows({"api 10": 100.0, "api 11": 90.0},
                                   {"api 10": 103.5, "api 11": 91.0}),
        "rss_by_window_mb": [{"api 10": 101.0}, {"api 10": 102.0, "api 11": 90.5},
                             {"api 10": 103.5, "api 11": 91.0}],
        "cpu_ms_per_job": {"total": 15.25}, "capacity_cpu_ms_per_job": 6.5, "cpu_busy": 0.9,
    }  # fmt: skip
    text = "\n".join(report._soak_tables([row]))
    assert "worker children killed at 30 s, 90 s (no child)" in text
    assert "half of 80.0 jobs/s, (a) run first" in text
    assert "succeeded 7190" in text and "Lost: **0**" in text and "failed 1" in text
    assert "| 0 | 1.50 / 4.25, 10 (2) | 1.50 / 4.25, 10 (2) |" in text
    assert text.count("| 60 |") == 1 and text.count("| 120 |") == 1
    assert "| process | start | 60 s | 120 s | 180 s | growth |" in text
    assert "| api 10 | 100.0 | 101.0 | 102.0 | 103.5 | 3.5 |" in text
    assert "| api 11 | 90.0 | - | 90.5 | 91.0 | 1.0 |" in text
    assert "CPU per job 15.25 ms" in text and "(a): 6.50 ms" in text and "90% busy" in text
    assert "async 1.10, sync 1.00" in text
