"""The model repository, input checks and ONNX Runtime sessions (no services needed)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from app.errors import UnknownModel
from app.repository.registry import ModelRepository
from app.runtime.sessions import ModelMismatch, SessionPool, device_for
from app.runtime.tensors import (
    InvalidInputs,
    from_json,
    pack,
    pack_header,
    parse_inputs,
    to_json,
    unpack,
    unpack_apart,
)


@pytest.fixture(scope="module")
def repo(model_repository: Path) -> ModelRepository:
    return ModelRepository(model_repository)


def test_card_matches_the_graph_and_records_provenance(repo: ModelRepository) -> None:
    card = repo.resolve("digits")
    session = ort.InferenceSession(str(card.onnx_path), providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == [s.name for s in card.inputs]
    assert [o.name for o in session.get_outputs()] == [s.name for s in card.outputs]
    assert card.extra["metrics"]["heldout_accuracy"] > 0.95
    assert "load_digits" in card.extra["made_by"]["data"]


def test_resolve_picks_the_highest_version(repo: ModelRepository, tmp_path: Path) -> None:
    src = repo.resolve("digits").path
    for version in ("2", "10"):
        shutil.copytree(src, tmp_path / "digits" / version)
    local = ModelRepository(tmp_path)
    assert local.versions("digits") == ["2", "10"]
    assert local.resolve("digits").version == "10"
    assert local.resolve("digits", "2").version == "2"
    with pytest.raises(UnknownModel, match="digits:2, digits:10"):
        local.resolve("digits", "3")


def test_unreadable_card_is_skipped(repo: ModelRepository, tmp_path: Path) -> None:
    shutil.copytree(repo.resolve("digits").path, tmp_path / "broken" / "1")
    (tmp_path / "broken" / "1" / "card.json").write_text("{not json")
    assert ModelRepository(tmp_path).names() == []


def test_both_input_forms_give_the_same_array(repo: ModelRepository) -> None:
    card = repo.resolve("digits")
    rows = np.arange(128, dtype=np.float32).reshape(2, 64) / 8
    nested = parse_inputs(card, {"pixels": rows.tolist()})
    tensor = parse_inputs(
        card,
        [{"name": "pixels", "shape": [2, 64], "datatype": "FP32", "data": rows.ravel().tolist()}],
    )
    assert np.array_equal(nested["pixels"], tensor["pixels"])
    assert nested["pixels"].dtype == np.float32
    assert np.array_equal(from_json(card.inputs, to_json(nested))["pixels"], rows)


def test_integers_are_accepted_for_float_inputs_but_not_booleans(repo: ModelRepository) -> None:
    card = repo.resolve("digits")
    assert parse_inputs(card, {"pixels": [[1] * 64]})["pixels"].dtype == np.float32
    with pytest.raises(InvalidInputs) as bools:
        parse_inputs(card, {"pixels": [[True] * 64]})
    assert "only numbers" in bools.value.errors["pixels"]


def test_sessions_check_the_card_against_the_graph(repo: ModelRepository, tmp_path: Path) -> None:
    version_dir = tmp_path / "digits" / "1"
    shutil.copytree(repo.resolve("digits").path, version_dir)
    card_path = version_dir / "card.json"
    card = json.loads(card_path.read_text())
    card["inputs"][0]["name"] = "image"
    card_path.write_text(json.dumps(card))
    with pytest.raises(ModelMismatch, match="image"):
        SessionPool("cpu").get(ModelRepository(tmp_path).resolve("digits"))


def test_one_session_per_model_version(repo: ModelRepository) -> None:
    pool = SessionPool("auto")
    card = repo.resolve("digits")
    assert pool.get(card) is pool.get(card)
    assert set(pool.providers()) == {"digits:1"}
    assert pool.providers()["digits:1"] in ("CUDAExecutionProvider", "CPUExecutionProvider")


def test_unknown_provider_setting_is_refused() -> None:
    with pytest.raises(ValueError, match="auto, cpu or cuda"):
        SessionPool("tpu")


@pytest.mark.parametrize("dtype", ["float32", "float16", "float64", "int64", "int8", "bool"])
def test_packed_tensors_round_trip_at_their_raw_size(dtype: str) -> None:
    arrays = {
        "a": (np.arange(1024).reshape(16, 64) % 7).astype(dtype),
        "b": np.array([3], dtype="int64"),
    }
    data = pack(arrays)
    raw = sum(a.nbytes for a in arrays.values())
    assert raw <= len(data) <= raw + 128
    back = unpack(memoryview(data))  # as psycopg2 hands bytea back
    assert list(back) == ["a", "b"]
    for name, array in arrays.items():
        assert back[name].dtype == array.dtype and np.array_equal(back[name], array)


def test_packed_tensors_with_bytes_left_over_are_refused() -> None:
    with pytest.raises(ValueError, match="left over"):
        unpack(pack({"a": np.zeros(4, np.float32)}) + b"\0")


def test_a_header_and_its_data_apart_read_as_the_packed_whole() -> None:
    """A batch chunk's header and its rows (a byte range of the upload) are read
    without joining them: the arrays lie in the data, uncopied."""
    arrays = {"a": np.arange(128, dtype=np.float32).reshape(2, 64), "b": np.arange(3)}
    packed = pack(arrays)
    header = pack_header([(n, "FP32" if n == "a" else "INT64", a.shape) for n, a in arrays.items()])
    data = packed[len(header) :]
    apart = unpack_apart(header, data)
    for name, array in unpack(packed).items():
        assert np.array_equal(apart[name], array)
    assert np.shares_memory(apart["a"], np.frombuffer(data, np.uint8))
    with pytest.raises(ValueError, match="left over"):
        unpack_apart(header, data + b"\0")


def test_worker_processes_are_pinned_one_per_gpu() -> None:
    """CUDA_DEVICES=0,1: process 0 on GPU 0, 1 on GPU 1, a third shares GPU 0."""
    assert [device_for(i, (0, 1)) for i in range(3)] == [0, 1, 0]
    assert device_for(5, ()) is None  # unset: ORT's default device
    pinned = SessionPool("cuda", device_id=1).wanted_providers()
    assert pinned == [("CUDAExecutionProvider", {"device_id": "1"}), "CPUExecutionProvider"]
    assert SessionPool("cpu", device_id=1).wanted_providers() == ["CPUExecutionProvider"]


def test_a_pinned_pool_still_serves_where_cuda_cannot_start(repo: ModelRepository) -> None:
    """`auto` with a device: on a machine without a usable GPU, onnxruntime-gpu
    falls back to CPU and the model serves; the device option must not break that."""
    card = repo.resolve("digits")
    pool = SessionPool("auto", device_id=0)
    outputs = pool.run(card, {"pixels": np.zeros((2, 64), dtype=np.float32)})
    assert outputs["label"].shape == (2,)
    assert pool.providers()["digits:1"] in ("CUDAExecutionProvider", "CPUExecutionProvider")
