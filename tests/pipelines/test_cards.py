"""A pipeline's card refused when it is added, naming the step: a cycle, a model
not in the repository, a source that gives another datatype or shape, a step
that leaves an input of its model unfed; a good one placed, its steps in the
order their sources need, and shown as Triton's ensemble."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from app.errors import InvalidModel
from app.operations.triton import model_config
from app.repository import intake
from app.repository.registry import ModelRepository

PHOTO: dict[str, Any] = json.loads(
    (Path(__file__).parents[2] / "models" / "digit-photo" / "1" / "card.json").read_text()
)


@pytest.fixture()
def root(tmp_path: Path, model_repository: Path) -> Path:
    """A repository with the steps' models (their cards and files as bundled)."""
    root = tmp_path / "repository"
    bundled = Path(__file__).parents[2] / "models"
    for name in ("digit-decode", "digit-answer"):
        shutil.copytree(bundled / name, root / name)
    shutil.copytree(model_repository / "digits", root / "digits")
    chat = root / "smollm2" / "1"  # (its card, and its graph linked: not copied)
    chat.mkdir(parents=True)
    shutil.copyfile(model_repository / "smollm2" / "1" / "card.json", chat / "card.json")
    (chat / "model.onnx").symlink_to(model_repository / "smollm2" / "1" / "model.onnx")
    return root


def add(root: Path, tmp_path: Path, card: dict[str, Any], name: str = "pipe") -> Any:
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(card))
    return intake.add_model(root, path, name)


def test_a_pipeline_is_added_in_the_order_its_sources_need(root: Path, tmp_path: Path) -> None:
    steps = list(reversed(PHOTO["steps"]))  # listed last step first
    added = add(root, tmp_path, {**PHOTO, "steps": steps})
    card = ModelRepository(root).resolve("pipe")
    assert added.card.ref == "pipe:1" and card.steps is not None
    assert [s.name for s in card.steps.order] == ["decode", "classify", "answer"]
    config = model_config(card)
    assert config["platform"] == "ensemble" and config["backend"] == ""
    assert config["ensemble_scheduling"]["step"][1] == {
        "model_name": "digits", "model_version": -1, "input_map": {"pixels": "decode.pixels"},
        "output_map": {"label": "classify.label", "probabilities": "classify.probabilities"},
    }  # fmt: skip
    assert config["ensemble_scheduling"]["step"][2]["output_map"] == {
        "confidence": "confidence", "digit": "digit"}  # fmt: skip


def _steps(**changes: Any) -> list[dict[str, Any]]:
    steps = [dict(step) for step in PHOTO["steps"]]
    for step in steps:
        step.update(changes.get(step["name"], {}))
    return steps


@pytest.mark.parametrize(
    ("steps", "said"),
    [
        (_steps(decode={"inputs": {"image": "answer.digit"}}),
         "steps answer, classify, decode take from each other (a cycle)"),
        (_steps(decode={"inputs": {"image": "decode.pixels"}}),
         "steps answer, classify, decode take from each other (a cycle)"),
        (_steps(classify={"model": "nope"}),
         "step 'classify': model 'nope' is not in the repository"),
        (_steps(classify={"inputs": {"pixels": "image"}}),
         "step 'classify': its input 'pixels' is FP32 [-1, 64]; 'image' gives BYTES [-1]"),
        (_steps(answer={"inputs": {"label": "classify.label"}}),
         "step 'answer': model digit-answer:1 takes ['label', 'probabilities']; the step "
         "feeds ['label'] and leaves ['probabilities'] unfed"),
        (_steps(answer={"inputs": {"label": "classify.label",
                                   "probabilities": "classify.scores"}}),
         "step 'answer': it takes 'classify.scores', which its source does not give "
         "(it gives ['classify.label', 'classify.probabilities'])"),
        (_steps(classify={"inputs": {"pixels": "missing.pixels"}}),
         "step 'classify' takes 'missing.pixels' from a step that is not there"),
    ],
    ids=["a cycle", "a step taking from itself", "an unknown model", "a datatype mismatch",
         "an input unfed", "an output the source lacks", "an unknown step"],
)  # fmt: skip
def test_a_pipeline_that_cannot_run_is_refused_naming_its_step(
    root: Path, tmp_path: Path, steps: list[dict[str, Any]], said: str
) -> None:
    with pytest.raises(InvalidModel) as refused:
        add(root, tmp_path, {**PHOTO, "steps": steps})
    assert said in str(refused.value)
    assert not (root / "pipe").exists()


TRIAGE: dict[str, Any] = json.loads(
    (Path(__file__).parents[2] / "models" / "triage" / "1" / "card.json").read_text()
)


@pytest.mark.parametrize(
    ("change", "said"),
    [
        ({"top_q": 1}, "step 'classify': model smollm2:1 takes no parameter ['top_q']"),
        ({"labels": []}, "step 'classify': labels: a list of the labels to score"),
    ],
    ids=["an unknown parameter", "no labels"],
)
def test_a_chat_step_is_added_with_parameters_the_chat_model_takes(
    root: Path, tmp_path: Path, change: dict[str, Any], said: str
) -> None:
    assert add(root, tmp_path, TRIAGE, "triage").card.steps is not None
    steps = [dict(step) for step in TRIAGE["steps"]]
    steps[0]["parameters"] = {**steps[0]["parameters"], **change}
    with pytest.raises(InvalidModel) as refused:
        add(root, tmp_path, {**TRIAGE, "steps": steps}, "bad-triage")
    assert said in str(refused.value)


def test_an_output_of_another_datatype_than_its_source_is_refused(
    root: Path, tmp_path: Path
) -> None:
    outputs = [{**PHOTO["outputs"][0], "datatype": "FP32"}, PHOTO["outputs"][1]]
    with pytest.raises(InvalidModel) as refused:
        add(root, tmp_path, {**PHOTO, "outputs": outputs})
    assert "output 'digit' is FP32 [-1]; 'answer.digit' gives INT64 [-1]" in str(refused.value)
