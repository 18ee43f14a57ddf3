"""A step's own retry policy (`max_attempts`): a request whose step fails is tried
again alone, with backoff, while the steps before it keep what they made; past
its tries the job fails naming the step."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from app.execution import runs
from app.repository.registry import ModelRepository
from app.runtime.sessions import SessionPool
from app.runtime.tensors import parse_inputs

COUNTED = """
import numpy as np
from pathlib import Path
LOG = Path(__file__).parents[3] / "calls.log"

def postprocess(batch):
    with LOG.open("a") as log:
        log.write("first\\n" * len(batch))
    return [{"same": r["text"]} for r in batch]
"""

FLAKY = """
import numpy as np
from pathlib import Path
LOG = Path(__file__).parents[3] / "calls.log"

def postprocess(batch):
    out = []
    for r in batch:
        text = r["text"][0].decode()
        with LOG.open("a") as log:
            log.write(f"flaky {text}\\n")
        tries = LOG.read_text().splitlines().count(f"flaky {text}")
        fails = int(text.split(":")[1])
        out.append(ValueError(f"try {tries}") if tries <= fails else {"done": r["text"]})
    return out
"""


def repository(root: Path, max_attempts: int) -> ModelRepository:
    text = {"name": "text", "datatype": "BYTES", "shape": [-1]}
    for name, source, output in (("counted", COUNTED, "same"), ("flaky", FLAKY, "done")):
        folder = root / name / "1"
        folder.mkdir(parents=True)
        (folder / "model.py").write_text(source)
        (folder / "card.json").write_text(json.dumps({
            "inputs": [text], "outputs": [{**text, "name": output}],
            "batching": {"max_batch_size": 8}}))  # fmt: skip
    pipeline: dict[str, Any] = {
        "platform": "ensemble", "inputs": [text],
        "outputs": [{**text, "name": "done", "from": "b.done"}],
        "steps": [
            {"name": "a", "model": "counted", "inputs": {"text": "text"}},
            {"name": "b", "model": "flaky", "inputs": {"text": "a.same"},
             "max_attempts": max_attempts},
        ],
    }  # fmt: skip
    (root / "pipe" / "1").mkdir(parents=True)
    (root / "pipe" / "1" / "card.json").write_text(json.dumps(pipeline))
    return ModelRepository(root)


@pytest.mark.parametrize("max_attempts", [3, 2])
def test_a_failing_step_is_retried_alone_under_its_own_policy(
    tmp_path: Path, max_attempts: int
) -> None:
    repo = repository(tmp_path / "models", max_attempts)
    card = repo.resolve("pipe")
    items = [parse_inputs(card, {"text": [t]}) for t in ("x:0", "y:2")]
    calm, flaky = runs.run_card(SessionPool("cpu"), card, items, repo)
    calls = (tmp_path / "calls.log").read_text().splitlines()
    assert isinstance(calm, runs.Ran) and calm.outputs["done"].tolist() == [b"x:0"]
    assert calls.count("first") == 2  # the step before ran once a request
    assert calls.count("flaky x:0") == 1 and calls.count("flaky y:2") == min(3, max_attempts)
    if max_attempts == 3:
        assert isinstance(flaky, runs.Ran) and flaky.outputs["done"].tolist() == [b"y:2"]
    else:
        assert isinstance(flaky, runs.Failed) and flaky.code == "code_error"
        assert flaky.detail == "step 'b' (flaky:1): model.py postprocess: ValueError: try 2"
