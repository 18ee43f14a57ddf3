"""The model repository: `<root>/<name>/<version>/model.onnx` plus `card.json`.

The card is the model's contract (inputs, outputs, labels, provenance, held-out
accuracy, and the pre- and post-processing around the graph, if any). The API
validates submissions against it without loading ONNX Runtime; workers check on
load that the ONNX graph agrees with it.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)


class UnknownModel(LookupError):
    def __init__(self, name: str, version: str | None, known: list[str]) -> None:
        self.name, self.version, self.known = name, version, known
        what = f"model '{name}'" + (f" version '{version}'" if version else "")
        listed = ", ".join(known) or "none"
        super().__init__(f"{what} is not in the repository; known models: {listed}")


@dataclass(frozen=True)
class TensorSpec:
    name: str
    datatype: str  # KServe v2 datatype, e.g. FP32
    shape: tuple[int, ...]  # -1 means any size

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "datatype": self.datatype, "shape": list(self.shape)}

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> TensorSpec:
        return cls(str(raw["name"]), str(raw["datatype"]), tuple(int(d) for d in raw["shape"]))


@dataclass(frozen=True)
class Batching:
    """How a worker batches jobs of this model, like Triton's dynamic batcher.

    With `max_batch_size` > 0 the first dimension of every input and output is
    the batch: jobs are concatenated along it, up to that many rows per ONNX
    Runtime call, after the worker waited up to `max_queue_delay_ms` for more.
    0 runs each job in a call of its own (inputs without a batch dimension).
    """

    max_batch_size: int = 0
    max_queue_delay_ms: float = 0.0

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> Batching:
        size, delay = int(raw.get("max_batch_size", 0)), float(raw.get("max_queue_delay_ms", 0))
        if size < 0 or not 0 <= delay <= 1000:
            raise ValueError("batching: max_batch_size >= 0 and 0 <= max_queue_delay_ms <= 1000")
        return cls(size, delay)


@dataclass(frozen=True)
class PipelineSpec:
    """Pre- and post-processing declared by the card, run around the graph by
    `app.inference.pipeline`: `pre` steps turn the card's inputs into the graph's
    (`model_inputs`), `post` steps turn its outputs (`model_outputs`) into the
    card's. Each step is `{"step": <name>, ...its parameters}`."""

    pre: tuple[dict[str, Any], ...]
    model_inputs: tuple[TensorSpec, ...]
    model_outputs: tuple[TensorSpec, ...]
    post: tuple[dict[str, Any], ...]
    why: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            **({"why": self.why} if self.why else {}),
            "pre": list(self.pre),
            "model": {
                "inputs": [s.to_dict() for s in self.model_inputs],
                "outputs": [s.to_dict() for s in self.model_outputs],
            },
            "post": list(self.post),
        }

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> PipelineSpec:
        steps = [*raw.get("pre", []), *raw.get("post", [])]
        if not all(isinstance(step, dict) and isinstance(step.get("step"), str) for step in steps):
            raise ValueError('pipeline: every step is an object with a "step" name')
        return cls(
            pre=tuple(raw.get("pre", [])),
            model_inputs=tuple(TensorSpec.from_dict(s) for s in raw["model"]["inputs"]),
            model_outputs=tuple(TensorSpec.from_dict(s) for s in raw["model"]["outputs"]),
            post=tuple(raw.get("post", [])),
            why=str(raw.get("why", "")),
        )


@dataclass(frozen=True)
class ModelCard:
    name: str
    version: str
    path: Path  # the version directory
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    platform: str = "onnxruntime_onnx"
    description: str = ""
    labels: tuple[str, ...] = ()
    batching: Batching = field(default_factory=Batching)
    pipeline: PipelineSpec | None = None  # None: clients' tensors go to the graph as they are
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def onnx_path(self) -> Path:
        return self.path / "model.onnx"

    @property
    def ref(self) -> str:
        return f"{self.name}:{self.version}"

    def input(self, name: str) -> TensorSpec | None:
        return next((spec for spec in self.inputs if spec.name == name), None)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "version": self.version,
            "platform": self.platform,
            "description": self.description,
            "inputs": [s.to_dict() for s in self.inputs],
            "outputs": [s.to_dict() for s in self.outputs],
            "labels": list(self.labels),
            "batching": {
                "max_batch_size": self.batching.max_batch_size,
                "max_queue_delay_ms": self.batching.max_queue_delay_ms,
            },
            **({"pipeline": self.pipeline.to_dict()} if self.pipeline else {}),
            **self.extra,
        }

    @classmethod
    def load(cls, version_dir: Path) -> ModelCard:
        raw = json.loads((version_dir / "card.json").read_text())
        known = {"name", "version", "platform", "description", "inputs", "outputs", "labels",
                 "batching", "pipeline"}  # fmt: skip
        return cls(
            name=version_dir.parent.name,
            version=version_dir.name,
            path=version_dir,
            inputs=tuple(TensorSpec.from_dict(s) for s in raw["inputs"]),
            outputs=tuple(TensorSpec.from_dict(s) for s in raw["outputs"]),
            platform=raw.get("platform", "onnxruntime_onnx"),
            description=raw.get("description", ""),
            labels=tuple(raw.get("labels", ())),
            batching=Batching.from_dict(raw.get("batching", {})),
            pipeline=PipelineSpec.from_dict(raw["pipeline"]) if "pipeline" in raw else None,
            extra={k: v for k, v in raw.items() if k not in known},
        )


def _version_key(version: str) -> tuple[int, int | str]:
    return (0, int(version)) if version.isdigit() else (1, version)


class ModelRepository:
    """Cards found under `root`, scanned once; `refresh()` rescans."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._cards: dict[str, dict[str, ModelCard]] = {}
        self.refresh()

    def refresh(self) -> None:
        cards: dict[str, dict[str, ModelCard]] = {}
        if self.root.is_dir():
            for card_path in sorted(self.root.glob("*/*/card.json")):
                version_dir = card_path.parent
                if not (version_dir / "model.onnx").is_file():
                    continue
                try:
                    card = ModelCard.load(version_dir)
                except (OSError, ValueError, KeyError) as exc:
                    logger.error("skipping model at %s: unreadable card (%s)", version_dir, exc)
                    continue
                cards.setdefault(card.name, {})[card.version] = card
        self._cards = cards

    def names(self) -> list[str]:
        return sorted(self._cards)

    def versions(self, name: str) -> list[str]:
        return sorted(self._cards.get(name, {}), key=_version_key)

    def all(self) -> list[ModelCard]:
        return [self._cards[n][v] for n in self.names() for v in self.versions(n)]

    def resolve_rescanning(self, name: str, version: str | None = None) -> ModelCard:
        """`resolve`, rescanning once when not found: added since this process started?"""
        try:
            return self.resolve(name, version)
        except UnknownModel:
            self.refresh()
        return self.resolve(name, version)

    def resolve(self, name: str, version: str | None = None) -> ModelCard:
        """The card for `name` at `version`, or at its highest version when None."""
        versions = self._cards.get(name)
        if not versions:
            raise UnknownModel(name, version, self.names())
        if version is None:
            return versions[self.versions(name)[-1]]
        try:
            return versions[version]
        except KeyError:
            known = [f"{name}:{v}" for v in self.versions(name)]
            raise UnknownModel(name, version, known) from None
