"""The decode engine against a plain ONNX Runtime loop, in one process, on one provider.

`python -m bench.generation_engine --provider cuda --gguf FILE --weights fp16`
builds the chat model's graph from the GGUF (as `models build` does), then runs
the worker's decode engine (app.runtime.decode: continuous batching, the cache
kept where the provider computes) with 1, 4 and 16 sequences started together,
and the raw loop (prefill, then one call a token, the cache bound in place)
with one prompt alone and the 16 prompts as one static batch. Every sequence
makes exactly MAX_TOKENS tokens, greedy. This is how the CUDA path is measured
where the whole service cannot run (a GPU machine with no PostgreSQL or Redis);
the service's own benchmark (bench.generation) adds the doors on top of this.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from bench.generation import MAX_TOKENS, PROMPTS, SLOTS

CHECK = "The capital of France is"  # greedy: " Paris."
ENGINES: dict[int, Any] = {}


def build(gguf: Path, weights: str, out: Path) -> tuple[Path, Path, dict[str, Any]]:
    """(model.onnx, tokenizer.json, hyper-parameters) written under `out`."""
    import onnx

    from modelbuild.gguf_file import read_gguf, tokenizer_json
    from modelbuild.llama_graph import llama_graph

    hyper, tensors, tokenizer = read_gguf(gguf)
    model = llama_graph(hyper, tensors, weights, int(hyper["context"]))
    onnx.save_model(model, str(out / "model.onnx"), save_as_external_data=True,
                    location="model.onnx.data")  # fmt: skip
    (out / "tokenizer.json").write_text(tokenizer_json(tokenizer))
    return out / "model.onnx", out / "tokenizer.json", hyper


def session(path: Path, provider: str, threads: int) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    providers = ["CUDAExecutionProvider", "CPUExecutionProvider"] if provider == "cuda" else [
        "CPUExecutionProvider"]  # fmt: skip
    made = ort.InferenceSession(str(path), options, providers=providers)
    if made.get_providers()[0] != providers[0]:
        raise SystemExit(f"{providers[0]} did not start: {made.get_providers()}")
    return made


def chat_ids(tokenizer: Any, text: str) -> list[int]:
    """ChatML with the card's default system message, control tokens by id."""
    system = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
    newline = tokenizer.encode("\n").ids
    ids = [1, *tokenizer.encode("system\n" + system).ids, 2, *newline]
    ids += [1, *tokenizer.encode("user\n" + text).ids, 2, *newline]
    return [*ids, 1, *tokenizer.encode("assistant\n").ids]


def engine_level(made: ort.InferenceSession, prompts: list[list[int]], context: int
                 ) -> dict[str, Any]:  # fmt: skip
    from app.runtime.decode import DecodeEngine, Sequence
    from app.runtime.sampling import Sampling

    if id(made) not in ENGINES:  # one per session, kept, as a worker keeps its engine
        ENGINES[id(made)] = DecodeEngine(made, slots=SLOTS, context=context, stop_tokens=())
    engine = ENGINES[id(made)]
    steps = engine.steps
    greedy = Sampling(max_tokens=MAX_TOKENS, temperature=0)
    sequences = [Sequence(key=i, prompt=p, sampling=greedy) for i, p in enumerate(prompts)]
    first: dict[int, float] = {}
    started = time.perf_counter()
    for sequence in sequences:
        engine.add(sequence)
    while engine.busy:
        for emitted in engine.step():
            first.setdefault(emitted.sequence.key, time.perf_counter() - started)
    wall = time.perf_counter() - started
    tokens = sum(len(s.generated) for s in sequences)
    ttft = sorted(first.values())
    return {
        "streams": len(prompts),
        "tokens_per_s": round(tokens / wall, 1),
        "ttft_p50_ms": round(statistics.median(ttft) * 1000, 1),
        "ttft_max_ms": round(ttft[-1] * 1000, 1),
        "itl_ms": round((wall - statistics.median(ttft)) / (MAX_TOKENS - 1) * 1000, 2),
        "decode_steps": engine.steps - steps,
        "tokens": [s.generated for s in sequences],
    }


