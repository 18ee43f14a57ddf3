"""A prepared GPU check: the service's GPU tests and its CUDA benchmarks, run on a
bare GPU machine that reaches no package index, from parts carried there.

Here, with the package index: `python -m tools.gpu_check pack` downloads the
wheels the check needs for the GPU machine's Python and platform (3.12, manylinux
x86-64 by default; packages its image already holds are left out, `--present`),
the bundled models' weight wheels among them (the machine builds its own graphs,
float16 for CUDA and int4), and cuts one archive of them into parts that each fit
a call that carries files there (`--part-mib`): `.gpu/part-NN`, with their sums.

There, in a copy of this checkout, once every part is in `--stage` (a call each:
`mkdir -p /tmp/gpu-check && cp .gpu/part-NN /tmp/gpu-check/`):
`python3 -m tools.gpu_check run --out DIR` checks the sums, installs the wheels
without an index into the stage, builds the models (`models build --cuda`), and
runs, each step logged with its time and exit status:

- the GPU tests (`pytest -m gpu tests/gpu`; the embedded PostgreSQL and Redis, as
  the tests start them: as root, pgserver runs PostgreSQL as a user of its own);
- the decode engine against raw ONNX Runtime on the provider, float16 and int4
  graphs (`bench.generation_engine`);
- the service's generation benchmark (`manage.py bench --generation --no-llama`),
  its worker and its raw loop on the provider (ORT_PROVIDER);

and writes DIR/gpu-check.md (the steps and their figures), DIR/steps.log and the
benchmarks' own files. `make gpu-check` runs both here, with this machine's
Python and the CPU provider: everything but CUDA, so a lent GPU's minutes go to
measuring.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PARTS = ROOT / ".gpu"
STAGE = Path("/tmp/gpu-check")  # where the GPU machine gathers the parts
# In the GPU machine's image already (its package list): left out of the parts.
PRESENT = ("numpy", "pyarrow", "scipy", "scikit-learn", "joblib", "threadpoolctl")
PLATFORMS = ("manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux_2_24_x86_64",
             "manylinux_2_27_x86_64", "manylinux_2_28_x86_64", "manylinux_2_31_x86_64",
             "manylinux_2_34_x86_64", "manylinux_2_35_x86_64", "any")  # fmt: skip
# What the run needs beyond the service's lock: the builders' and the tests'.
EXTRA = ("requirements-build.txt", "requirements-models.txt")
TEST_TOOLS = ("pytest==9.2.0",)


def pinned(files: tuple[str, ...], present: set[str]) -> list[str]:
    """The `name==version` lines of these requirement files (and those they name
    with -r), less the packages in `present`."""
    lines: list[str] = []
    for name in files:
        for raw in (ROOT / name).read_text().splitlines():
            line = raw.split("#", 1)[0].strip()
            if line.startswith("-r "):
                lines += pinned((line[3:].strip(),), present)
            elif "==" in line:
                package = line.split("==", 1)[0].split("[", 1)[0].strip().lower()
                if package.replace("_", "-") not in present:
                    lines.append(line)
    return sorted(set(lines))


def download(requirements: list[str], into: Path, python: str, deps: bool = False) -> None:
    target = [] if python == _here() else [
        "--only-binary=:all:", "--python-version", python, "--implementation", "cp",
        *[flag for platform in PLATFORMS for flag in ("--platform", platform)]]  # fmt: skip
    with tempfile.NamedTemporaryFile("w", suffix=".txt") as listed:
        listed.write("\n".join(requirements) + "\n")
        listed.flush()
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--dest", str(into),
                        *([] if deps else ["--no-deps"]), *target, "-r", listed.name],
                       check=True)  # fmt: skip


def _here() -> str:
    return f"{sys.version_info.major}.{sys.version_info.minor}"


def pack(python: str, part_mib: int, present: set[str], dest: Path = PARTS) -> list[Path]:
    """The wheels for `python`, as one archive cut into parts of `part_mib` MiB at
    most under `dest` (replacing any there), with SHA256SUMS; the parts."""
    dest.mkdir(parents=True, exist_ok=True)
    for old in dest.glob("part-*"):
        old.unlink()
    with tempfile.TemporaryDirectory() as scratch:
        wheels = Path(scratch) / "wheels"
        wheels.mkdir()
        locked = pinned(("requirements.txt", *EXTRA), present)
        download(locked, wheels, python)
        download(list(TEST_TOOLS), wheels, python, deps=True)  # (its few, unpinned)
        one_version_each(wheels, locked)
        archive = Path(scratch) / "wheels.tar"
        with tarfile.open(archive, "w") as tar:
            for wheel in sorted(wheels.iterdir()):
                tar.add(wheel, arcname=f"wheels/{wheel.name}")
        return cut(archive, dest, part_mib * 1024 * 1024)


def _normal(project: str) -> str:
    """A project's name as a pin and a wheel's file name spell it, compared alike."""
    return project.lower().replace("_", "-")


def one_version_each(wheels: Path, locked: list[str]) -> None:
    """Where a test tool's dependencies brought a second version of a locked
    package (pip refuses to install two), the locked one stays."""
    pins = {_normal(line.split("==")[0].split("[")[0]): line.split("==")[1] for line in locked}
    for wheel in sorted(wheels.glob("*.whl")):
        project, version = _normal(wheel.name.split("-")[0]), wheel.name.split("-")[1]
        if project in pins and version != pins[project]:
            wheel.unlink()


def cut(archive: Path, dest: Path, size: int) -> list[Path]:
    """`archive` in parts of `size` bytes at most, dest/part-NN, with their sums
    in dest/SHA256SUMS; the parts."""
    parts: list[Path] = []
    with archive.open("rb") as whole:
        while chunk := whole.read(size):
            parts.append(dest / f"part-{len(parts):02d}")
            parts[-1].write_bytes(chunk)
    sums = [f"{hashlib.sha256(p.read_bytes()).hexdigest()}  {p.name}" for p in parts]
    (dest / "SHA256SUMS").write_text("\n".join(sums) + "\n")
    return parts


def join(stage: Path, into: Path) -> None:
    """The parts in `stage`, each checked against stage/SHA256SUMS, joined into
    `into`; a part missing or changed in the carrying is named."""
    listed = (stage / "SHA256SUMS").read_text().splitlines()
    expected = {name: digest for digest, name in (line.split() for line in listed if line)}
    with into.open("wb") as whole:
        for name in sorted(expected):
            part = stage / name
            data = part.read_bytes() if part.is_file() else b""
            if hashlib.sha256(data).hexdigest() != expected[name]:
                raise SystemExit(f"{name}: missing or not as packed: carry it again")
            whole.write(data)


def unpack(stage: Path) -> Path:
    """The parts in `stage` joined, unpacked and installed (no index, no dependency
    resolution: the parts hold them) into stage/site, once; the site folder."""
    site = stage / "site"
    if (site / ".installed").is_file():
        return site
    archive = stage / "wheels.tar"
    join(stage, archive)
    with tarfile.open(archive) as tar:
        tar.extractall(stage, filter="data")
    wheels = sorted(str(w) for w in (stage / "wheels").glob("*.whl"))
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps",
                    "--no-compile", "--target", str(site), *wheels], check=True)  # fmt: skip
    (site / ".installed").write_text(f"{len(wheels)} wheels\n")
    return site


def steps(provider: str, out: Path, quick: bool) -> list[tuple[str, list[str], int]]:
    """(name, command, time limit in seconds) of each step, in order."""
    from modelbuild.gguf_file import gguf_path  # (from the stage, once installed)

    python = sys.executable
    card = json.loads((ROOT / "models" / "smollm2" / "1" / "card.json").read_text())
    engine = [python, "-m", "bench.generation_engine", "--provider", provider,
              "--gguf", str(gguf_path(card)), "--repeat", "2" if quick else "5"]  # fmt: skip
    # (float16 is the CUDA provider's graph; the CPU's GroupQueryAttention takes float32)
    first = "fp16" if provider == "cuda" else "fp32"
    return [
        ("providers", [python, "-c", "import onnxruntime as ort; "
                       "print(ort.__version__, ort.get_available_providers())"], 60),
        ("models", [python, "manage.py", "models", "build", "--cuda"], 900),
        ("gpu-tests", [python, "-m", "pytest", "-m", "gpu", "tests/gpu", "-p", "no:cacheprovider",
                       "-q", "-rs"], 900),
        # Jobs through a worker on the embedded PostgreSQL and Redis (pgserver runs
        # PostgreSQL as a user of its own under root): the parts the GPU tests start,
        # tried where the GPU tests are skipped too.
        ("service-tests", [python, "-m", "pytest", "tests/api/test_jobs.py", "-p",
                           "no:cacheprovider", "-q"], 900),
        *[(f"engine-{weights}", [*engine, "--weights", weights,
                                 "--out", str(out / f"engine-{weights}.json")], 900)
          for weights in (first, "int4")],
        ("service-generation", [python, "manage.py", "bench", "--generation", "--no-llama",
                                "--no-plot", *(["--quick"] if quick else []),
                                "--out", str(out / "bench")], 1200),
    ]  # fmt: skip


def run(stage: Path, out: Path, provider: str, quick: bool, only: set[str]) -> int:
    """Every step (or those named in `only`), each to its end or its time limit;
    the report written as it goes (a step cut short leaves the others' figures).
    The number of steps that failed."""
    site = unpack(stage) if (stage / "SHA256SUMS").is_file() else None
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "ORT_PROVIDER": provider}
    for name in ("TEST_DATABASE_URL", "TEST_REDIS_URL"):  # the embedded ones, as there
        env.pop(name, None)
    if site is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(site), str(ROOT)])
        sys.path[:0] = [str(site), str(ROOT)]
    out.mkdir(parents=True, exist_ok=True)
    # A run of `only` some steps keeps the others' records (a step run again, say).
    kept = out / "steps.json"
    done: list[dict[str, Any]] = json.loads(kept.read_text()) if only and kept.is_file() else []
    with (out / "steps.log").open("a" if only else "w") as log:
        for name, command, limit in steps(provider, out, quick):
            if only and name not in only:
                continue
            log.write(f"\n==== {name}: {' '.join(command)}\n")
            log.flush()
            began = time.monotonic()
            try:
                finished = subprocess.run(command, cwd=ROOT, env=env, stdout=log,
                                          stderr=subprocess.STDOUT, timeout=limit)  # fmt: skip
                status = finished.returncode
            except subprocess.TimeoutExpired:
                status = 124
            done = [step for step in done if step["step"] != name]
            done.append({"step": name, "status": status,
                         "seconds": round(time.monotonic() - began, 1)})  # fmt: skip
            kept.write_text(json.dumps(done))
            report(out, provider, done)
    return sum(1 for step in done if step["status"])


def report(out: Path, provider: str, done: list[dict[str, Any]]) -> None:
    lines = [f"# GPU check ({provider})", "", "| step | exit | seconds |", "|---|---|---|"]
    lines += [f"| {s['step']} | {s['status']} | {s['seconds']} |" for s in done]
    for found in sorted(out.glob("engine-*.json")):
        data = json.loads(found.read_text())
        lines += ["", f"## {found.stem}: {data.get('provider')}, ONNX Runtime {data.get('ort')}",
                  "", f"- raw, one sequence: {data.get('raw_batch1')}",
                  f"- raw, 16 as one static batch: {data.get('raw_static16')}",
                  f"- the engine at 1, 4 and 16 sequences: {data.get('engine')}",
                  f"- ratios: {data.get('ratios')}",
                  f"- 16 sequences equal: {data.get('engine16_equals_raw_static16')}"]  # fmt: skip
    for table in sorted((out / "bench").glob("*latest.md")):
        lines += ["", "## The service's generation benchmark", "", table.read_text()]
    (out / "gpu-check.md").write_text("\n".join(lines) + "\n")


def try_here(python: str, quick: bool) -> int:
    """The whole check on this machine's CPU, as a GPU machine would run it: the
    parts packed for `python` (a bare interpreter: nothing left out), carried to a
    stage, and run there by that interpreter with the CPU provider."""
    import shutil

    version = subprocess.run([python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                             check=True, capture_output=True, text=True).stdout.strip()  # fmt: skip
    work = ROOT / "var" / "gpu-check"
    parts = pack(version, 56, set(), work / "parts")
    stage = work / "stage"
    shutil.rmtree(stage, ignore_errors=True)
    stage.mkdir(parents=True)
    for part in [*parts, work / "parts" / "SHA256SUMS"]:
        shutil.copy(part, stage)
    command = [python, "-m", "tools.gpu_check", "run", "--stage", str(stage), "--provider", "cpu",
               "--out", str(work / "out"), *(["--quick"] if quick else [])]  # fmt: skip
    return subprocess.run(command, cwd=ROOT).returncode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    verbs = parser.add_subparsers(dest="verb", required=True)
    packing = verbs.add_parser("pack", help="wheels for the GPU machine, in parts")
    packing.add_argument("--python", default="3.12", help="the GPU machine's Python [3.12]")
    packing.add_argument("--part-mib", type=int, default=56, help="a part's size at most [56]")
    packing.add_argument("--present", default=",".join(PRESENT),
                         help="packages its image holds, left out (comma list)")  # fmt: skip
    packing.add_argument("--dest", type=Path, default=PARTS)
    running = verbs.add_parser("run", help="on the GPU machine: install, test, measure")
    running.add_argument("--stage", type=Path, default=STAGE,
                         help="where the parts are (none: this Python's own packages)")  # fmt: skip
    running.add_argument("--out", type=Path, default=ROOT / "var" / "gpu-check")
    running.add_argument("--provider", default="cuda", choices=("cuda", "cpu"))
    running.add_argument("--quick", action="store_true", help="fewer repeats, the quick benchmark")
    running.add_argument("--only", default="", help="only these steps (comma list)")
    trying = verbs.add_parser("try", help="the whole check here, on the CPU")
    trying.add_argument("--python", default="python3.12", help="a bare interpreter [python3.12]")
    trying.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.verb == "try":
        raise SystemExit(try_here(args.python, args.quick))
    if args.verb == "pack":
        present = {p.strip().lower() for p in args.present.split(",") if p.strip()}
        parts = pack(args.python, args.part_mib, present, args.dest)
        total = sum(p.stat().st_size for p in parts) / 1024 / 1024
        print(f"{len(parts)} parts, {total:.0f} MiB, in {args.dest}: carry each, and "
              f"SHA256SUMS, to the GPU machine's {STAGE}, then run there")  # fmt: skip
        return
    only = {s.strip() for s in args.only.split(",") if s.strip()}
    failed = run(args.stage, args.out, args.provider, args.quick, only)
    print((args.out / "gpu-check.md").read_text())
    raise SystemExit(1 if failed else 0)


if __name__ == "__main__":
    main()
