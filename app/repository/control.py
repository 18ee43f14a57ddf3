"""Explicit model control, as Triton's repository API: add a version, load or
unload a model, list what serves. The CLI and the operator routes call these.

Each change is written to the shared `model_states` table, so every API and
worker process (on any machine sharing the repository folder) serves the same
versions within MODEL_STATE_CACHE_SECONDS; this process sees it at once.
"""

from __future__ import annotations

import logging
from pathlib import Path

from sqlalchemy.engine import Engine
from sqlalchemy.exc import SQLAlchemyError

from app.errors import InvalidModel, UnknownModel
from app.repository.intake import Added, add_model, check_loadable
from app.repository.registry import ModelRepository, VersionStatus
from app.repository.states import READY, UNAVAILABLE, State, set_states

logger = logging.getLogger(__name__)

UNLOADED = "unloaded by an operator"


def add(
    engine: Engine | None,
    repository: ModelRepository,
    source: Path,
    name: str,
    version: str | None = None,
    *,
    force: bool = False,
    move: bool = False,
    description: str = "",
    tenants: list[str] | None = None,
) -> Added:
    """`intake.add_model`, then mark the version READY for every process
    (`engine` None: no database to tell; processes see it on their next scan)."""
    added = add_model(
        repository.root, source, name, version,
        force=force, move=move, description=description, tenants=tenants,
    )  # fmt: skip
    if engine is not None:
        try:
            set_states(engine, name, {added.card.version: State(READY)})
        except SQLAlchemyError as exc:  # the files are in place: processes rescan anyway
            logger.warning("could not record %s as READY in the database: %s", added.card.ref, exc)
    repository.sync(force=True)
    return added


def load(engine: Engine, repository: ModelRepository, name: str) -> list[VersionStatus]:
    """Rescan the folder and check every version of `name` with ONNX Runtime;
    those that pass serve (as their version policy allows), those that fail are
    UNAVAILABLE with the reason, and InvalidModel names them."""
    repository.refresh()
    statuses = _statuses(repository, name)
    cards = {card.version: card for card in repository.on_disk(name)}
    states: dict[str, State] = {}
    for status in statuses:
        card = cards.get(status.version)
        if card is None:  # its card or file is broken: the index says how
            states[status.version] = State(UNAVAILABLE, status.reason)
            continue
        try:
            check_loadable(card)
            states[status.version] = State(READY)
        except InvalidModel as exc:
            states[status.version] = State(UNAVAILABLE, exc.detail)
    set_states(engine, name, states)
    repository.sync(force=True)
    failed = {v: s.reason for v, s in states.items() if s.state == UNAVAILABLE}
    if failed:
        listed = "; ".join(f"version {v}: {reason}" for v, reason in failed.items())
        raise InvalidModel(f"model {name} did not load: {listed}", versions=failed)
    return _statuses(repository, name)


def unload(engine: Engine, repository: ModelRepository, name: str) -> list[VersionStatus]:
    """Stop serving every version of `name`: new submits get 404, queued jobs
    fail `model_unavailable` when a worker reaches them."""
    statuses = _statuses(repository, name)
    set_states(engine, name, {s.version: State(UNAVAILABLE, UNLOADED) for s in statuses})
    repository.sync(force=True)
    return _statuses(repository, name)


def _statuses(repository: ModelRepository, name: str) -> list[VersionStatus]:
    statuses = [status for status in repository.index() if status.name == name]
    if not statuses:
        raise UnknownModel(name, None, sorted({s.name for s in repository.index()}))
    return statuses
