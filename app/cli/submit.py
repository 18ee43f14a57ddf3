"""`manage.py submit`: a job (or a job a row) over HTTP with the Python client, as
a user's script would send it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from app.observability import progress


@click.command()
@click.option("--model", required=True, help="The model's name (GET /models)")
@click.option("--version", default=None, help="Default: the newest serving version")
@click.option(
    "--input",
    "input_path",
    required=True,
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help=".npy (a structured array for several inputs) or .json ({input: rows}, or rows)",
)
@click.option("--priority", type=click.IntRange(0, 9), default=None, help="0-9, higher first")
@click.option(
    "--each-row",
    is_flag=True,
    help="A job for each row (POST /jobs/bulk, 1,000 a request); prints one JSON line "
    "each, the job or the problem that refused that row",
)
@click.option("--wait", is_flag=True, help="Wait for the job; exit 1 unless it succeeded")
@click.option("--timeout", type=float, default=None, help="With --wait: give up after seconds")
@click.option("--api-key", envvar="INFERENCE_API_KEY", help="Default: $INFERENCE_API_KEY")
@click.option("--url", envvar="INFERENCE_URL", default="http://127.0.0.1:8000", show_default=True)
def submit(
    model: str,
    version: str | None,
    input_path: Path,
    priority: int | None,
    each_row: bool,
    wait: bool,
    timeout: float | None,
    api_key: str | None,
    url: str,
) -> None:
    """Submit a job over HTTP with the Python client and print it as JSON; a
    single array goes to the model's only input, named from its metadata. With
    --each-row, a job a row, submitted in bulk."""
    import numpy as np
    import requests

    try:
        from inference_client import ApiError, Client, WaitTimeout
    except ModuleNotFoundError as exc:
        if exc.name != "inference_client":
            raise
        raise click.ClickException(  # installed with pip: the client is its own package
            "submit sends with the Python client: pip install ./inference_client "
            "(from a checkout of the service)"
        ) from None

    if not api_key:
        raise click.UsageError("give --api-key or set INFERENCE_API_KEY")
    if input_path.suffix not in (".npy", ".json"):
        raise click.UsageError("--input must be a .npy or .json file")
    try:
        if input_path.suffix == ".npy":
            array = np.load(input_path, allow_pickle=False)
            names = array.dtype.names
            inputs = {name: array[name] for name in names} if names else array
        else:
            inputs = json.loads(input_path.read_text())
    except ValueError as exc:
        raise click.UsageError(f"cannot read {input_path}: {exc}") from None
    client = Client(url, api_key)
    if each_row:
        try:
            rows = _rows_of(inputs)
        except ValueError as exc:
            raise click.UsageError(f"cannot cut {input_path} into rows: {exc}") from None
        try:
            _submit_rows(client, model, rows, version, priority, wait, timeout)
        finally:
            client.close()
        return
    try:
        job = client.jobs.submit(model, inputs, version=version, priority=priority)
        if wait:
            job = client.jobs.wait(job.id, timeout=timeout)
    except ApiError as exc:
        raise click.ClickException(f"{exc.status} {exc.title}: {exc.detail}") from None
    except WaitTimeout as exc:
        raise click.ClickException(str(exc)) from None
    except (requests.RequestException, ValueError) as exc:
        raise click.ClickException(str(exc)) from None
    finally:
        client.close()
    click.echo(json.dumps(job.raw, indent=2))
    if wait and not job.succeeded:
        raise SystemExit(1)


def _rows_of(inputs: Any) -> list[Any]:
    """One job's inputs a row: an array or list cut along its first axis; a mapping
    of input names cut together (every input the same number of rows)."""
    if isinstance(inputs, dict):
        counts = {name: len(values) for name, values in inputs.items()}
        if len(set(counts.values())) != 1:
            raise ValueError(f"the inputs have different numbers of rows: {counts}")
        count = next(iter(counts.values()))
        return [{name: values[i : i + 1] for name, values in inputs.items()} for i in range(count)]
    return [inputs[i : i + 1] for i in range(len(inputs))]


def _submit_rows(
    client: Any,
    model: str,
    rows: list[Any],
    version: str | None,
    priority: int | None,
    wait: bool,
    timeout: float | None,
) -> None:
    """Print each row's job (waited for with --wait) or its problem, a JSON line each;
    exit 1 unless every row was accepted (and, with --wait, succeeded). Rows go in
    bulks of 1,000, a bar counting them (and then the jobs waited for) on stderr."""
    import requests

    from inference_client import ApiError, Job, WaitTimeout

    try:
        with progress.bar(len(rows), "submit", "row", at_least=2) as bar:
            outcomes = client.jobs.submit_many(model, rows, version=version, priority=priority,
                                               on_bulk=bar.update)  # fmt: skip
    except ApiError as exc:
        raise click.ClickException(f"{exc.status} {exc.title}: {exc.detail}") from None
    except (requests.RequestException, ValueError) as exc:
        raise click.ClickException(str(exc)) from None
    ok = True
    with progress.bar(len(outcomes) if wait else 0, "wait", "job", at_least=2) as bar:
        for outcome in outcomes:
            if isinstance(outcome, ApiError):
                ok = False
                progress.echo(json.dumps(outcome.problem))
            else:
                job = outcome
                if wait:
                    try:
                        job = client.jobs.wait(job.id, timeout=timeout)
                    except WaitTimeout as exc:
                        job = exc.last if isinstance(exc.last, Job) else job
                    ok = ok and job.succeeded
                progress.echo(json.dumps(job.raw))
            bar.update()
    if not ok:
        raise SystemExit(1)
