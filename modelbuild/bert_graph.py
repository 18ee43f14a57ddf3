"""BertModel's forward pass as an ONNX graph (post-LayerNorm, exact GELU, absolute
positions) in opset 17 operators, written with `onnx.helper` from the weights as
numpy arrays; linear weights are stored transposed for MatMul."""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
from onnx import TensorProto, numpy_helper
from onnx import helper as h


class _Writer:
    """The graph as it is written: its nodes in order, its initializers by name."""

    def __init__(self, weights: dict[str, Any], eps: float) -> None:
        self.weights, self.eps = weights, eps
        self.nodes: list[Any] = []
        self.init: dict[str, Any] = {}

    def const(self, name: str, value: Any) -> str:
        self.init[name] = numpy_helper.from_array(np.asarray(value), name)
        return name

    def param(self, key: str, transpose: bool = False) -> str:
        value = self.weights[key].astype(np.float32)
        return self.const(key, np.ascontiguousarray(value.T) if transpose else value)

    def node(self, op: str, inputs: list[str], output: str, **attrs: Any) -> str:
        self.nodes.append(h.make_node(op, inputs, [output], name=output, **attrs))
        return output

    def linear(self, x: str, prefix: str, out: str) -> str:
        weight = self.param(f"{prefix}.weight", transpose=True)
        product = self.node("MatMul", [x, weight], f"{out}.matmul")
        return self.node("Add", [product, self.param(f"{prefix}.bias")], out)

    def layer_norm(self, x: str, prefix: str, out: str) -> str:
        scale, bias = self.param(f"{prefix}.weight"), self.param(f"{prefix}.bias")
        return self.node("LayerNormalization", [x, scale, bias], out, axis=-1, epsilon=self.eps)


class _Shared(NamedTuple):
    """The constants every encoder layer uses, by initializer name."""

    split: str  # [batch, tokens, hidden] to [batch, tokens, heads, head_dim]
    merge: str  # and back
    scale: str  # 1 / sqrt(head_dim), on the attention scores
    sqrt_half: str  # GELU's 1 / sqrt(2), 0.5 and 1
    half: str
    one: str


def bert_graph(config: dict[str, Any], weights: dict[str, Any]) -> Any:
    """The encoder for `config` (the model's config.json) and its `weights` (by
    safetensors key): token ids, attention mask and token types in, the last hidden
    state out."""
    hidden, heads = int(config["hidden_size"]), int(config["num_attention_heads"])
    eps = float(config["layer_norm_eps"])
    if config.get("hidden_act") != "gelu" or config.get("position_embedding_type", "absolute") != (
        "absolute"
    ):
        raise ValueError("bert builder: only GELU and absolute position embeddings are supported")
    g = _Writer(weights, eps)
    x = _embeddings(g)
    mask_bias = _mask_bias(g)
    shared = _shared(g, hidden, heads)
    for i in range(int(config["num_hidden_layers"])):
        x = _feed_forward(g, i, _attention(g, i, x, mask_bias, shared), shared)
    g.nodes.append(h.make_node("Identity", [x], ["last_hidden_state"], name="last_hidden_state"))

    ids = [h.make_tensor_value_info(name, TensorProto.INT64, ["batch", "tokens"])
           for name in ("input_ids", "attention_mask", "token_type_ids")]  # fmt: skip
    out = h.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT,
                                   ["batch", "tokens", hidden])  # fmt: skip
    graph = h.make_graph(g.nodes, "bert", ids, [out], list(g.init.values()))
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    model.ir_version = 9
    return model


def _embeddings(g: _Writer) -> str:
    """Word + position (0..T-1) + token type, then LayerNorm."""
    length = g.node("Shape", ["input_ids"], "seq_len", start=1, end=2)
    positions = g.node("Range", [g.const("zero", np.int64(0)),
                                 g.node("Squeeze", [length], "seq_len_scalar"),
                                 g.const("one", np.int64(1))], "position_ids")  # fmt: skip
    summed = g.node("Add", [
        g.node("Add", [
            g.node("Gather", [g.param("embeddings.word_embeddings.weight"), "input_ids"], "words"),
            g.node("Gather", [g.param("embeddings.token_type_embeddings.weight"),
                              "token_type_ids"], "types"),
        ], "words_types"),
        g.node("Gather", [g.param("embeddings.position_embeddings.weight"), positions],
               "positions"),
    ], "embedded")  # fmt: skip
    return g.layer_norm(summed, "embeddings.LayerNorm", "embeddings")


