"""The chat model's decoder step as an ONNX graph, written with `onnx.helper` from a
llama-architecture GGUF file's tensors (`gguf_file`).

`llama` files permute their query and key weights for interleaved rotary pairs;
`qwen2` files do not (rotate-half pairs) and add biases to Q, K and V.

One call runs any number of new tokens, with the key/value cache as per-layer
inputs and outputs (`past_key_values.<i>.key` and `.value` in, `present.<i>.key`
and `.value` out, [batch, kv_heads, positions, head_size], as ONNX Runtime GenAI
lays them out). Attention is ONNX Runtime's `GroupQueryAttention` (com.microsoft)
with the rotary embedding inside it, rotating interleaved pairs as the GGUF's
permuted query and key weights expect; when the past and present buffers are the
same tensor it appends in place, so a decode step never copies the cache. Its one
other input, `seqlens_k`, gives each row's length so far, so rows of different
lengths decode in one call. The output `logits` is each row's last position's
only: position min(seqlens_k, tokens - 1) of the call's, so fresh prompts of
different lengths, right-padded to the longest, prefill in one call
(GroupQueryAttention masks each row past its length); the model's metadata says
so (`PER_ROW_LAST`), for the decode engine.

Linear weights are stored either as float32 (dequantised), as float16 (`"fp16"`:
the whole graph, for the CUDA provider) or, with `"int4"`, as `MatMulNBits` blocks
of 32 taken straight from the GGUF's Q4_1 or Q4_0 blocks, with no second rounding
(see `_Writer.nbits`; other types are quantised from their float values), and
the output head as 8-bit blocks (a Q8_0 head's own).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from onnx import TensorProto, numpy_helper
from onnx import helper as h

from modelbuild.gguf_file import BLOCK, dequantized, int4_parts, int8_parts

PER_ROW_LAST = "logits_per_row_last"  # the metadata of a graph whose rows may be padded


def llama_graph(
    hyper: dict[str, Any],
    tensors: dict[str, Any],
    weights: str,
    positions: int,
    accuracy: int = 4,
) -> Any:
    """The decoder step as an ONNX model (see the module's docstring). `accuracy` is
    MatMulNBits' accuracy_level: 4 quantises the activations to int8 per block (as
    llama.cpp does for its 4-bit dot products), 0 computes in float32 (exact, and
    about ten times slower here). `weights` "fp16" makes the whole graph float16,
    cache included (ONNX Runtime's CUDA GroupQueryAttention takes float16 and
    bfloat16 only), with the logits cast back to float32."""
    if weights not in ("fp32", "fp16", "int4"):
        raise ValueError(f"weights {weights!r}: fp32, fp16 or int4")
    g = _Writer(hyper, tensors, weights, accuracy)
    embedding = dequantized(tensors["token_embd.weight"])  # [vocab, hidden]
    cos, sin = rotary_caches(hyper, positions)
    g.const("cos_cache", cos)
    g.const("sin_cache", sin)
    x = g.node("Gather", [g.const("embed_tokens.weight", embedding), "input_ids"], "embedded")
    residual: str | None = None
    for i in range(hyper["layers"]):
        x, residual = _decoder_layer(g, i, x, residual)
    assert residual is not None
    _lm_head(g, g.node("Add", [residual, x], "final_sum"), embedding)
    graph_inputs, graph_outputs = _inputs_outputs(hyper, g.float_type)
    graph = h.make_graph(g.nodes, "llama", graph_inputs, graph_outputs, g.init)
    model = h.make_model(
        graph, opset_imports=[h.make_opsetid("", 17), h.make_opsetid("com.microsoft", 1)]
    )
    model.ir_version = 9
    entry = model.metadata_props.add()
    entry.key, entry.value = PER_ROW_LAST, "1"
    return model


def rotary_caches(hyper: dict[str, Any], positions: int) -> tuple[np.ndarray, np.ndarray]:
    """GroupQueryAttention's cos and sin caches, [positions, head_size / 2]."""
    head = hyper["hidden"] // hyper["heads"]
    inv = 1.0 / (hyper["rope_base"] ** (np.arange(0, head, 2, dtype=np.float64) / head))
    angles = np.outer(np.arange(positions, dtype=np.float64), inv)
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


