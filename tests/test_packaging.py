"""The dependency files agree: requirements.txt is the runtime lock (no model
builder, no benchmark package), requirements-build.txt adds the builders, and
pyproject.toml's ranges hold every pin; `pip install .` gives the console script."""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from app.platform.settings import ROOT

# What only `manage.py models build` imports, with what they alone pull in.
BUILD_ONLY = {
    "scikit-learn", "skl2onnx", "onnx", "gguf", "safetensors", "scipy", "joblib",
    "threadpoolctl", "narwhals", "ml-dtypes", "cloudpickle",
}  # fmt: skip
BENCH_ONLY = {"gunicorn", "matplotlib"}


def _pins(path: Path) -> dict[str, str]:
    """name: pinned version, following `-r` includes."""
    pins: dict[str, str] = {}
    for raw in path.read_text().splitlines():
        line = raw.split("#")[0].strip()
        if line.startswith("-r "):
            pins |= _pins(path.parent / line.split()[1])
        elif line:
            requirement = Requirement(line)
            (spec,) = requirement.specifier
            assert spec.operator == "==", f"{path.name}: {line} is not pinned"
            pins[canonicalize_name(requirement.name)] = spec.version
    return pins


def _own(path: Path) -> set[str]:
    """The names a requirements file pins itself (not through `-r`)."""
    lines = (line.split("#")[0].strip() for line in path.read_text().splitlines())
    return {canonicalize_name(Requirement(line).name) for line in lines
            if line and not line.startswith("-")}  # fmt: skip


def test_the_runtime_lock_carries_no_builder_and_no_benchmark_package() -> None:
    runtime = set(_pins(ROOT / "requirements.txt"))
    assert not runtime & (BUILD_ONLY | BENCH_ONLY)
    assert "tokenizers" in runtime and "tqdm" in runtime  # used at run time
    build = ROOT / "requirements-build.txt"
    assert re.search(r"^-r requirements\.txt$", build.read_text(), re.MULTILINE)
    assert _own(build) == BUILD_ONLY
    assert _own(ROOT / "bench" / "requirements.txt") >= BENCH_ONLY


def test_pyproject_ranges_hold_the_pins() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    runtime, build = _pins(ROOT / "requirements.txt"), _pins(ROOT / "requirements-build.txt")
    groups = {"runtime": (project["dependencies"], runtime),
              "build": (project["optional-dependencies"]["build"], build)}  # fmt: skip
    for group, (declared, pins) in groups.items():
        for text in declared:
            requirement = Requirement(text)
            name = canonicalize_name(requirement.name)
            assert name in pins, f"{group}: {name} is not pinned"
            assert requirement.specifier.contains(pins[name]), (group, text, pins[name])
    declared_runtime = {canonicalize_name(Requirement(t).name) for t in project["dependencies"]}
    assert not declared_runtime & (BUILD_ONLY | BENCH_ONLY)
    assert project["scripts"]["inference"] == "app.cli.main:cli"


@pytest.mark.processes
def test_pip_install_gives_the_console_script_and_its_version(tmp_path: Path) -> None:
    """`pip install .` (the wheel pip builds from a copy of the sources, so no build
    output lands in the checkout) installs `inference`, which answers `--version`
    and `--help` outside the checkout. The dependencies come from this environment
    (a .pth file), so nothing is downloaded."""
    source = tmp_path / "src"
    for part in ("app", "workers", "modelbuild"):
        shutil.copytree(ROOT / part, source / part, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", source)
    run = functools.partial(subprocess.run, capture_output=True, text=True, timeout=300)
    built = run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                 "-w", str(tmp_path / "dist"), str(source)])  # fmt: skip
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
    [wheel] = (tmp_path / "dist").glob("inference_jobs-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"app/templates/status.html", "app/grpc/protos/grpc_service.proto"} <= names
    assert "modelbuild/bundled.py" in names  # `models build`, with the [build] extra
    assert not any(n.startswith(("tests/", "bench/", "inference_client/")) for n in names)

    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", str(venv)], check=True)
    site = next((venv / "lib").glob("python3*/site-packages"))
    (site / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    installed = run([venv / "bin" / "pip", "install", "--no-deps", "--no-index", str(wheel)])
    assert installed.returncode == 0, installed.stderr[-2000:]

    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    version = run([venv / "bin" / "inference", "--version"], cwd=tmp_path, env=env)
    assert version.returncode == 0, version.stderr
    assert version.stdout.strip() == f"inference-jobs, version {app_version()}"
    helped = run([venv / "bin" / "inference", "--help"], cwd=tmp_path, env=env)
    assert helped.returncode == 0 and "submit" in helped.stdout and "worker" in helped.stdout
    where = run([venv / "bin" / "python", "-c", "import app; print(app.__file__)"],
                cwd=tmp_path, env=env)  # fmt: skip
    assert Path(where.stdout.strip()).is_relative_to(venv)  # the installed copy, not ours


def app_version() -> str:
    text = (ROOT / "app" / "__init__.py").read_text()
    match = re.search(r'__version__ = "([^"]+)"', text)
    assert match
    return match.group(1)
