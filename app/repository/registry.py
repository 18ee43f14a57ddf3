"""The model repository: `<root>/<name>/<version>/model.onnx` plus `card.json`.

It scans the folder for cards (`app.cards`), keeps which versions serve
(a version policy, and load states shared through PostgreSQL), which tenants
see a model, and which queue its jobs travel on.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from app.cards import ModelCard, version_key
from app.errors import DomainError, UnknownModel
from app.repository.states import LOADING, READY, UNAVAILABLE, SharedStates, State

logger = logging.getLogger(__name__)


# `tenant` for a caller with no tenant (an anonymous metadata request): it sees
# only the models open to every tenant. `None` (internal callers) sees all.
PUBLIC = ""


def _entries(folder: Path) -> list[Path]:
    """`folder`'s entries; none when it is not a folder, or went while we looked
    (a model removed under a scan: pathlib's glob raises then)."""
    try:
        with os.scandir(folder) as found:
            return [Path(entry.path) for entry in found]
    except (FileNotFoundError, NotADirectoryError):
        return []


def _lists_steps(version_dir: Path) -> bool:
    """Whether the folder's card.json is a pipeline's (it needs no file beside it)."""
    try:
        return '"steps"' in (version_dir / "card.json").read_text()
    except OSError:
        return False


def _version_dirs(root: Path) -> list[Path]:
    """Every `<root>/<name>/<version>` entry, sorted."""
    return sorted(v for m in _entries(root) for v in _entries(m))


@dataclass(frozen=True)
class VersionStatus:
    """A version in the repository and whether it serves (Triton's index entry)."""

    name: str
    version: str
    state: str  # READY, UNAVAILABLE, or LOADING while a load checks it
    reason: str = ""


_ABSENT = "not in the repository"


class ModelRepository:
    """Cards found under `root`, scanned once; `refresh()` rescans.

    What serves: a version whose card and model.onnx are readable, that its
    model's version policy selects (the newest card's policy speaks for the
    model), and that `states` (shared through PostgreSQL; none in tools and
    unit tests) does not mark UNAVAILABLE or LOADING. When the shared states
    change, the folder is rescanned too, so a model added on another machine
    is seen.
    `clock` (seconds) times the `ttl_s` between looks.
    """

    def __init__(
        self,
        root: Path,
        states: SharedStates | None = None,
        ttl_s: float = 2.0,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.root, self.states, self.ttl_s, self.clock = root, states, ttl_s, clock
        self._cards: dict[str, dict[str, ModelCard]] = {}
        self._broken: dict[tuple[str, str], str] = {}
        self._folder: tuple[tuple[str, int], ...] = ()
        # The shared states are first read by the first look (`sync`), not here: a
        # command that only builds models reads no table (there may be none yet).
        self._synced_at = -float("inf")
        self.revision = 0  # counts rescans: what a process holds is reconciled when it moves
        # Whether a change was announced that this process has not looked at yet
        # (app.repository.generation); asked only when a model is not found.
        self.behind: Callable[[], bool] = lambda: False
        self._syncing = threading.RLock()
        self.refresh()

    def refresh(self) -> None:
        self._folder = self._stamp()
        cards: dict[str, dict[str, ModelCard]] = {}
        broken: dict[tuple[str, str], str] = {}
        if self.root.is_dir():
            for version_dir in _version_dirs(self.root):
                if version_dir.parent.name.startswith("."):
                    continue  # `.incoming`: files on their way in
                if not (version_dir / "card.json").is_file():
                    continue
                where = (version_dir.parent.name, version_dir.name)
                files = any((version_dir / f).is_file() for f in ("model.onnx", "model.py"))
                if not files and not _lists_steps(version_dir):
                    broken[where] = "model.onnx (or model.py) is missing"
                    continue
                try:
                    card = ModelCard.load(version_dir)
                except (OSError, ValueError, KeyError, TypeError) as exc:
                    logger.error("skipping model at %s: unreadable card (%s)", version_dir, exc)
                    broken[where] = f"card.json is not valid: {type(exc).__name__}: {exc}"
                    continue
                cards.setdefault(card.name, {})[card.version] = card
        self._cards, self._broken = cards, broken
        self.revision += 1

    def sync(self, force: bool = False) -> None:
        """Pick up changes, at most once per `ttl_s` unless `force`: shared states
        (a load or unload anywhere) and the folder (a model added by hand, or by
        a PUT on another machine) rescan it."""
        if not force and self.clock() - self._synced_at < self.ttl_s:
            return
        # One look at a time: a look that found a change rescans before another
        # look (the repository watch's thread and a request's) can call it seen.
        # `_synced_at` moves once the look is done: a look under way is waited for,
        # never taken for done by a caller that then reads the cards it replaces.
        with self._syncing:
            now = self.clock()
            if not force and now - self._synced_at < self.ttl_s:
                return
            states_changed = self.states is not None and self.states.poll()
            if states_changed or self._stamp() != self._folder:
                self.refresh()
            self._synced_at = now

    def _stamp(self) -> tuple[tuple[str, int], ...]:
        """The folder's shape: its model and version folders and cards, with
        their modification times (a few stats per model)."""
        if not self.root.is_dir():
            return ()
        models = _entries(self.root)
        versions = [v for m in models for v in _entries(m)]
        paths = [self.root, *models, *versions, *(v / "card.json" for v in versions)]
        stamp = []
        for path in paths:
            try:
                stamp.append((str(path), path.stat().st_mtime_ns))
            except OSError:  # removed while we looked: the next sync sees it
                continue
        return tuple(sorted(stamp))

    def names(self, tenant: str | None = None) -> list[str]:
        """Models with a serving version that `tenant` may use."""
        self.sync()
        return sorted(
            n for n in self._cards if self._serving(n) and self._newest(n).visible_to(tenant)
        )

    def versions(self, name: str) -> list[str]:
        """`name`'s serving versions, oldest first."""
        self.sync()
        return self._serving(name)

    def all(self, tenant: str | None = None) -> list[ModelCard]:
        """Every serving version's card."""
        return [self._cards[n][v] for n in self.names(tenant) for v in self._serving(n)]

    def card(self, name: str, version: str) -> ModelCard:
        """`name` at `version` whether it serves or not (reading a finished
        batch's results of a version since unloaded)."""
        try:
            return self._cards[name][version]
        except KeyError:
            raise UnknownModel(name, version, self.names()) from None

    def on_disk(self, name: str) -> list[ModelCard]:
        """Every readable version of `name`, serving or not, oldest first."""
        versions = self._cards.get(name, {})
        return [versions[v] for v in sorted(versions, key=version_key)]

    def queue_of(self, name: str) -> str | None:
        """The queue `name`'s jobs run on, as its newest card on disk names it
        (serving or not: a wake-up must reach a worker even to fail jobs of an
        unloaded version). None: the card names none, or no card is found, after
        one rescan (a model added since this process last looked)."""
        self.sync()
        if name not in self._cards:
            self.sync(force=True)
        versions = self._cards.get(name)  # one read: a rescan swaps the whole dict
        return versions[max(versions, key=version_key)].queue if versions else None

    def queues(self) -> set[str]:
        """Every queue a card in the folder names."""
        self.sync()
        return {c.queue for versions in self._cards.values() for c in versions.values() if c.queue}

    def index(self) -> list[VersionStatus]:
        """Every version in the folder and whether it serves, and why not."""
        self.sync()
        found = {(n, v) for n, versions in self._cards.items() for v in versions} | set(
            self._broken
        )
        return [
            self._status(n, v) for n, v in sorted(found, key=lambda nv: (nv[0], version_key(nv[1])))
        ]

    def resolve_rescanning(
        self, name: str, version: str | None = None, tenant: str | None = None
    ) -> ModelCard:
        """`resolve`, rescanning once when not found: added since this process started?"""
        try:
            return self.resolve(name, version, tenant)
        except UnknownModel:
            self.sync(force=True)
        return self.resolve(name, version, tenant)

    def resolve(
        self, name: str, version: str | None = None, tenant: str | None = None
    ) -> ModelCard:
        """The card for `name` at `version`, or at its newest serving version when
        None; UnknownModel when `tenant` may not use it or it does not serve. Not
        found while a change was announced that this process has yet to see (a
        model added a moment ago, elsewhere): looked for again after a rescan."""
        try:
            return self._resolve(name, version, tenant)
        except UnknownModel:
            if not self.behind():
                raise
        self.sync(force=True)
        return self._resolve(name, version, tenant)

    def _resolve(self, name: str, version: str | None, tenant: str | None) -> ModelCard:
        self.sync()
        if name not in self._cards or not self._newest(name).visible_to(tenant):
            raise UnknownModel(name, version, self.names(tenant))
        serving = self._serving(name)
        if version is None and serving:
            return self._cards[name][serving[-1]]
        if version in serving:
            return self._cards[name][version]
        known = [f"{name}:{v}" for v in serving]
        if version is None:
            versions = sorted(self._cards[name], key=version_key)
            why = "; ".join(f"version {v}: {self._status(name, v).reason}" for v in versions)
            raise UnknownModel(name, version, known, f"no version is serving: {why}")
        status = self._status(name, version)
        if status.reason == _ABSENT:
            raise UnknownModel(name, version, known)
        raise UnknownModel(name, version, known, status.reason)

    def _newest(self, name: str) -> ModelCard:
        versions = self._cards[name]
        return versions[max(versions, key=version_key)]

    def _serving(self, name: str) -> list[str]:
        return [v for v in self._selected(name) if self._shared(name, v) is None]

    def _selected(self, name: str) -> list[str]:
        if name not in self._cards:
            return []
        versions = sorted(self._cards[name], key=version_key)
        return self._newest(name).version_policy.select(versions)

    def _shared(self, name: str, version: str) -> State | None:
        """The shared state that keeps this version from serving, if any:
        UNAVAILABLE, or LOADING while a load checks it."""
        state = self.states.get(name, version) if self.states else None
        return state if state is not None and state.state in (UNAVAILABLE, LOADING) else None

    def _status(self, name: str, version: str) -> VersionStatus:
        if (name, version) in self._broken:
            return VersionStatus(name, version, UNAVAILABLE, self._broken[(name, version)])
        if version not in self._cards.get(name, {}):
            return VersionStatus(name, version, UNAVAILABLE, _ABSENT)
        if version not in self._selected(name):
            policy = json.dumps(self._newest(name).version_policy.to_dict())
            return VersionStatus(name, version, UNAVAILABLE, f"not in version_policy {policy}")
        state = self._shared(name, version)
        if state is not None:
            return VersionStatus(name, version, state.state, state.reason or "unloaded")
        return VersionStatus(name, version, READY)


class CardCache:
    """The cards one batch of requests asks for (a bulk submit, a stream's entries),
    each looked up once, its error too."""

    def __init__(self, repository: ModelRepository, tenant: str) -> None:
        self._repository, self._tenant = repository, tenant
        self._found: dict[tuple[str, str | None], ModelCard | DomainError] = {}

    def known(self, model: str, version: str | None, card: ModelCard) -> CardCache:
        """`card`, resolved already (by the door that checked it), for this name."""
        self._found[(model, version)] = card
        return self

    def __call__(self, model: str, version: str | None) -> ModelCard:
        key = (model, version)
        if key not in self._found:
            try:
                self._found[key] = self._repository.resolve(model, version, self._tenant)
            except DomainError as exc:
                self._found[key] = exc
        found = self._found[key]
        if isinstance(found, DomainError):
            raise found
        return found
