"""The model builders (modelbuild/) stand apart from the service: no process that
serves imports them or their packages (scikit-learn, skl2onnx, onnx, gguf,
safetensors), and they import nothing of the service. (The import arrows are also
`lint-imports`' contracts in pyproject.toml; this checks what each entry point
really loads, lazy imports included.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from app.platform.settings import ROOT, Settings

# What only the builders import (requirements-build.txt), and the builders themselves.
BUILD_PACKAGES = {"sklearn", "skl2onnx", "onnx", "gguf", "safetensors", "scipy"}
BUILDERS = {"modelbuild", *BUILD_PACKAGES}

# Each process's entry point, as its command imports it.
ENTRY_POINTS = {
    "api": "from app import create_app",  # the HTTP door's factory
    "api server": "import app.cli.api_server",
    "container": "import app.container",
    "celery worker": "import workers.worker",
    "celery tasks": "import workers.tasks",
    "grpc door": "import app.grpc.server",
    "stream consumer": "import app.streams.process, app.streams.consumer",
    "command line": "import app.cli.main",
    "manage.py": "import manage",
}


def _loaded(statement: str, settings: Settings) -> set[str]:
    """The top-level names of the modules a fresh interpreter holds after `statement`."""
    env = {**os.environ, "DATABASE_URL": settings.database_url, "REDIS_URL": settings.redis_url}
    code = f"{statement}\nimport sys\nprint('\\n'.join(sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, check=True,
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    return {name.split(".")[0] for name in out.stdout.split()}


@pytest.mark.parametrize("statement", ENTRY_POINTS.values(), ids=ENTRY_POINTS.keys())
def test_no_entry_point_loads_the_model_builders(statement: str, settings: Settings) -> None:
    loaded = _loaded(statement, settings)
    assert "app" in loaded
    assert not loaded & BUILDERS, f"{statement} loads {sorted(loaded & BUILDERS)}"


def test_the_builders_import_nothing_of_the_service_nor_their_packages_until_they_build(
    settings: Settings,
) -> None:
    """Each builder imports its packages inside itself: a repository whose models are
    all built (`manage.py up` asks on every start) needs none of them."""
    loaded = _loaded("import modelbuild.bundled", settings)
    assert "modelbuild" in loaded
    assert not loaded & {"app", "workers", *BUILD_PACKAGES}, sorted(loaded)


def test_the_builders_find_the_bundled_cards_from_where_they_lie() -> None:
    from modelbuild.bundled import BUILDERS as by_name
    from modelbuild.files import BUNDLED

    cards = sorted(BUNDLED.glob("*/*/card.json"))
    assert BUNDLED == ROOT / "models" and cards
    built = [json.loads(card.read_text()).get("build") for card in cards]
    assert {build["builder"] for build in built if build} <= set(by_name)
    # (a model of code alone, or a pipeline, has no build: its committed files are all)
    for card in cards:
        if "build" not in json.loads(card.read_text()):
            assert any((card.parent / f).is_file() for f in ("model.py",)) or "steps" in (
                card.read_text()), card  # fmt: skip
