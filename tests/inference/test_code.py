"""A model's own code (model.py) in the one run path, added the way an operator
adds it: its card drafted from its declarations, its requirements and examples
checked before it is placed, a bad request failing alone, a slow call ended."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from sklearn.datasets import load_digits

from app.cards import ModelCard
from app.errors import InvalidModel
from app.repository import intake
from app.runtime import code, engine
from app.runtime.sessions import SessionPool
from app.runtime.tensors import parse_inputs, to_json
from tests.code.folders import digit_png, photo_folder, whims_folder

DIGITS = load_digits()


@pytest.fixture()
def root(tmp_path: Path) -> Path:
    return tmp_path / "repository"


def photo(root: Path, model_repository: Path, tmp_path: Path) -> ModelCard:
    folder = photo_folder(tmp_path / "photo", model_repository / "digits" / "1",
                          digit_png(DIGITS.data[7]))  # fmt: skip
    return intake.add_model(root, folder, "photo").card


def test_a_folder_with_model_py_is_added_with_the_card_its_code_declares(
    root: Path, model_repository: Path, tmp_path: Path
) -> None:
    card = photo(root, model_repository, tmp_path)
    assert card.code and card.graph and card.path == root / "photo" / "1"
    assert [(s.name, s.datatype) for s in card.inputs] == [("image", "BYTES")]
    assert [(s.name, s.datatype) for s in card.outputs] == [
        ("digit", "INT64"), ("confidence", "FP32")]  # fmt: skip
    assert (card.path / "labels.txt").is_file() and card.batching.max_batch_size == 64


def test_a_code_model_answers_what_its_steps_give_by_hand(
    root: Path, model_repository: Path, tmp_path: Path
) -> None:
    card = photo(root, model_repository, tmp_path)
    images = [digit_png(DIGITS.data[i]) for i in range(12)]
    requests = [parse_inputs(card, {"image": [{"b64": _b64(png)}]}) for png in images]
    results = engine.infer(SessionPool("cpu"), card, requests)
    # By hand: the same decoding, ONNX Runtime on the digits graph, the argmax.
    module = code.load_module(card.code_path, "by-hand")
    pixels = np.stack([module.pixels(png) for png in images])
    session = ort.InferenceSession(str(card.onnx_path), providers=["CPUExecutionProvider"])
    labels, probabilities = session.run(["label", "probabilities"], {"pixels": pixels})
    for i, result in enumerate(results):
        assert not isinstance(result, Exception), result
        assert result["digit"].tolist() == [int(labels[i])]
        np.testing.assert_array_equal(result["confidence"], probabilities[i : i + 1].max(axis=1))
    assert sum(int(r["digit"][0]) == DIGITS.target[i] for i, r in enumerate(results)) >= 10


def test_an_exception_in_the_code_fails_its_request_alone(root: Path, tmp_path: Path) -> None:
    card = intake.add_model(root, whims_folder(tmp_path / "whims"), "whims").card
    texts = ["hello", "raise", "world"]
    requests = [parse_inputs(card, {"text": [t]}) for t in texts]
    results = engine.infer(SessionPool("cpu"), card, requests)
    hello, failed, world = results
    assert not isinstance(hello, Exception) and hello["shout"].tolist() == [b"HELLO"]
    assert isinstance(failed, code.CodeError)
    assert str(failed) == "model.py postprocess: ValueError: asked to fail"
    assert not isinstance(world, Exception) and world["shout"].tolist() == [b"WORLD"]
    assert to_json({"shout": world["shout"]}) == {"shout": ["WORLD"]}


@pytest.mark.parametrize("where", ["main thread", "another thread"])
def test_a_call_past_its_time_limit_is_ended(root: Path, tmp_path: Path, where: str) -> None:
    card = intake.add_model(root, whims_folder(tmp_path / "whims", time_limit_s=0.5), "slow").card
    requests = [parse_inputs(card, {"text": [t]}) for t in ("sleep:30", "quick")]
    results: list[object] = []

    def run() -> None:
        results.extend(engine.infer(SessionPool("cpu"), card, requests))

    if where == "main thread":
        run()
    else:
        thread = threading.Thread(target=run)
        thread.start()
        thread.join(20)  # (a liveness bound: the sleep alone is 30 s)
        assert not thread.is_alive(), "the call was not ended"
    ended, quick = results
    assert isinstance(ended, code.CodeTimeLimit) and "time limit of 0.5 s" in str(ended)
    assert not isinstance(quick, Exception) and quick["shout"].tolist() == [b"QUICK"]


def test_requirements_that_are_not_installed_are_refused_by_name(
    root: Path, tmp_path: Path
) -> None:
    folder = whims_folder(tmp_path / "whims")
    (folder / "requirements.txt").write_text("numpy\nno-such-package-here==1.0\npillow>=99\n")
    with pytest.raises(InvalidModel) as refused:
        intake.add_model(root, folder, "needy")
    assert "no-such-package-here is not installed" in str(refused.value)
    assert "asks for >=99" in str(refused.value)
    assert not (root / "needy").exists()


@pytest.mark.parametrize(
    ("change", "said"),
    [
        ("examples", "examples.json[0] failed: CodeError: model.py postprocess: ValueError"),
        ("no examples", "the folder has no examples.json"),
        ("no declarations", "model.py declares no INPUTS and no OUTPUTS"),
        ("import fails", "raised on import: ZeroDivisionError"),
    ],
)
def test_code_that_fails_its_dry_run_is_refused_and_nothing_is_placed(
    root: Path, tmp_path: Path, change: str, said: str
) -> None:
    folder = whims_folder(tmp_path / "whims")
    if change == "examples":
        (folder / "examples.json").write_text('{"inputs": {"text": ["raise"]}}')
    elif change == "no examples":
        (folder / "examples.json").unlink()
    else:
        source = (folder / "model.py").read_text()
        if change == "no declarations":
            source = source.replace("INPUTS =", "_INPUTS =").replace("OUTPUTS =", "_OUTPUTS =")
        else:
            source += "\n1 / 0\n"
        (folder / "model.py").write_text(source)
    with pytest.raises(InvalidModel) as refused:
        intake.add_model(root, folder, "refused")
    assert said in str(refused.value)
    assert not (root / "refused").exists()


def test_a_code_model_reloads_its_changed_file_and_drops_a_version_gone(
    root: Path, tmp_path: Path
) -> None:
    card = intake.add_model(root, whims_folder(tmp_path / "whims"), "reloaded").card
    pool = code.CodePool()
    first = pool.get(card)
    assert pool.get(card) is first
    source = card.code_path.read_text().replace("text.upper()", "text.lower()")
    card.code_path.write_text(source)
    import os

    os.utime(card.code_path, ns=(1, 10**18))
    assert pool.get(card) is not first
    assert pool.retain(set()) == [card.ref] and pool.loaded() == []


def _b64(data: bytes) -> str:
    import base64

    return base64.b64encode(data).decode()
