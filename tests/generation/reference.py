"""A plain numpy forward pass of the llama-family model in a GGUF file, written the
way Hugging Face's LlamaForCausalLM and Qwen2ForCausalLM compute it (a llama
file's query and key weights un-permuted back to their original layout, qwen2's
Q/K/V biases, rotate-half RoPE, full causal attention, no cache), as the
independent reference the ONNX graph is checked against."""

from __future__ import annotations

from typing import Any

import numpy as np

from modelbuild.gguf_file import dequantized, read_gguf

# The fixed prompts the graph is checked on against this reference (and on a GPU).
PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, there was a",
    "The three primary colors are",
    "Water boils at a temperature of",
]


class Reference:
    def __init__(self, path: Any) -> None:
        self.hyper, tensors, _ = read_gguf(path)
        self.w = {name: dequantized(t) for name, t in tensors.items()}
        heads, kv_heads = self.hyper["heads"], self.hyper["kv_heads"]
        self.head = self.w.get("output.weight", self.w["token_embd.weight"])  # (else tied)
        if self.hyper.get("arch", "llama") != "llama":
            return  # qwen2 files keep Hugging Face's layout
        for i in range(self.hyper["layers"]):
            for kind, n in (("q", heads), ("k", kv_heads)):
                name = f"blk.{i}.attn_{kind}.weight"
                self.w[name] = _unpermute(self.w[name], n)

    def logits(self, ids: list[int]) -> np.ndarray:
        """The next token's logits after `ids` (float64 throughout)."""
        h = self.hyper
        heads, kv_heads = h["heads"], h["kv_heads"]
        head = h["hidden"] // heads
        w = self.w
        x = w["token_embd.weight"][ids].astype(np.float64)
        n = len(ids)
        inv = 1.0 / (h["rope_base"] ** (np.arange(0, head, 2) / head))
        angles = np.outer(np.arange(n), inv)
        cos, sin = (
            np.cos(np.concatenate([angles] * 2, -1)),
            np.sin(np.concatenate([angles] * 2, -1)),
        )
        mask = np.triu(np.full((n, n), -np.inf), 1)
        for i in range(h["layers"]):
            b = f"blk.{i}"
            a = _rms(x, w[f"{b}.attn_norm.weight"], h["eps"])
            q, k, v = (a @ w[f"{b}.attn_{kind}.weight"].T + w.get(f"{b}.attn_{kind}.bias", 0)
                       for kind in "qkv")  # fmt: skip
            q = q.reshape(n, heads, head).transpose(1, 0, 2)
            k = k.reshape(n, kv_heads, head).transpose(1, 0, 2)
            v = v.reshape(n, kv_heads, head).transpose(1, 0, 2)
            q, k = _rope(q, cos, sin), _rope(k, cos, sin)
            k, v = np.repeat(k, heads // kv_heads, 0), np.repeat(v, heads // kv_heads, 0)
            scores = q @ k.transpose(0, 2, 1) / np.sqrt(head) + mask
            probs = np.exp(scores - scores.max(-1, keepdims=True))
            probs /= probs.sum(-1, keepdims=True)
            out = (probs @ v).transpose(1, 0, 2).reshape(n, heads * head)
            x = x + out @ w[f"{b}.attn_output.weight"].T
            f = _rms(x, w[f"{b}.ffn_norm.weight"], h["eps"])
            gate, up = f @ w[f"{b}.ffn_gate.weight"].T, f @ w[f"{b}.ffn_up.weight"].T
            x = x + (gate / (1 + np.exp(-gate)) * up) @ w[f"{b}.ffn_down.weight"].T
        last = _rms(x[-1:], w["output_norm.weight"], h["eps"])
        result: np.ndarray = (last @ self.head.T)[0]
        return result

    def greedy(self, ids: list[int], count: int, stop: set[int]) -> list[int]:
        out: list[int] = []
        for _ in range(count):
            token = int(np.argmax(self.logits(ids + out)))
            if token in stop:
                break
            out.append(token)
        return out


def _unpermute(weight: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's converter interleaved each head's two rotary halves; undo it."""
    rows, cols = weight.shape
    return weight.reshape(heads, rows // heads // 2, 2, cols).swapaxes(1, 2).reshape(rows, cols)


def _rms(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * weight


def _rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    half = x.shape[-1] // 2
    rotated = np.concatenate([-x[..., half:], x[..., :half]], -1)
    return x * cos + rotated * sin
