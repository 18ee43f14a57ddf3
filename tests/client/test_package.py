"""The client as a package of its own: `pip install ./inference_client` in a
fresh virtual environment gives an importable `inference_client` whose files
are the repository's modules, and leaves no build output in the repository."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import inference_client
from app.platform.settings import ROOT

FOLDER = ROOT / "inference_client"


def _listing() -> set[str]:
    return {p.name for p in FOLDER.iterdir() if p.name != "__pycache__"}


@pytest.mark.processes
def test_pip_installs_the_folder_as_the_inference_client_package(tmp_path: Path) -> None:
    before = _listing()
    venv = tmp_path / "venv"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    installed = subprocess.run(
        [venv / "bin" / "pip", "install", "--no-input", str(FOLDER)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert installed.returncode == 0, installed.stdout[-3000:] + installed.stderr[-3000:]
    assert _listing() == before  # no build/, *.egg-info or dist/ left beside the modules

    script = "import inference_client as c, pathlib; print(c.__version__); print(c.__file__)"
    imported = subprocess.run([venv / "bin" / "python", "-c", script], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=120)  # fmt: skip
    assert imported.returncode == 0, imported.stderr
    version, where = imported.stdout.split()
    assert version == inference_client.__version__ == "0.2.0"
    package = Path(where).parent
    assert package.is_relative_to(venv) and package.name == "inference_client"
    shipped = {p.name for p in package.iterdir() if p.name != "__pycache__"}
    ours = {p.name for p in FOLDER.iterdir() if p.suffix == ".py" or p.name == "py.typed"}
    assert shipped == ours  # the modules and py.typed: no pyproject.toml, README or leftovers
    for name in ours:
        assert (package / name).read_bytes() == (FOLDER / name).read_bytes(), name