def median_run(runs: list[tuple[float, float, int, list[list[int]]]]
               ) -> tuple[float, float, int, list[list[int]]]:  # fmt: skip
    return sorted(runs, key=lambda r: r[1])[len(runs) // 2]


def median_level(levels: list[dict[str, Any]]) -> dict[str, Any]:
    return sorted(levels, key=lambda r: r["tokens_per_s"])[len(levels) // 2]


def raw_loop(made: ort.InferenceSession, prompts: list[list[int]], provider: str
             ) -> tuple[float, float, int, list[list[int]]]:  # fmt: skip
    """(prefill s, total s, tokens, tokens per prompt): one cache buffer per input
    for the whole batch, rows bound by address, on the provider's device."""
    inputs = [i for i in made.get_inputs() if i.name.startswith("past_key_values.")]
    dtype = np.float16 if inputs[0].type == "tensor(float16)" else np.float32
    kv, head = int(inputs[0].shape[1]), int(inputs[0].shape[3])
    positions = max(len(p) for p in prompts) + MAX_TOKENS + 1
    device = "cuda" if provider == "cuda" else "cpu"
    values = [ort.OrtValue.ortvalue_from_shape_and_type([len(prompts), kv, positions, head],
              dtype, device, 0) for _ in inputs]  # fmt: skip
    row_bytes = kv * positions * head * np.dtype(dtype).itemsize

    def call(first: int, rows: int, ids: list[list[int]], past: list[int]) -> np.ndarray:
        binding = made.io_binding()
        binding.bind_output("logits")
        width = len(ids[0])
        binding.bind_cpu_input("input_ids", np.array(ids, np.int64))
        binding.bind_cpu_input("seqlens_k", np.array([p + width - 1 for p in past], np.int32))
        binding.bind_cpu_input("total_sequence_length", np.array(max(past) + width, np.int32))
        shape = [rows, kv, positions, head]
        for spec, value in zip(inputs, values, strict=True):
            pointer = int(value.data_ptr()) + first * row_bytes
            binding.bind_input(spec.name, device, 0, dtype, shape, pointer)
            binding.bind_output(spec.name.replace("past_key_values.", "present."), device, 0,
                                dtype, shape, pointer)  # fmt: skip
        made.run_with_iobinding(binding)
        logits: np.ndarray = binding.get_outputs()[0].numpy()
        return logits

    started = time.perf_counter()
    last = [int(call(row, 1, [ids], [0])[0].argmax()) for row, ids in enumerate(prompts)]
    prefill = time.perf_counter() - started
    made_tokens = [[t] for t in last]
    lengths = [len(p) for p in prompts]
    for _ in range(MAX_TOKENS - 1):
        logits = call(0, len(prompts), [[t] for t in last], lengths)
        last = [int(row.argmax()) for row in logits]
        for tokens, token in zip(made_tokens, last, strict=True):
            tokens.append(token)
        lengths = [n + 1 for n in lengths]
    return prefill, time.perf_counter() - started, MAX_TOKENS * len(prompts), made_tokens


def run(args: argparse.Namespace) -> dict[str, Any]:
    from tokenizers import Tokenizer

    work = Path(args.work or tempfile.mkdtemp())
    work.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    model, tokenizer_path, hyper = build(Path(args.gguf), args.weights, work)
    built_s = round(time.perf_counter() - started, 1)
    made = session(model, args.provider, args.threads)
    tokenizer = Tokenizer.from_file(str(tokenizer_path))
    prompts = [chat_ids(tokenizer, p) for p in PROMPTS]
    context = int(hyper["context"])
    data: dict[str, Any] = {"provider": made.get_providers()[0], "weights": args.weights,
                            "ort": ort.__version__, "build_s": built_s}  # fmt: skip

    check = engine_level(made, [tokenizer.encode(CHECK).ids], context)  # also warms up
    data["check"] = tokenizer.decode(check["tokens"][0][:3])
    raw_loop(made, prompts[:2], args.provider)  # warm-up
    raw_loop(made, prompts[:SLOTS], args.provider)
    # Raw and engine runs alternate, and the medians are compared: one stream on
    # a GPU is bound by kernel launches, and its speed drifts between runs.
    ones = [(raw_loop(made, prompts[:1], args.provider), engine_level(made, prompts[:1], context))
            for _ in range(args.repeat)]  # fmt: skip
    sixteens = [(raw_loop(made, prompts[:SLOTS], args.provider),
                 engine_level(made, prompts[:SLOTS], context))
                for _ in range(args.repeat)]  # fmt: skip
    prefill, total, tokens, raw_one = median_run([raw for raw, _ in ones])
    data["raw_batch1"] = {
        "tokens_per_s": round(tokens / total, 1),
        "prefill_ms": round(prefill * 1000, 1),
        "itl_ms": round((total - prefill) / (MAX_TOKENS - 1) * 1000, 2),
    }
    prefill, total, tokens, raw_static = median_run([raw for raw, _ in sixteens])
    data["raw_static16"] = {"tokens_per_s": round(tokens / total, 1),
                            "prefill_ms": round(prefill * 1000, 1)}  # fmt: skip
    four = [engine_level(made, prompts[:4], context) for _ in range(args.repeat)]
    levels = [median_level([e for _, e in ones]), median_level(four),
              median_level([e for _, e in sixteens])]  # fmt: skip
    data["engine"] = [{k: v for k, v in level.items() if k != "tokens"} for level in levels]
    same = [a == b for a, b in zip(levels[2]["tokens"], raw_static, strict=True)]
    data["engine16_equals_raw_static16"] = f"{sum(same)}/{len(same)} sequences token for token"
    data["engine1_equals_raw_batch1"] = levels[0]["tokens"][0] == raw_one[0]
    s1, s16, one, static = levels[0], levels[2], data["raw_batch1"], data["raw_static16"]
    data["ratios"] = {
        "engine 16 vs raw static 16": round(s16["tokens_per_s"] / static["tokens_per_s"], 2),
        "engine 1 vs raw batch 1": round(s1["tokens_per_s"] / one["tokens_per_s"], 2),
        "engine 1 TTFT minus raw prefill (ms)": round(s1["ttft_p50_ms"] - one["prefill_ms"], 1),
    }
    data["profile_16"] = profile(model, args.provider, args.threads, prompts[:SLOTS], context)
    if args.reference:  # the same prompt's logits on this graph against the float32 CPU graph
        data["logits_vs_cpu_fp32"] = compare(made, work, Path(args.gguf), tokenizer)
    return data


def profile(model: Path, provider: str, threads: int, prompts: list[list[int]], context: int
            ) -> dict[str, Any]:  # fmt: skip
    """Where a decode step of 16 sequences goes: ONNX Runtime's own profile of the
    graph's nodes (summed by operator), the whole run call, and the step's wall
    time; the rest of a step is the engine's Python (binding, sampling)."""
    from app.runtime.decode import DecodeEngine, Sequence
    from app.runtime.sampling import Sampling

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.enable_profiling = True
    options.profile_file_prefix = str(model.parent / "profile")
    providers = ["CUDAExecutionProvider", "CPUExecutionProvider"] if provider == "cuda" else [
        "CPUExecutionProvider"]  # fmt: skip
    made = ort.InferenceSession(str(model), options, providers=providers)
    engine = DecodeEngine(made, slots=SLOTS, context=context, stop_tokens=())
    for i, prompt in enumerate(prompts):
        engine.add(Sequence(i, prompt, Sampling(max_tokens=MAX_TOKENS, temperature=0)))
    while engine.waiting:
        engine.step()
    for _ in range(8):  # warm
        engine.decode()
    steps, started = 32, time.perf_counter()
    for _ in range(steps):
        engine.decode()
    wall = (time.perf_counter() - started) / steps
    events = json.loads(Path(made.end_profiling()).read_text())
    runs = [e for e in events if e.get("cat") == "Session" and e.get("name") == "model_run"]
    window = (runs[-steps]["ts"], runs[-1]["ts"] + runs[-1]["dur"])  # the measured calls
    run_us = sum(e["dur"] for e in runs[-steps:])
    by_op: dict[str, float] = {}
    for event in events:
        if (event.get("cat") == "Node" and event["name"].endswith("_kernel_time")
                and window[0] <= event["ts"] <= window[1]):  # fmt: skip
            op = event.get("args", {}).get("op_name", "?")
            by_op[op] = by_op.get(op, 0.0) + event["dur"]
    top = sorted(by_op.items(), key=lambda kv: -kv[1])[:8]
    return {
        "sequences": len(prompts),
        "step_wall_ms": round(wall * 1000, 2),
        "run_call_ms": round(run_us / steps / 1000, 2),
        "kernels_ms": round(sum(by_op.values()) / steps / 1000, 2),
        "by_operator_ms": {op: round(us / steps / 1000, 3) for op, us in top},
    }


def compare(made: ort.InferenceSession, work: Path, gguf: Path, tokenizer: Any) -> dict[str, Any]:
    reference_dir = work / "fp32"
    reference_dir.mkdir(exist_ok=True)
    model, _, _ = build(gguf, "fp32", reference_dir)
    reference = session(model, "cpu", 4)
    ids = tokenizer.encode(CHECK).ids
    found = []
    for which in (made, reference):
        from app.runtime.decode import DecodeEngine

        engine = DecodeEngine(which, slots=1, context=512, stop_tokens=())
        logits = engine._run(0, 1, np.array([ids], np.int64), np.array([0], np.int32))
        found.append(logits[0].astype(np.float64))
    diff = np.abs(found[0] - found[1])
    return {"max_abs": round(float(diff.max()), 4), "logit_std": round(float(found[1].std()), 3),
            "same_argmax": int(found[0].argmax()) == int(found[1].argmax())}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gguf", required=True)
    parser.add_argument("--weights", default="fp32", choices=("fp32", "fp16", "int4"))
    parser.add_argument("--provider", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--work", default="")
    parser.add_argument(
        "--reference",
        action="store_true",
        help="also compare logits with the float32 graph on the CPU",
    )
    parser.add_argument("--repeat", type=int, default=5, help="runs of each, medians compared")
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    data = run(args)
    text = json.dumps(data, indent=2)
    print(text, flush=True)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
