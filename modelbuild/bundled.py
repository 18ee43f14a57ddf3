"""Building the bundled models: `ensure_models` builds each one whose file is
missing from a model repository, with the builder its card's `build.builder` names.

Each builder imports the packages it needs (requirements-build.txt) inside itself,
so importing this module loads none of them, and a repository whose models are all
built needs none."""

from __future__ import annotations

import json
import logging
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

from modelbuild.chat import build_llama_gguf
from modelbuild.digits import build_digits
from modelbuild.encoders import build_bert, build_heavy
from modelbuild.files import BUNDLED, write_atomically

__all__ = ["BUILDERS", "BUNDLED", "Builder", "ensure_models"]

logger = logging.getLogger(__name__)

# A builder gets the card and the version directory (for files it copies beside
# model.onnx) and returns the graph's bytes and facts about the build.
Builder = Callable[[dict[str, Any], Path], tuple[bytes, dict[str, str]]]

BUILDERS: dict[str, Builder] = {
    "digits": build_digits,
    "heavy": build_heavy,
    "bert": build_bert,
    "llama_gguf": build_llama_gguf,
}


def _committed(source: Path) -> list[Path]:
    """The files of a bundled version as committed (not those a build makes)."""
    made = {"model.onnx", "model.cuda.onnx", "tokenizer.json"}
    return [p for p in sorted(source.iterdir()) if p.is_file() and p.name not in made]


def _stale(source: Path, target: Path) -> bool:
    """Whether another repository lacks a committed file of the version."""
    if target.resolve() == source.resolve():
        return False
    return any(not (target / p.name).is_file() for p in _committed(source))


def ensure_models(root: Path, *, force: bool = False, cuda: bool = False) -> list[Path]:
    """Build each bundled model whose `model.onnx` is missing from `root` (all of
    them with force); a repository other than the bundled one gets the card too.
    With `cuda`, also `model.cuda.onnx` where the card's build names other weights
    for the CUDA provider (`cuda_weights`: the chat model in float16, since ONNX
    Runtime's CUDA attention takes no float32); sessions on CUDA load that file."""
    todo = []
    for card_path in sorted(BUNDLED.glob("*/*/card.json")):
        source = card_path.parent
        target = root / source.parent.name / source.name
        card = json.loads(card_path.read_text())
        # (a model of code alone, or a pipeline, has nothing to build: its files are all)
        variants = {"model.onnx": card} if "build" in card else {}
        if cuda and "cuda_weights" in card.get("build", {}):
            weights = card["build"]["cuda_weights"]
            variants["model.cuda.onnx"] = {**card, "build": {**card["build"], "weights": weights}}
        missing = {name: variant for name, variant in variants.items()
                   if force or not (target / name).is_file()}  # fmt: skip
        if missing or _stale(source, target):
            todo.append((card_path, target, missing))
    built = []
    with _bar(len(todo), "models build", "model") as bar:
        for card_path, target, missing in todo:
            source = card_path.parent
            bar.set_postfix_str(f"{source.parent.name}/{source.name}")
            if target.resolve() != source.resolve():
                target.mkdir(parents=True, exist_ok=True)
                for path in _committed(source):  # the card, and a model's own code and files
                    shutil.copyfile(path, target / path.name)
            for name, variant in missing.items():
                started = time.monotonic()
                model_bytes, facts = BUILDERS[variant["build"]["builder"]](variant, target)
                write_atomically(target / name, model_bytes)
                logger.info(
                    "built %s/%s %s in %s in %.1f s (%s)", source.parent.name, source.name,
                    name, target, time.monotonic() - started, facts,
                )  # fmt: skip
            if missing:  # (a version whose files were only copied was not built)
                built.append(target)
            bar.update()
    return built


@contextmanager
def _bar(total: int, desc: str, unit: str) -> Iterator[Any]:
    """A tqdm bar of `total` steps on stderr, drawn only when stderr is a terminal
    (tqdm's disable=None) and there is a step; log lines go above it."""
    from tqdm import tqdm
    from tqdm.contrib.logging import logging_redirect_tqdm

    quiet = None if total >= 1 else True
    shown = tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, disable=quiet)
    with shown, logging_redirect_tqdm() if not shown.disable else nullcontext():
        yield shown