def _mask_bias(g: _Writer) -> str:
    """Padding is masked out of attention: (1 - mask) * -10000 added to the scores
    (exp of it is 0 in float32, so padded rows leave real tokens' outputs alone)."""
    mask = g.node("Cast", ["attention_mask"], "mask_float", to=TensorProto.FLOAT)
    inverted = g.node("Sub", [g.const("one_f", np.float32(1)), mask], "mask_inverted")
    bias = g.node("Mul", [inverted, g.const("neg_large", np.float32(-10000))], "mask_bias_2d")
    return g.node("Unsqueeze", [bias, g.const("axes_1_2", np.array([1, 2], np.int64))],
                  "mask_bias")  # fmt: skip


def _shared(g: _Writer, hidden: int, heads: int) -> _Shared:
    head_dim = hidden // heads
    return _Shared(
        split=g.const("split_heads", np.array([0, 0, heads, head_dim], np.int64)),
        merge=g.const("merge_heads", np.array([0, 0, hidden], np.int64)),
        scale=g.const("scale", np.float32(1 / np.sqrt(head_dim))),
        sqrt_half=g.const("sqrt_half", np.float32(np.sqrt(0.5))),
        half=g.const("half", np.float32(0.5)),
        one=g.const("one_f1", np.float32(1)),
    )


def _heads(g: _Writer, x: str, i: int, kind: str, perm: list[int], split: str) -> str:
    """Layer i's query, key or value projection, split into heads and transposed."""
    n = f"layer{i}"
    projected = g.linear(x, f"encoder.layer.{i}.attention.self.{kind}", f"{n}.{kind}")
    shaped = g.node("Reshape", [projected, split], f"{n}.{kind}.heads")
    return g.node("Transpose", [shaped], f"{n}.{kind}.t", perm=perm)


def _attention(g: _Writer, i: int, x: str, mask_bias: str, k: _Shared) -> str:
    """Layer i's self-attention, its output projection, residual and LayerNorm."""
    p, n = f"encoder.layer.{i}", f"layer{i}"
    q = _heads(g, x, i, "query", [0, 2, 1, 3], k.split)
    key = _heads(g, x, i, "key", [0, 2, 3, 1], k.split)  # already transposed for Q @ K
    v = _heads(g, x, i, "value", [0, 2, 1, 3], k.split)
    scores = g.node("Mul", [g.node("MatMul", [q, key], f"{n}.qk"), k.scale], f"{n}.scores")
    probs = g.node("Softmax", [g.node("Add", [scores, mask_bias], f"{n}.masked")],
                   f"{n}.probs", axis=-1)  # fmt: skip
    context = g.node("Transpose", [g.node("MatMul", [probs, v], f"{n}.ctx")], f"{n}.ctx.t",
                     perm=[0, 2, 1, 3])  # fmt: skip
    context = g.node("Reshape", [context, k.merge], f"{n}.context")
    attended = g.linear(context, f"{p}.attention.output.dense", f"{n}.attn_out")
    return g.layer_norm(g.node("Add", [attended, x], f"{n}.attn_res"),
                        f"{p}.attention.output.LayerNorm", f"{n}.attn_norm")  # fmt: skip


def _feed_forward(g: _Writer, i: int, x: str, k: _Shared) -> str:
    """Layer i's feed-forward block (exact GELU), residual and LayerNorm."""
    p, n = f"encoder.layer.{i}", f"layer{i}"
    up = g.linear(x, f"{p}.intermediate.dense", f"{n}.up")
    erf = g.node("Erf", [g.node("Mul", [up, k.sqrt_half], f"{n}.up_scaled")], f"{n}.erf")
    gelu = g.node("Mul", [g.node("Mul", [up, k.half], f"{n}.up_half"),
                          g.node("Add", [erf, k.one], f"{n}.erf1")], f"{n}.gelu")  # fmt: skip
    down = g.linear(gelu, f"{p}.output.dense", f"{n}.down")
    return g.layer_norm(g.node("Add", [down, x], f"{n}.ffn_res"), f"{p}.output.LayerNorm",
                        f"{n}.out")  # fmt: skip
