"""Bringing a model into the repository: check an ONNX file with ONNX Runtime,
draft its card from the graph (as Triton's auto-complete config does), and
place both under `<root>/<name>/<version>/` atomically.

The files are written in a staging folder inside the repository (same file
system), then renamed into place, so a scan never sees half a model. The
staging folder is three levels deep (`.incoming/<id>/<version>`), below what
the repository's `*/*/card.json` scan looks at.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import onnxruntime as ort

from app.cards import ModelCard, TensorSpec, version_key
from app.errors import Conflict, InvalidModel, InvalidRequest
from app.repository import code_intake, pipelines
from app.runtime.datatypes import ORT_TO_V2
from app.runtime.sessions import ModelMismatch, check_card

logger = logging.getLogger(__name__)

INCOMING = ".incoming"
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
MAX_NAME = 100  # the jobs table's model column
MAX_VERSION = 50  # and its model_version column
# The batch size a drafted card allows when every tensor has a free first dimension.
DEFAULT_MAX_BATCH_SIZE = 64


def check_ref(name: str, version: str) -> None:
    check_name(name)
    check_name(version, "version", MAX_VERSION)


def check_name(value: str, what: str = "name", limit: int = MAX_NAME) -> str:
    """A model name or version that is one safe path segment: [A-Za-z0-9_.-],
    not starting with a dot (so never `..`), at most `limit` characters."""
    if len(value) > limit or not _NAME.fullmatch(value):
        raise InvalidRequest(
            f"model {what} {value!r} must be 1 to {limit} characters of A-Z a-z 0-9 _ . - "
            "and not start with a dot",
            errors={what: ["invalid"]},
        )
    return value


@dataclass(frozen=True)
class Graph:
    """What ONNX Runtime reports of a graph, in the card's terms."""

    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    skipped_outputs: tuple[str, ...] = field(default=())  # of types a job cannot return


def inspect(path: Path, shown: str | None = None) -> Graph:
    """Load `path` with ONNX Runtime (CPU) and read its inputs and outputs.
    InvalidModel when it is not ONNX, ORT cannot load it, or an input has a type
    the service does not support. Outputs of such types (a scikit-learn ZipMap)
    are left out of the card; at least one output must remain."""
    shown = shown or path.name  # how errors name the file: as its sender knows it
    session = _load(path, shown)
    bad_inputs = [f"{i.name} ({i.type})" for i in session.get_inputs() if i.type not in ORT_TO_V2]
    if bad_inputs:
        raise InvalidModel(
            f"{shown} has inputs of types the service does not support: "
            f"{', '.join(bad_inputs)}; supported: {', '.join(sorted(ORT_TO_V2))}"
        )
    outputs = [o for o in session.get_outputs() if o.type in ORT_TO_V2]
    skipped = tuple(
        f"{o.name} ({o.type})" for o in session.get_outputs() if o.type not in ORT_TO_V2
    )
    if not outputs:
        raise InvalidModel(f"{path.name} has no output of a supported type: {', '.join(skipped)}")
    return Graph(
        tuple(_spec(i) for i in session.get_inputs()), tuple(_spec(o) for o in outputs), skipped
    )


# What a new version takes over from the model's newest card: the model's own
# settings (who may use it, which versions serve, its configuration's parameters)
# and what a person wrote.
INHERITED = ("description", "labels", "execution", "version_policy", "tenants", "parameters")


def draft_card(graph: Graph, base: dict[str, Any] | None = None) -> dict[str, Any]:
    """A card.json for the user to edit: every field the service reads, with
    the graph's tensors and a batching guess (batch when every tensor has a
    free first dimension, as Triton's auto-complete does). `base` (the newest
    version's card) gives the INHERITED fields, so a new version keeps its
    model's tenants and version policy."""
    tensors = [*graph.inputs, *graph.outputs]
    batches = all(spec.shape and spec.shape[0] == -1 for spec in tensors)
    card: dict[str, Any] = {
        "description": "",
        "platform": "onnxruntime_onnx",
        "inputs": [s.to_dict() for s in graph.inputs],
        "outputs": [s.to_dict() for s in graph.outputs],
        "labels": [],
        "batching": {
            "max_batch_size": DEFAULT_MAX_BATCH_SIZE if batches else 0,
            "max_queue_delay_ms": 0,
        },
        "execution": "worker",
        "version_policy": {"all": {}},
    }
    card.update({k: base[k] for k in INHERITED if base and k in base})
    return card


