"""Running the Alembic migrations from code (the launcher, the CLI, the tests)."""

from __future__ import annotations

from alembic import command
from alembic.config import Config

from app.platform.settings import ROOT


def alembic_config(url: str) -> Config:
    config = Config(str(ROOT / "alembic.ini"))
    config.attributes["url"] = url
    config.attributes["configure_logger"] = False
    return config


def upgrade(url: str) -> None:
    command.upgrade(alembic_config(url), "head")