class _Writer:
    """The graph as it is written: its nodes and initializers in order, and how its
    linear layers store their weights (`weights`: fp32, fp16 or int4)."""

    def __init__(
        self, hyper: dict[str, Any], tensors: dict[str, Any], weights: str, accuracy: int
    ) -> None:
        self.hyper, self.tensors, self.weights, self.accuracy = hyper, tensors, weights, accuracy
        self.half = weights == "fp16"
        self.float_type = TensorProto.FLOAT16 if self.half else TensorProto.FLOAT
        self.eps = hyper["eps"]
        self.nodes: list[Any] = []
        self.init: list[Any] = []

    def const(self, name: str, value: np.ndarray) -> str:
        value = np.asarray(value)
        if self.half and value.dtype.kind == "f":
            value = value.astype(np.float16)
        self.init.append(numpy_helper.from_array(value, name))
        return name

    def node(self, op: str, inputs: list[str], outputs: list[str] | str, domain: str = "",
             **attrs: Any) -> str:  # fmt: skip
        outs = [outputs] if isinstance(outputs, str) else outputs
        self.nodes.append(h.make_node(op, inputs, outs, name=outs[0], domain=domain, **attrs))
        return outs[0]

    def norm_weight(self, name: str) -> str:
        return self.const(name, dequantized(self.tensors[name]).reshape(-1))

    def skip_norm(self, residual: str, x: str, weight: str, out: str) -> tuple[str, str]:
        """RMSNorm of residual + x with the named weight: (`out`_norm, `out`_residual),
        the normed sum and the sum itself (the next residual)."""
        outs = [f"{out}_norm", "", "", f"{out}_residual"]
        self.node("SkipSimplifiedLayerNormalization", [residual, x, self.norm_weight(weight)],
                  outs, domain="com.microsoft", epsilon=self.eps)  # fmt: skip
        return outs[0], outs[3]

    def linear(self, x: str, names: list[str], out: str) -> str:
        """x @ W.T for the named [out, in] weights, stacked along out (fused QKV, gate-up)."""
        if self.weights == "int4":
            return self.nbits(x, [int4_parts(self.tensors[n]) for n in names], out)
        matrix = np.concatenate([dequantized(self.tensors[n]) for n in names])
        weight = self.const(f"{out}.weight", np.ascontiguousarray(matrix.T))
        return self.node("MatMul", [x, weight], out)

    def nbits(self, x: str, parts: list[tuple[np.ndarray, ...]], out: str) -> str:
        """MatMulNBits with uint8 zero points (ONNX Runtime's fast int8 kernels take
        those only), plus the exact remainder: each block's zero point is rounded to
        an integer z, and (z - zero_point) * scale, the same for the block's 32
        weights, is added back as (x summed per block) @ remainders."""
        packed = np.concatenate([p[0] for p in parts])
        rows, blocks = packed.shape[0], packed.shape[1]
        scale = np.concatenate([p[1] for p in parts]).reshape(rows, blocks)
        zero = np.concatenate([p[2] for p in parts]).reshape(rows, blocks)
        rounded = np.clip(np.rint(zero), 0, 15)
        z = np.concatenate([rounded, np.zeros((rows, blocks % 2))], axis=1).astype(np.uint8)
        remainder = ((rounded - zero) * scale).astype(np.float32)  # [rows, blocks]
        exact = not remainder.any()  # (integer zero points: nothing to add back)
        main = self.node(
            "MatMulNBits",
            [x, self.const(f"{out}.q", packed), self.const(f"{out}.scales", scale.reshape(-1)),
             self.const(f"{out}.zero_points", (z[:, 0::2] | (z[:, 1::2] << 4)).reshape(-1))],
            out if exact else f"{out}.main", domain="com.microsoft", K=blocks * BLOCK, N=rows,
            bits=4, block_size=BLOCK, accuracy_level=self.accuracy,
        )  # fmt: skip
        if exact:
            return main
        return self.node("Add", [main, self._block_sums_times(x, remainder, out)], out)

    def _block_sums_times(self, x: str, remainder: np.ndarray, out: str) -> str:
        """(x summed over each block of 32 of its last axis) @ remainder.T. x is
        [batch, tokens, in]: a Reshape's 0 keeps those two dimensions, so the shape
        is a constant (not Shape and Concat nodes, a tenth of a step's time)."""
        shape = self.const(f"{out}.shape", np.array([0, 0, remainder.shape[1], BLOCK], np.int64))
        last_axis = self.const(f"{out}.last_axis", np.array([-1], np.int64))
        sums = self.node("ReduceSum", [self.node("Reshape", [x, shape], f"{out}.blocks"),
                                       last_axis], f"{out}.sums", keepdims=0)  # fmt: skip
        correction = self.const(f"{out}.remainder", np.ascontiguousarray(remainder.T))
        return self.node("MatMul", [sums, correction], f"{out}.correction")