@dataclass(frozen=True)
class Added:
    card: ModelCard
    replaced: bool
    skipped_outputs: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.card.name,
            "version": self.card.version,
            "replaced": self.replaced,
            "card": self.card.to_dict(),
            "skipped_outputs": list(self.skipped_outputs),
        }


def add_model(
    root: Path,
    source: Path,
    name: str,
    version: str | None = None,
    *,
    force: bool = False,
    move: bool = False,
    card: dict[str, Any] | None = None,
    build: Callable[[Path, Path], dict[str, Any]] | None = None,
) -> Added:
    """Check `source`, draft its card, and place both as `name`/`version`
    (default: one past the highest numbered version, or 1). Conflict when the
    version exists and not `force`. `move` takes the file (a staged upload)
    instead of copying it. `card`'s fields (a description, tenants) override
    those the new card takes from the newest version's. `build` (a GGUF file's builder)
    writes the version's files from `source` into the folder it is given and
    returns their card; the graph is then checked as any other."""
    check_name(name)
    if version is None:
        version = next_version(root, name)
    check_name(version, "version", MAX_VERSION)
    target = root / name / version
    replaced = target.exists()
    if replaced and not force:
        raise Conflict(
            f"model {name} version {version} already exists; add it as another version, "
            "or replace it (--force, or ?force=true)"
        )
    staging = root / INCOMING / uuid.uuid4().hex
    version_dir = staging / version
    version_dir.mkdir(parents=True)
    try:
        onnx_path = version_dir / "model.onnx"
        base = _newest_card(root, name)
        inherited = {k: base[k] for k in INHERITED if base and k in base}
        steps = _pipeline_card(source)
        if steps is not None:  # a pipeline: a card listing its steps, nothing else
            card_json, graph = {**inherited, **steps, **(card or {})}, Graph((), ())
        elif source.is_dir() or code_intake.is_archive(source):
            card_json = _with_code(source, version_dir, f"{name}:{version}",
                                   {**inherited, **(card or {})})  # fmt: skip
            graph = inspect(onnx_path) if onnx_path.is_file() else Graph((), ())
        else:
            built = build(source, version_dir) if build is not None else None
            if built is None and move:
                os.replace(source, onnx_path)
            elif built is None:
                shutil.copyfile(source, onnx_path)
            graph = inspect(onnx_path, f"{name}:{version}" if move else str(source))
            card_json = draft_card(graph, base) if built is None else {**built, **inherited}
            card_json.update(card or {})
        (version_dir / "card.json").write_text(json.dumps(card_json, indent=2) + "\n")
        try:
            loaded = ModelCard.load(version_dir)  # (a card the repository would skip is not placed)
        except (ValueError, KeyError, TypeError) as exc:
            raise InvalidModel(f"{name}:{version}: its card is not valid: {exc}") from None
        if loaded.steps is not None:
            pipelines.check(loaded, _finder(root))
        _place(version_dir, target, staging)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    logger.info("added model %s:%s at %s", name, version, target)
    return Added(ModelCard.load(target), replaced, graph.skipped_outputs)


def _pipeline_card(source: Path) -> dict[str, Any] | None:
    """The card of a pipeline a source brings (a card.json listing steps, alone or in
    a folder), else None."""
    path = source / "card.json" if source.is_dir() else source
    if source.is_dir() and any((source / f).is_file() for f in ("model.py", "model.onnx")):
        return None
    try:
        with path.open("rb") as file:
            if file.read(1) != b"{":
                return None
        raw = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return raw if isinstance(raw, dict) and "steps" in raw else None


