"""A model's own code tried before it is placed: `python -m app.runtime.dry_run
<version folder> [<card defaults as JSON>]`, in a process of its own (the code is
the operator's, but a crash or a hang in it must not take the adder down, and it
never runs in the API process).

It imports `model.py`, drafts `card.json` from the code's `INPUTS` and `OUTPUTS`
where the folder has none, runs the model (code and graph, on the CPU) on the
example requests of `examples.json` (a request object, or a list of them, in
the form `POST /jobs` takes; `{"file": "<name>"}` stands for a file's bytes in
the folder), and checks each answer against the card. It prints one JSON line:
`{"card": {...}, "examples": N}`, or `{"error": "..."}` with exit status 1.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from app.cards import ModelCard, TensorSpec
from app.runtime import code, engine
from app.runtime.sessions import SessionPool
from app.runtime.tensors import InvalidInputs, parse_inputs

EXAMPLES = "examples.json"
DEFAULT_MAX_BATCH_SIZE = 64


class DryRunFailed(Exception):
    pass


def draft(folder: Path, defaults: dict[str, Any]) -> dict[str, Any]:
    """The folder's card.json, or one drafted from the code's declarations."""
    path = folder / "card.json"
    if path.is_file():
        return {**defaults, **json.loads(path.read_text())}
    module = code.load_module(folder / code.CODE_FILE, f"{folder.parent.name}:{folder.name}")
    declared: dict[str, list[Any]] = {}
    for key in ("INPUTS", "OUTPUTS"):
        value = getattr(module, key, None)
        if isinstance(value, list):
            declared[key] = value
    missing = [key for key in ("INPUTS", "OUTPUTS") if key not in declared]
    if missing:
        raise DryRunFailed(
            f"model.py declares no {' and no '.join(missing)} and the folder has no card.json: "
            'declare them in model.py (INPUTS = [{"name": "image", "datatype": "BYTES", '
            '"shape": [-1]}], ...) or write a card.json'
        )
    try:
        specs = [TensorSpec.from_dict(s) for s in (*declared["INPUTS"], *declared["OUTPUTS"])]
    except (KeyError, TypeError, ValueError) as exc:
        raise DryRunFailed(f"model.py's INPUTS or OUTPUTS: each is {{name, datatype, shape}} "
                           f"({type(exc).__name__}: {exc})") from None  # fmt: skip
    batches = all(spec.shape[:1] == (-1,) for spec in specs)
    return {
        "description": str(getattr(module, "DESCRIPTION", "") or ""),
        "platform": "python" if not (folder / "model.onnx").is_file() else "onnxruntime_onnx",
        "inputs": declared["INPUTS"],
        "outputs": declared["OUTPUTS"],
        "batching": {
            "max_batch_size": DEFAULT_MAX_BATCH_SIZE if batches else 0,
            "max_queue_delay_ms": 0,
        },
        **defaults,
    }


def examples(folder: Path, card: ModelCard) -> list[dict[str, Any]]:
    path = folder / EXAMPLES
    if not path.is_file():
        raise DryRunFailed(
            f"the folder has no {EXAMPLES}: a model with its own code is tried on example "
            'requests before it is placed, e.g. [{"inputs": {"image": [{"file": "seven.png"}]}}]'
        )
    raw = json.loads(path.read_text())
    items = raw if isinstance(raw, list) else [raw]
    if not items or not all(isinstance(item, dict) for item in items):
        raise DryRunFailed(f"{EXAMPLES}: a request object, or a list of them")
    requests = []
    for index, item in enumerate(items):
        inputs = _files(folder, item.get("inputs", item))
        try:
            requests.append(parse_inputs(card, inputs))
        except InvalidInputs as exc:
            raise DryRunFailed(f"{EXAMPLES}[{index}] does not fit the card: {exc}") from None
    return requests


def _files(folder: Path, value: Any) -> Any:
    """`{"file": name}` as `{"b64": ...}` of that file of the folder."""
    import base64

    if isinstance(value, dict) and set(value) == {"file"}:
        path = (folder / str(value["file"])).resolve()
        if folder.resolve() not in path.parents or not path.is_file():
            raise DryRunFailed(f"{EXAMPLES} names {value['file']!r}, no file of the folder")
        return {"b64": base64.b64encode(path.read_bytes()).decode()}
    if isinstance(value, dict):
        return {k: _files(folder, v) for k, v in value.items()}
    if isinstance(value, list):
        return [_files(folder, v) for v in value]
    return value


def dry_run(folder: Path, defaults: dict[str, Any]) -> dict[str, Any]:
    """The card the folder's model serves with, once its examples ran on it."""
    card_json = draft(folder, defaults)
    (folder / "card.json").write_text(json.dumps(card_json, indent=2) + "\n")
    try:
        card = ModelCard.load(folder)
    except (KeyError, TypeError, ValueError) as exc:
        raise DryRunFailed(f"its card is not valid: {type(exc).__name__}: {exc}") from None
    requests = examples(folder, card)
    results = engine.infer(SessionPool("cpu"), card, requests)
    for index, result in enumerate(results):
        if isinstance(result, Exception):
            raise DryRunFailed(f"{EXAMPLES}[{index}] failed: {type(result).__name__}: {result}")
    return {"card": card_json, "examples": len(requests)}


def main(argv: list[str]) -> int:
    folder = Path(argv[0])
    defaults = json.loads(argv[1]) if len(argv) > 1 else {}
    try:
        print(json.dumps(dry_run(folder, defaults)))
        return 0
    except (DryRunFailed, code.CodeNotLoadable, OSError, ValueError) as exc:
        print(json.dumps({"error": str(exc)}))
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