def _decoder_layer(g: _Writer, i: int, x: str, residual: str | None) -> tuple[str, str]:
    """Layer i over x (the last layer's output) and the residual stream before it:
    (this layer's output, the residual stream before it). The first layer normalises
    the embeddings; each other layer adds its input to the residual stream first."""
    b = f"blk.{i}"
    if residual is None:
        normed = g.node("SimplifiedLayerNormalization", [x, g.norm_weight(f"{b}.attn_norm.weight")],
                        f"l{i}.attn_norm", axis=-1, epsilon=g.eps)  # fmt: skip
        residual = x
    else:
        normed, residual = g.skip_norm(residual, x, f"{b}.attn_norm.weight", f"l{i}.attn")
    x = _attention(g, i, normed)
    normed, residual = g.skip_norm(residual, x, f"{b}.ffn_norm.weight", f"l{i}.ffn")
    return _mlp(g, i, normed), residual


def _attention(g: _Writer, i: int, normed: str) -> str:
    """Layer i's attention: fused QKV, GroupQueryAttention over the cache (rotary
    inside), the output projection."""
    b, hyper = f"blk.{i}", g.hyper
    qkv = g.linear(normed, [f"{b}.attn_q.weight", f"{b}.attn_k.weight", f"{b}.attn_v.weight"],
                   f"l{i}.qkv")  # fmt: skip
    if f"{b}.attn_q.bias" in g.tensors:  # (qwen2)
        bias = np.concatenate([dequantized(g.tensors[f"{b}.attn_{k}.bias"]).reshape(-1)
                               for k in "qkv"])  # fmt: skip
        qkv = g.node("Add", [qkv, g.const(f"l{i}.qkv.bias", bias)], f"l{i}.qkv_biased")
    attn_outs = [f"l{i}.attn", f"present.{i}.key", f"present.{i}.value"]
    g.node(
        "GroupQueryAttention",
        [qkv, "", "", f"past_key_values.{i}.key", f"past_key_values.{i}.value", "seqlens_k",
         "total_sequence_length", "cos_cache", "sin_cache"],
        attn_outs, domain="com.microsoft", num_heads=hyper["heads"],
        kv_num_heads=hyper["kv_heads"], do_rotary=1,
        rotary_interleaved=int(hyper.get("arch", "llama") == "llama"),
        scale=float(1 / np.sqrt(hyper["hidden"] // hyper["heads"])),
    )  # fmt: skip
    return g.linear(attn_outs[0], [f"{b}.attn_output.weight"], f"l{i}.o_proj")


def _mlp(g: _Writer, i: int, normed: str) -> str:
    """Layer i's SwiGLU feed-forward block: fused gate-up, SiLU(gate) * up, down."""
    b = f"blk.{i}"
    gate_up = g.linear(normed, [f"{b}.ffn_gate.weight", f"{b}.ffn_up.weight"], f"l{i}.gate_up")
    gate, up = f"l{i}.gate", f"l{i}.up"
    g.node("Split", [gate_up, g.const(f"l{i}.split", np.array([g.hyper["ffn"]] * 2, np.int64))],
           [gate, up], axis=-1)  # fmt: skip
    silu = g.node("Mul", [gate, g.node("Sigmoid", [gate], f"l{i}.sigmoid")], f"l{i}.silu")
    return g.linear(g.node("Mul", [silu, up], f"l{i}.act"), [f"{b}.ffn_down.weight"], f"l{i}.down")


def _lm_head(g: _Writer, total: str, embedding: np.ndarray) -> None:
    """The last position of the residual stream `total`, normed, times the output
    head (the file's `output.weight`, or the embedding where they are tied):
    `logits` (float32 whatever the graph's float type)."""
    head_name = "output.weight" if "output.weight" in g.tensors else "token_embd.weight"
    # Each row's last real position: min(seqlens_k, tokens - 1). (Its length so far
    # less one is the chunk's end for a decode step, a chunk after a past, or an
    # unpadded prompt; a shorter right-padded prompt's own end.)
    tokens = g.node(
        "Gather",
        [
            g.node("Shape", ["input_ids"], "ids_shape"),
            g.const("tokens_axis", np.array(1, np.int64)),
        ],
        "tokens",
    )
    end = g.node("Sub", [tokens, g.const("one", np.array(1, np.int64))], "tokens_end")
    lengths = g.node("Cast", ["seqlens_k"], "seqlens_k64", to=TensorProto.INT64)
    rows_last = g.node("Min", [lengths, end], "rows_last")
    index = g.node("Unsqueeze", [rows_last, g.const("row_axis", np.array([1], np.int64))],
                   "rows_last_index")  # fmt: skip
    last = g.node("GatherND", [total, index], "last_hidden", batch_dims=1)
    normed = g.node("SimplifiedLayerNormalization", [last, g.norm_weight("output_norm.weight")],
                    "final_norm", axis=-1, epsilon=g.eps)  # fmt: skip
    if g.weights == "int4":  # in 8-bit blocks (a Q8_0 head's own)
        values, scales = int8_parts(g.tensors[head_name])
        rows, blocks = values.shape[0], values.shape[1]
        g.node("MatMulNBits", [normed, g.const("lm_head.q", values),
               g.const("lm_head.scales", scales),
               g.const("lm_head.zero_points", np.full(rows * blocks, 128, np.uint8))], "logits",
               domain="com.microsoft", K=blocks * BLOCK, N=rows, bits=8, block_size=BLOCK,
               accuracy_level=g.accuracy)  # fmt: skip
    else:  # transposed once at build time
        head_out = "logits.half" if g.half else "logits"
        head = embedding if head_name == "token_embd.weight" else dequantized(g.tensors[head_name])
        g.node("MatMul", [normed, g.const("lm_head.weight", np.ascontiguousarray(head.T))],
               head_out)  # fmt: skip
        if g.half:
            g.node("Cast", [head_out], "logits", to=TensorProto.FLOAT)


def _inputs_outputs(hyper: dict[str, Any], float_type: int) -> tuple[list[Any], list[Any]]:
    """The graph's inputs (token ids, each row's length so far, the total length, the
    past cache) and outputs (the logits, the present cache)."""
    head = hyper["hidden"] // hyper["heads"]
    cache = ["batch", hyper["kv_heads"], "positions", head]
    graph_inputs = [
        h.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "tokens"]),
        h.make_tensor_value_info("seqlens_k", TensorProto.INT32, ["batch"]),
        h.make_tensor_value_info("total_sequence_length", TensorProto.INT32, []),
    ]
    graph_outputs = [
        h.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", hyper["vocab"]])
    ]
    for i in range(hyper["layers"]):
        for kind in ("key", "value"):
            graph_inputs.append(
                h.make_tensor_value_info(f"past_key_values.{i}.{kind}", float_type, cache)
            )
            graph_outputs.append(h.make_tensor_value_info(f"present.{i}.{kind}", float_type, cache))
    return graph_inputs, graph_outputs
