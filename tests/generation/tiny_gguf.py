"""Tiny GGUF files of the llama family, written with `gguf`'s writer: random weights
(seeded) in a chosen tensor type, a byte-level BPE vocabulary of 288 tokens with
ChatML's and Llama 3's control tokens, two layers. For the own-GGUF tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

CHATML = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a tiny test model.<|im_end|>\\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
# Llama 3 Instruct's own template (it trims each message and writes the BOS itself).
LLAMA3 = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] "
    "| trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}"
    "{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)
LLAMA3_TOKENS = ("<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>")
# Mistral's first template (no system role: it raises), over SentencePiece pieces.
MISTRAL = (
    "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != "
    "(loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate "
    "user/assistant/user/assistant/...') }}{% endif %}{% if message['role'] == 'user' %}"
    "{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}"
    "{{ message['content'] + eos_token }}{% endif %}{% endfor %}"
)
# SentencePiece pieces after <unk>, <s>, </s> and the 256 byte tokens, best first.
SPM_PIECES = ("\u2581the", "\u2581t", "he", "\u2581[", "INST", "IN", "ST", "\u2581a", "re",
              "\u2581are", "\u2581", "t", "h", "e", "a", "r", "s", "I", "N", "S", "T", "[", "]",
              "/", "\u2581h")  # fmt: skip
HIDDEN, HEADS, KV_HEADS, FFN, LAYERS, VOCAB, CONTEXT = 64, 4, 2, 128, 2, 288, 256
K_QUANTS = ("Q4_K", "Q5_K", "Q6_K")
# Where a K-quant block keeps its float16 scale (and its minimums' scale).
_K_SCALES = {"Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}


def _byte_tokens() -> list[str]:
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]  # fmt: skip
    chars, extra = [], 0
    for byte in range(256):
        if byte in printable:
            chars.append(chr(byte))
        else:
            chars.append(chr(256 + extra))
            extra += 1
    return chars


def write_tiny(path: Path, arch: str = "llama", kind: str = "F32", seed: int = 0,
               tied: bool = True, template: str = CHATML, bos: str = "<|im_start|>",
               add_bos: bool = False, sentencepiece: bool = False) -> Path:  # fmt: skip
    """A GGUF file at `path`: `arch` (llama, qwen2, or another to be refused), every
    matrix in `kind` (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, or a K-quant:
    Q4_K, Q5_K, Q6_K, with a hidden size of 256); `template` its
    chat template (none when empty), `bos` its BOS token, asked for with `add_bos`;
    `sentencepiece`: SentencePiece's vocabulary (model `llama`) instead of GPT-2's."""
    import gguf

    rng = np.random.default_rng(seed)
    # K-quants' blocks are 256 wide: their rows must be too.
    hidden, ffn = (256, 512) if kind in K_QUANTS else (HIDDEN, FFN)
    qtype = gguf.GGMLQuantizationType[kind]
    tokens = [*_byte_tokens(), "Ġt", "he", "<|endoftext|>", "<|im_start|>", "<|im_end|>",
              *LLAMA3_TOKENS]  # fmt: skip
    tokens += [f"<|extra_{i}|>" for i in range(VOCAB - len(tokens))]
    types = [3 if t.startswith("<|") else 1 for t in tokens]
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name(f"tiny-{arch}-{kind}")
    writer.add_block_count(LAYERS)
    writer.add_context_length(CONTEXT)
    writer.add_embedding_length(hidden)
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    if sentencepiece:
        tokens, types, scores = _sentencepiece()
        writer.add_tokenizer_model("llama")
        writer.add_token_scores(scores)
        writer.add_unk_token_id(0)
    else:
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre("qwen2" if arch == "qwen2" else "smollm")
        writer.add_token_merges(["Ġ t", "h e"])
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_bos_token_id(tokens.index(bos))
    writer.add_add_bos_token(add_bos)
    writer.add_eos_token_id(tokens.index("</s>" if sentencepiece else "<|im_end|>"))
    if template:
        writer.add_chat_template(template)

    def matrix(name: str, rows: int, columns: int) -> None:
        values = rng.standard_normal((rows, columns)).astype(np.float32) * 0.2
        if kind in K_QUANTS:
            writer.add_tensor(name, k_blocks(rng, qtype, rows, columns), raw_dtype=qtype)
        elif kind == "F32":
            writer.add_tensor(name, values)
        else:
            writer.add_tensor(name, gguf.quants.quantize(values, qtype), raw_dtype=qtype)

    def vector(name: str, size: int, around: float) -> None:
        writer.add_tensor(name, (around + rng.standard_normal(size) * 0.1).astype(np.float32))

    head = hidden // HEADS
    matrix("token_embd.weight", VOCAB, hidden)
    if not tied:
        matrix("output.weight", VOCAB, hidden)
    vector("output_norm.weight", hidden, 1.0)
    for i in range(LAYERS):
        b = f"blk.{i}"
        vector(f"{b}.attn_norm.weight", hidden, 1.0)
        vector(f"{b}.ffn_norm.weight", hidden, 1.0)
        matrix(f"{b}.attn_q.weight", HEADS * head, hidden)
        matrix(f"{b}.attn_k.weight", KV_HEADS * head, hidden)
        matrix(f"{b}.attn_v.weight", KV_HEADS * head, hidden)
        if arch == "qwen2":
            vector(f"{b}.attn_q.bias", HEADS * head, 0.0)
            vector(f"{b}.attn_k.bias", KV_HEADS * head, 0.0)
            vector(f"{b}.attn_v.bias", KV_HEADS * head, 0.0)
        matrix(f"{b}.attn_output.weight", hidden, HEADS * head)
        matrix(f"{b}.ffn_gate.weight", ffn, hidden)
        matrix(f"{b}.ffn_up.weight", ffn, hidden)
        matrix(f"{b}.ffn_down.weight", hidden, ffn)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _sentencepiece() -> tuple[list[str], list[int], list[float]]:
    """(tokens, types, scores): <unk>, <s>, </s>, the bytes, SPM_PIECES, unused."""
    tokens = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256)), *SPM_PIECES]
    types = [2, 3, 3, *[6] * 256, *[1] * len(SPM_PIECES)]
    scores = [0.0, 0.0, 0.0, *[0.0] * 256, *(-float(i) for i in range(len(SPM_PIECES)))]
    unused = VOCAB - len(tokens)
    return ([*tokens, *(f"<unused{i}>" for i in range(unused))], [*types, *[5] * unused],
            [*scores, *[-1e4] * unused])  # fmt: skip


def k_blocks(rng: np.random.Generator, qtype: Any, rows: int, columns: int) -> np.ndarray:
    """Random K-quant blocks (gguf's writer cannot quantise to them): any bytes are a
    valid block once its float16 scales are small finite numbers."""
    import gguf

    block, size = gguf.GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, (rows, columns // block, size), dtype=np.uint8)
    for at in _K_SCALES[qtype.name]:
        scale = rng.uniform(0.002, 0.01, raw.shape[:2]).astype(np.float16)
        raw[:, :, at : at + 2] = scale.view(np.uint8).reshape(*raw.shape[:2], 2)
    return raw.reshape(rows, -1)
