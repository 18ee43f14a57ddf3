"""The bundled pipelines and their steps' models, added beside the test models as
an operator adds them (`models add`): digit-photo, its one-model.py twin, and
ingest."""

from __future__ import annotations

from pathlib import Path

import pytest
from flask import Flask

from app.platform.settings import ROOT
from app.web.context import container_of

BUNDLED = ROOT / "models"
# In the order they can be added: a pipeline after its steps' models.
PIPELINE_MODELS = ("digit-decode", "digit-answer", "digit-photo", "digit-photo-code",
                   "ingest-chunks", "ingest", "triage")  # fmt: skip


@pytest.fixture(scope="session")
def pipeline_models(model_repository: Path, app: Flask) -> Path:
    models = container_of(app).models
    for name in PIPELINE_MODELS:
        if not (model_repository / name).exists():
            source = BUNDLED / name / "1"
            models.add(source if (source / "model.py").is_file() else source / "card.json", name)
    return model_repository
