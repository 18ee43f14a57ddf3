"""Explicit model control, as Triton's repository API: load or unload a model,
list what serves (adding a version is `intake.add_model`). The model operations
(app.operations.models) record each change in the shared `model_states` table, so
every API and worker process (on any machine sharing the repository folder)
serves the same versions within MODEL_STATE_CACHE_SECONDS; this process sees it
at once.
"""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Callable

from app.cards import ModelCard
from app.errors import InvalidModel, UnknownModel
from app.repository.intake import INCOMING, check_loadable
from app.repository.registry import ModelRepository, VersionStatus
from app.repository.states import LOADING, READY, UNAVAILABLE, State

UNLOADED = "unloaded by an operator"
CHECKING = "a load is checking it with ONNX Runtime"

# How a version is checked: InvalidModel naming what is wrong, else it can serve.
Check = Callable[[ModelCard], None]


def loading_states(repository: ModelRepository, name: str) -> dict[str, State]:
    """LOADING for the versions of `name` a load brings in: those not serving now.
    A serving version keeps serving while it is checked again (as Triton reloads a
    READY model in the background), so it is left as it is."""
    return {
        s.version: State(LOADING, CHECKING)
        for s in statuses_of(repository, name)
        if s.state != READY
    }


def unfinished_states(coming: dict[str, State], exc: Exception) -> dict[str, State]:
    """UNAVAILABLE, and why, for the versions a load that failed had marked LOADING."""
    why = f"the load did not finish: {type(exc).__name__}: {exc}"[:300]
    return {version: State(UNAVAILABLE, why) for version in coming}


def checked_states(
    repository: ModelRepository, name: str, check: Check = check_loadable
) -> dict[str, State]:
    """Rescan the folder and check every version of `name` with ONNX Runtime
    (`check`): READY for those that pass, UNAVAILABLE with the reason for the others."""
    repository.refresh()
    statuses = statuses_of(repository, name)
    cards = {card.version: card for card in repository.on_disk(name)}
    states: dict[str, State] = {}
    for status in statuses:
        card = cards.get(status.version)
        if card is None:  # its card or file is broken: the index says how
            states[status.version] = State(UNAVAILABLE, status.reason)
            continue
        try:
            check(card)
            states[status.version] = State(READY)
        except InvalidModel as exc:
            states[status.version] = State(UNAVAILABLE, exc.detail)
    return states


def load_failures(name: str, states: dict[str, State]) -> InvalidModel | None:
    """The error naming the versions of `name` that did not load, if any did not."""
    failed = {v: s.reason for v, s in states.items() if s.state == UNAVAILABLE}
    if not failed:
        return None
    listed = "; ".join(f"version {v}: {reason}" for v, reason in failed.items())
    return InvalidModel(f"model {name} did not load: {listed}", versions=failed)


def unloaded_states(
    repository: ModelRepository, name: str, version: str | None = None
) -> dict[str, State]:
    """Every version of `name` (or only `version`) UNAVAILABLE: new submits get
    404, queued jobs fail `model_unavailable` when a worker reaches them."""
    return {s.version: State(UNAVAILABLE, UNLOADED) for s in _versions(repository, name, version)}


def remove_files(repository: ModelRepository, name: str, version: str | None = None) -> list[str]:
    """Delete the folders of `name`'s versions (or only `version`): each is first
    renamed into the staging folder, so a scan never sees half of it; the
    versions removed. Sessions already made from them keep running until closed."""
    removed = [s.version for s in _versions(repository, name, version)]
    trash = repository.root / INCOMING / f"removed-{uuid.uuid4().hex}"
    trash.mkdir(parents=True)
    for v in removed:
        source = repository.root / name / v
        if source.exists():
            source.rename(trash / v)
    model_dir = repository.root / name
    if model_dir.is_dir() and not any(model_dir.iterdir()):
        model_dir.rmdir()
    shutil.rmtree(trash, ignore_errors=True)
    return removed


def _versions(repository: ModelRepository, name: str, version: str | None) -> list[VersionStatus]:
    statuses = statuses_of(repository, name)
    if version is None:
        return statuses
    chosen = [s for s in statuses if s.version == version]
    if not chosen:
        raise UnknownModel(name, version, [f"{s.name}:{s.version}" for s in statuses])
    return chosen


def statuses_of(repository: ModelRepository, name: str) -> list[VersionStatus]:
    statuses = [status for status in repository.index() if status.name == name]
    if not statuses:
        raise UnknownModel(name, None, sorted({s.name for s in repository.index()}))
    return statuses
