"""Small ONNX models made for the tests, so that slow jobs and allocation
failures are real ONNX Runtime behaviour, not mocks.

- `slow`: `y = tanh(x @ W)` repeated `steps` times in an ONNX Loop (about 2 us a
  step on one core): a job that takes as long as the test asks.
- `memhog`: allocates `n` floats and sums them. A huge `n` makes ORT's allocator
  fail ("Failed to allocate memory"), as a GPU out of memory does; `fixed=True`
  clamps `n` to 1000, the model a person would deploy to fix it.
- `memhog-rows`: a batchable `memhog` (`build_memhog_rows`): each row is an `n`,
  the call fills the largest `n` of its rows with floats (every page written),
  and returns the rows as floats. One large row makes the process that runs
  it grow by that much: under a memory limit, the kernel's OOM killer ends it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper


def _save(root: Path, name: str, model: onnx.ModelProto, inputs: list, outputs: list) -> None:
    model.ir_version = 9
    onnx.checker.check_model(model)
    version_dir = root / name / "1"
    version_dir.mkdir(parents=True, exist_ok=True)
    tmp = version_dir / ".model.onnx.tmp"
    tmp.write_bytes(model.SerializeToString())
    os.replace(tmp, version_dir / "model.onnx")
    card = {"description": f"test model {name}", "inputs": inputs, "outputs": outputs}
    (version_dir / "card.json").write_text(json.dumps(card))


def build_slow(root: Path) -> None:
    weights = numpy_helper.from_array(np.eye(64, dtype=np.float32) * 0.5, "W")
    body = h.make_graph(
        [
            h.make_node("MatMul", ["y_in", "W"], ["product"]),
            h.make_node("Tanh", ["product"], ["y_out"]),
            h.make_node("Identity", ["cond_in"], ["cond_out"]),
        ],
        "step",
        [
            h.make_tensor_value_info("i", T.INT64, []),
            h.make_tensor_value_info("cond_in", T.BOOL, []),
            h.make_tensor_value_info("y_in", T.FLOAT, [None, 64]),
        ],
        [
            h.make_tensor_value_info("cond_out", T.BOOL, []),
            h.make_tensor_value_info("y_out", T.FLOAT, [None, 64]),
        ],
        [weights],
    )
    graph = h.make_graph(
        [
            h.make_node("Squeeze", ["steps"], ["count"]),
            h.make_node("Constant", [], ["go"], value=h.make_tensor("t", T.BOOL, [], [True])),
            h.make_node("Loop", ["count", "go", "x"], ["y"], body=body),
        ],
        "slow",
        [
            h.make_tensor_value_info("x", T.FLOAT, [None, 64]),
            h.make_tensor_value_info("steps", T.INT64, [1]),
        ],
        [h.make_tensor_value_info("y", T.FLOAT, [None, 64])],
    )
    _save(
        root,
        "slow",
        h.make_model(graph, opset_imports=[h.make_opsetid("", 17)]),
        [{"name": "x", "datatype": "FP32", "shape": [-1, 64]},
         {"name": "steps", "datatype": "INT64", "shape": [1]}],
        [{"name": "y", "datatype": "FP32", "shape": [-1, 64]}],
    )  # fmt: skip


def build_memhog(root: Path, *, fixed: bool = False) -> None:
    nodes = [h.make_node("Constant", [], ["cap"], value=h.make_tensor("c", T.INT64, [1], [1000]))]
    nodes.append(h.make_node("Min", ["n", "cap"], ["size"]) if fixed
                 else h.make_node("Identity", ["n"], ["size"]))  # fmt: skip
    nodes += [
        h.make_node("ConstantOfShape", ["size"], ["big"],
                    value=h.make_tensor("one", T.FLOAT, [1], [1.0])),
        h.make_node("ReduceSum", ["big"], ["total"], keepdims=0),
    ]  # fmt: skip
    graph = h.make_graph(
        nodes,
        "memhog",
        [h.make_tensor_value_info("n", T.INT64, [1])],
        [h.make_tensor_value_info("total", T.FLOAT, [])],
    )
    _save(
        root,
        "memhog",
        h.make_model(graph, opset_imports=[h.make_opsetid("", 17)]),
        [{"name": "n", "datatype": "INT64", "shape": [1]}],
        [{"name": "total", "datatype": "FP32", "shape": []}],
    )


HUGE = 10**13  # 40 TB of floats: the allocation fails at once, nothing is touched


def build_memhog_rows(root: Path, chunk_rows: int = 8, call_rows: int = 32) -> None:
    """`y = float(n)` row by row, after filling max(n) floats with ones and adding
    their sum times zero to every row, so ONNX Runtime must write them all."""
    nodes = [
        h.make_node("ReduceMax", ["n"], ["size"], axes=[0], keepdims=0),
        h.make_node("ConstantOfShape", ["size"], ["big"],
                    value=h.make_tensor("one", T.FLOAT, [1], [1.0])),
        h.make_node("ReduceSum", ["big"], ["total"], keepdims=0),
        h.make_node("Constant", [], ["zero"], value=h.make_tensor("z", T.FLOAT, [], [0.0])),
        h.make_node("Mul", ["total", "zero"], ["nothing"]),
        h.make_node("Cast", ["n"], ["n_float"], to=T.FLOAT),
        h.make_node("Add", ["n_float", "nothing"], ["y"]),
    ]  # fmt: skip
    graph = h.make_graph(
        nodes,
        "memhog-rows",
        [h.make_tensor_value_info("n", T.INT64, [None, 1])],
        [h.make_tensor_value_info("y", T.FLOAT, [None, 1])],
    )
    _save(
        root,
        "memhog-rows",
        h.make_model(graph, opset_imports=[h.make_opsetid("", 17)]),
        [{"name": "n", "datatype": "INT64", "shape": [-1, 1]}],
        [{"name": "y", "datatype": "FP32", "shape": [-1, 1]}],
    )
    card_path = root / "memhog-rows" / "1" / "card.json"
    card = json.loads(card_path.read_text())
    card.update(batching={"max_batch_size": call_rows}, batch_chunk_rows=chunk_rows)
    card_path.write_text(json.dumps(card))


def build_flaky_digits(root: Path, digits_dir: Path, name: str = "digits-flaky") -> Path:
    """The digits model, plus a branch that allocates 10**13 floats when a pixel
    is above 16 (ORT's allocator then fails, as a GPU out of memory does) and
    adds nothing to the outputs otherwise. Replacing its file by digits' own is
    the fix a person deploys: a job that failed on it then succeeds on retry."""
    model = onnx.load(digits_dir / "model.onnx")
    graph = model.graph
    raw = {"probabilities": "probabilities_raw"}
    for node in graph.node:
        node.output[:] = [raw.get(o, o) for o in node.output]
        node.input[:] = [raw.get(i, i) for i in node.input]
    const = [
        numpy_helper.from_array(np.array(16.0, np.float32), "flaky_limit"),
        numpy_helper.from_array(np.array(float(HUGE), np.float32), "flaky_scale"),
        numpy_helper.from_array(np.array([1], np.int64), "flaky_shape"),
    ]
    graph.initializer.extend(const)
    graph.node.extend([
        h.make_node("ReduceMax", ["pixels"], ["flaky_max"], keepdims=0),
        h.make_node("Sub", ["flaky_max", "flaky_limit"], ["flaky_over"]),
        h.make_node("Relu", ["flaky_over"], ["flaky_pos"]),
        h.make_node("Mul", ["flaky_pos", "flaky_scale"], ["flaky_size_f"]),
        h.make_node("Cast", ["flaky_size_f"], ["flaky_size"], to=T.INT64),
        h.make_node("Reshape", ["flaky_size", "flaky_shape"], ["flaky_dims"]),
        h.make_node("ConstantOfShape", ["flaky_dims"], ["flaky_big"],
                    value=h.make_tensor("zero", T.FLOAT, [1], [0.0])),
        h.make_node("ReduceSum", ["flaky_big"], ["flaky_zero"], keepdims=0),
        h.make_node("Add", ["probabilities_raw", "flaky_zero"], ["probabilities"]),
    ])  # fmt: skip
    onnx.checker.check_model(model)
    version_dir = root / name / "1"
    version_dir.mkdir(parents=True, exist_ok=True)
    (version_dir / "model.onnx").write_bytes(model.SerializeToString())
    card = json.loads((digits_dir / "card.json").read_text())
    card.update(max_attempts=6, batch_chunk_rows=4096)
    (version_dir / "card.json").write_text(json.dumps(card))
    return version_dir


def build_slow_rows(root: Path, steps: int = 20000) -> None:
    """`slow` with its step count built in and a batch dimension: a batchable
    model whose every call takes about `steps` * 2 us, for batches to cancel."""
    build_slow(root)
    version_dir = root / "slow" / "1"
    model = onnx.load(version_dir / "model.onnx")
    graph = model.graph
    inputs = [i for i in graph.input if i.name != "steps"]
    del graph.input[:]
    graph.input.extend(inputs)
    graph.initializer.append(numpy_helper.from_array(np.array([steps], np.int64), "steps"))
    target = root / "slow-rows" / "1"
    target.mkdir(parents=True, exist_ok=True)
    (target / "model.onnx").write_bytes(model.SerializeToString())
    card = {
        "description": "test model slow-rows",
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 64]}],
        "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1, 64]}],
        "batching": {"max_batch_size": 64},
        "batch_chunk_rows": 8,
    }
    (target / "card.json").write_text(json.dumps(card))


def user_model(kind: str, folder: Path) -> Path:
    """An .onnx file a user would add (`models add`), as Triton's examples name them:
    `simple` (INT32 INPUT0 and INPUT1 [-1, 16] -> OUTPUT0 their sum, OUTPUT1 their
    difference), `simple_string` (BYTES INPUT0 [-1, 16] -> OUTPUT0 the same strings)
    and `identity` (FP32 INPUT0 [-1, 4] -> OUTPUT0 the same)."""
    if kind == "simple":
        nodes = [h.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"]),
                 h.make_node("Sub", ["INPUT0", "INPUT1"], ["OUTPUT1"])]  # fmt: skip
        ins = [h.make_tensor_value_info(n, T.INT32, [None, 16]) for n in ("INPUT0", "INPUT1")]
        outs = [h.make_tensor_value_info(n, T.INT32, [None, 16]) for n in ("OUTPUT0", "OUTPUT1")]
    elif kind in ("simple_string", "identity"):
        element, width = (T.STRING, 16) if kind == "simple_string" else (T.FLOAT, 4)
        nodes = [h.make_node("Identity", ["INPUT0"], ["OUTPUT0"])]
        ins = [h.make_tensor_value_info("INPUT0", element, [None, width])]
        outs = [h.make_tensor_value_info("OUTPUT0", element, [None, width])]
    else:
        raise ValueError(f"no such test model kind: {kind}")
    model = h.make_model(h.make_graph(nodes, kind, ins, outs),
                         opset_imports=[h.make_opsetid("", 17)])  # fmt: skip
    model.ir_version = 9
    onnx.checker.check_model(model)
    path = folder / f"{kind}.onnx"
    path.write_bytes(model.SerializeToString())
    return path
