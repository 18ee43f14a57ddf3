"""`python manage.py bench`: the command, kept apart so manage.py only wires it."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from bench.report import CONTENDERS, WORKLOADS, goal

# What `make bench` installs on top of the service's own requirements.
INSTALL = "make bench (or: .venv/bin/pip install -r bench/requirements.txt)"


@click.command("bench")
@click.option("--quick", is_flag=True, help="Smaller workloads, one repeat (under 3 minutes)")
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("bench/results"),
    show_default=True,
    help="Where <timestamp>.{json,md,png} and latest.{md,png} go",
)
@click.option("--repeat", type=click.IntRange(1), help="Repeats, medians reported [3; quick 1]")
@click.option("--heavy-model", default="heavy", show_default=True, help="Model for (b)")
@click.option("--heavy-rows", default=16, show_default=True, help="Rows per job in (b)")
@click.option(
    "--only",
    multiple=True,
    type=click.Choice(CONTENDERS),
    help="Run only these contenders (repeatable)",
)
@click.option(
    "--workload",
    "workloads",
    multiple=True,
    type=click.Choice([w for w in WORKLOADS if w != "noop"]),
    help="Run only these workloads of the HTTP contenders (repeatable), e.g. f, k; "
    "the soak (n) runs only when named",
)
@click.option("--no-plot", is_flag=True, help="Skip the PNG (no matplotlib needed)")
@click.option(
    "--generation",
    is_flag=True,
    help="Run the generation benchmark instead: streaming chat calls against a raw ONNX "
    "Runtime loop and llama.cpp's llama-server (bench/generation.py)",
)
@click.option("--no-llama", is_flag=True, help="--generation without llama-server")
@click.option(
    "--batch-rows", type=click.IntRange(0), help="Rows in (g) [1000000; quick 200000; 0 skips]"
)
@click.option(
    "--soak-minutes",
    type=click.FloatRange(0, min_open=True),
    default=20.0,
    show_default=True,
    help="Length of the soak (n)",
)
@click.option(
    "--soak-kill-minutes",
    type=click.FloatRange(0, min_open=True),
    default=2.0,
    show_default=True,
    help="(n): a worker child is killed, and latency reported, once every this long",
)
@click.option(
    "--soak-rate",
    type=click.FloatRange(0, min_open=True),
    help="(n): jobs/s over all doors [half of (a)'s jobs/s]",
)
@click.option("--jobs", type=click.IntRange(1), hidden=True, help="Jobs in (a)")
@click.option("--clients", type=click.IntRange(1), multiple=True, hidden=True)
@click.option("--burst-seconds", type=float, hidden=True)
@click.option("--open-seconds", type=float, hidden=True)
@click.option("--heavy-jobs", type=click.IntRange(1), hidden=True)
def bench(
    quick: bool,
    out: Path,
    repeat: int | None,
    heavy_model: str,
    heavy_rows: int,
    only: tuple[str, ...],
    no_plot: bool,
    jobs: int | None,
    clients: tuple[int, ...],
    burst_seconds: float | None,
    open_seconds: float | None,
    heavy_jobs: int | None,
    batch_rows: int | None,
    workloads: tuple[str, ...],
    soak_minutes: float,
    soak_kill_minutes: float,
    soak_rate: float | None,
    generation: bool,
    no_llama: bool,
) -> None:
    """Benchmark this service against raw ONNX Runtime, a bare Celery round trip,
    the textbook Flask + Celery design, BentoML tasks and a bare Flask + ONNX
    Runtime sync endpoint, each in turn on this machine; writes a JSON, a markdown
    table and a plot, and prints each target met or not (see bench/README.md)."""
    if generation:
        from bench.generation import run as run_generation

        found = run_generation(out, quick, with_llama=not no_llama)
        for target in found["targets"]:
            met = {True: "met", False: "NOT met", None: "n/a"}[target["met"]]
            click.echo(f"{met:8} {target['target']}: {target['value']} (goal {target['goal']})")
        click.echo(f"report: {out / 'generation-latest.md'}")
        return
    if not no_plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise click.ClickException(
                f"the benchmark's plot needs matplotlib, which is not installed: run {INSTALL}; "
                "or add --no-plot"
            ) from None
    from bench.runner import Options, run

    data = run(
        Options(
            quick=quick,
            out=out,
            repeat=repeat,
            heavy_model=heavy_model,
            heavy_rows=heavy_rows,
            only=only,
            plot=not no_plot,
            argv=tuple(sys.argv[2:]),
            jobs=jobs,
            clients=clients,
            burst_s=burst_seconds,
            open_s=open_seconds,
            heavy_jobs=heavy_jobs,
            batch_rows=batch_rows,
            workloads=workloads,
            soak_minutes=soak_minutes,
            soak_kill_minutes=soak_kill_minutes,
            soak_rate=soak_rate,
        )
    )
    for target in data["targets"]:
        met = {True: "met", False: "NOT met", None: "n/a"}[target["met"]]
        figure = target["value"] if target["met"] is not None else target.get("why")
        click.echo(f"{met:8} {target['target']}: {figure} (goal {goal(target)})")
    click.echo(f"report: {out / (data['run']['stamp'] + '.md')}")
