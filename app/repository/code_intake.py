"""Checks a model's own code passes before it is placed (app.repository.intake):
the packages its `requirements.txt` lists are installed here, as they are where
models run (nothing is ever installed at run time), and a dry run in a process of
its own (app.runtime.dry_run) imports it and runs it on its examples.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tarfile
import zipfile
from importlib import metadata
from pathlib import Path
from typing import Any

from app.errors import InvalidModel

REQUIREMENTS = "requirements.txt"
DRY_RUN_SECONDS = 120.0
# What a folder may bring: its code, graph, card, examples and the files it reads.
MAX_FILES = 1000


def check_requirements(folder: Path) -> None:
    """InvalidModel naming each package `requirements.txt` lists that is not
    installed (or not at a version it accepts)."""
    from packaging.requirements import InvalidRequirement, Requirement

    path = folder / REQUIREMENTS
    if not path.is_file():
        return
    problems = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        try:
            wanted = Requirement(text)
        except InvalidRequirement as exc:
            problems.append(f"line {number} ({text!r}) is not a requirement: {exc}")
            continue
        try:
            have = metadata.version(wanted.name)
        except metadata.PackageNotFoundError:
            problems.append(f"{wanted.name} is not installed")
            continue
        if wanted.specifier and not wanted.specifier.contains(have, prereleases=True):
            problems.append(f"{wanted.name} {have} is installed; it asks for {wanted.specifier}")
    if problems:
        raise InvalidModel(
            f"model.py's {REQUIREMENTS}: {'; '.join(problems)}. Packages are never installed "
            "at run time: install them where the service and its workers run, then add again"
        )


def dry_run(folder: Path, defaults: dict[str, Any], shown: str) -> dict[str, Any]:
    """The card the folder's model serves with, drafted and tried by the dry run
    (InvalidModel with what it said otherwise)."""
    command = [sys.executable, "-m", "app.runtime.dry_run", str(folder), json.dumps(defaults)]
    try:
        run = subprocess.run(command, capture_output=True, text=True, timeout=DRY_RUN_SECONDS,
                             cwd=Path(__file__).resolve().parents[2])  # fmt: skip
    except subprocess.TimeoutExpired:
        raise InvalidModel(f"{shown}: the dry run of model.py on its examples took longer "
                           f"than {DRY_RUN_SECONDS:g} s") from None  # fmt: skip
    said = _last_json(run.stdout)
    if run.returncode != 0 or said is None or "card" not in said:
        why = (said or {}).get("error") or _tail(run.stderr) or f"exit status {run.returncode}"
        raise InvalidModel(f"{shown}: model.py did not pass its dry run: {why}")
    card: dict[str, Any] = said["card"]
    return card


def unpack_archive(archive: Path, into: Path) -> Path:
    """A zip or tar archive's files under `into` (none outside it, no links); the
    folder holding model.py (the archive's root or its one top folder)."""
    into.mkdir(parents=True, exist_ok=True)
    root = into.resolve()
    if zipfile.is_zipfile(archive):
        with zipfile.ZipFile(archive) as packed:
            names = packed.namelist()
            _inside(root, names)
            packed.extractall(root)
    elif tarfile.is_tarfile(archive):
        with tarfile.open(archive) as packed:
            members = packed.getmembers()
            if any(not (m.isfile() or m.isdir()) for m in members):
                raise InvalidModel("the archive holds links or devices; only files and folders")
            _inside(root, [m.name for m in members])
            packed.extractall(root, filter="data")
    else:
        raise InvalidModel("not an ONNX file, a GGUF file, nor a zip or tar archive of a folder")
    for folder in (root, *[p for p in root.iterdir() if p.is_dir()]):
        if (folder / "model.py").is_file() or (folder / "model.onnx").is_file():
            return folder
    raise InvalidModel("the archive holds no model.py (nor model.onnx) at its root")


def is_archive(path: Path) -> bool:
    return zipfile.is_zipfile(path) or tarfile.is_tarfile(path)


def has_code(path: Path) -> bool:
    """Whether a folder, or an archive, brings a model.py."""
    if path.is_dir():
        return (path / "model.py").is_file()
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as packed:
            return any(Path(n).name == "model.py" for n in packed.namelist())
    if tarfile.is_tarfile(path):
        with tarfile.open(path) as packed:
            return any(Path(n).name == "model.py" for n in packed.getnames())
    return False


def copy_folder(source: Path, target: Path) -> None:
    """The folder's files into `target` (links are not followed)."""
    files = [p for p in source.rglob("*") if p.is_file()]
    if len(files) > MAX_FILES:
        raise InvalidModel(f"the folder holds {len(files)} files; at most {MAX_FILES}")
    shutil.copytree(source, target, symlinks=False, dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("__pycache__", ".*"))  # fmt: skip


def _inside(root: Path, names: list[str]) -> None:
    if len(names) > MAX_FILES:
        raise InvalidModel(f"the archive holds {len(names)} entries; at most {MAX_FILES}")
    for name in names:
        if not (root / name).resolve().is_relative_to(root):
            raise InvalidModel(f"the archive's entry {name!r} lies outside its folder")


def _last_json(text: str) -> dict[str, Any] | None:
    for line in reversed(text.strip().splitlines()):
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    return None


def _tail(text: str, limit: int = 400) -> str:
    text = text.strip()
    return text[-limit:]