def _finder(root: Path) -> pipelines.Find:
    """A step's model as the repository's folder holds it now (its newest version)."""
    from app.repository.registry import ModelRepository

    repository = ModelRepository(root)

    def find(name: str, version: str | None) -> ModelCard | None:
        versions = repository.versions(name)
        chosen = version if version is not None else (versions[-1] if versions else None)
        return repository.card(name, chosen) if chosen in versions else None

    return find


def _with_code(
    source: Path, version_dir: Path, shown: str, fields: dict[str, Any]
) -> dict[str, Any]:
    """A folder (or an archive of one) with a model.py: its files placed, its
    requirements checked, its graph (if any) loaded, its code tried on its
    examples in a process of its own; the card it serves with."""
    if source.is_dir():
        code_intake.copy_folder(source, version_dir)
    else:
        unpacked = code_intake.unpack_archive(source, version_dir.parent / "unpacked")
        code_intake.copy_folder(unpacked, version_dir)
    if not (version_dir / "model.py").is_file():
        raise InvalidModel(f"{shown}: a folder brings a model.py (and may bring a model.onnx)")
    code_intake.check_requirements(version_dir)
    if (version_dir / "model.onnx").is_file():
        inspect(version_dir / "model.onnx", f"{shown} model.onnx")
    return code_intake.dry_run(version_dir, fields, shown)


def staging_file(root: Path) -> Path:
    """Where an upload is streamed: inside the repository, so it moves in by rename."""
    folder = root / INCOMING
    folder.mkdir(parents=True, exist_ok=True)
    return folder / f"upload-{uuid.uuid4().hex}.onnx"


def _newest_card(root: Path, name: str) -> dict[str, Any] | None:
    """The raw card of `name`'s highest readable version, if any."""
    versions = sorted(
        (p for p in (root / name).glob("*/card.json") if not p.parent.name.startswith(".")),
        key=lambda p: version_key(p.parent.name),
    )
    for path in reversed(versions):
        try:
            raw = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(raw, dict):
            return raw
    return None


def next_version(root: Path, name: str) -> str:
    numbers = [int(p.name) for p in (root / name).glob("*") if p.is_dir() and p.name.isdigit()]
    return str(max(numbers, default=0) + 1)


def check_loadable(card: ModelCard) -> None:
    """The card's model loads in ONNX Runtime (CPU) and agrees with the card;
    InvalidModel naming what is wrong otherwise (an operator's load)."""
    if not card.onnx_path.is_file():
        raise InvalidModel(f"model {card.ref}: {card.onnx_path.name} is missing")
    try:
        check_card(card, _load(card.onnx_path))
    except ModelMismatch as exc:
        raise InvalidModel(f"the graph does not match card.json: {exc}") from None


def _load(path: Path, shown: str | None = None) -> ort.InferenceSession:
    try:
        return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    except Exception as exc:  # ORT raises its own types (InvalidProtobuf, Fail, ...)
        where = shown or f"{path.parent.parent.name}/{path.parent.name}/{path.name}"
        raise InvalidModel(
            f"{where} is not an ONNX model ONNX Runtime can load: "
            f"{type(exc).__name__}: {_short(exc, path)}"
        ) from None


def _place(version_dir: Path, target: Path, staging: Path) -> None:
    """Rename the staged version into place; a replaced one is moved aside first
    (there is a moment with no version there, never one with half a version)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.exists():
        os.replace(target, staging / "replaced")
    os.replace(version_dir, target)


def _spec(node: Any) -> TensorSpec:
    shape = tuple(d if isinstance(d, int) and d >= 0 else -1 for d in (node.shape or []))
    return TensorSpec(node.name, ORT_TO_V2[node.type], shape)


def _short(exc: Exception, path: Path | None = None, limit: int = 300) -> str:
    """The error's text on one line, without the server's own path to the file."""
    text = str(exc).strip().replace("\n", " ")
    if path is not None:
        text = text.replace(f"Load model from {path} failed:", "").replace(str(path), path.name)
    return text if len(text) <= limit else text[:limit] + "..."
