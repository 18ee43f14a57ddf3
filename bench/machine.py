"""What the figures were measured on: they are only comparable within one machine."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import shutil
import subprocess
from typing import Any

import psutil

from app.platform.settings import ROOT

PACKAGES = (
    "onnxruntime-gpu", "onnxruntime", "numpy", "celery", "kombu", "redis", "flask",
    "gunicorn", "granian", "sqlalchemy", "psycopg2-binary", "flower", "matplotlib",
)  # fmt: skip


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _gpus() -> list[str]:
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total,driver_version",
             "--format=csv,noheader"],
            capture_output=True, text=True, timeout=20, check=True,
        ).stdout  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in out.splitlines() if line.strip()]


def _git() -> str:
    try:
        rev = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=ROOT, capture_output=True, text=True,
        ).stdout.strip()  # fmt: skip
    except OSError:
        return "unknown"
    return f"{rev}{' (uncommitted changes)' if dirty else ''}"


def _versions() -> dict[str, str]:
    found = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return found


def describe(extra: dict[str, str] | None = None) -> dict[str, Any]:
    memory = psutil.virtual_memory()
    return {
        "cpu_model": _cpu_model(),
        "logical_cores": os.cpu_count(),
        "physical_cores": psutil.cpu_count(logical=False),
        "memory_gib": round(memory.total / 2**30, 1),
        "gpus": _gpus(),
        "os": f"{platform.system()} {platform.release()}",
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
        "git": _git(),
        "versions": {**_versions(), **(extra or {})},
    }
