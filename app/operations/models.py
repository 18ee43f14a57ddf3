"""Models and the model repository: the cards a caller may see, whether a model can
serve, and the operator's control of the repository (add a version, load,
unload), each change recorded for every process in one unit of work."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from sqlalchemy.exc import SQLAlchemyError

from app.cards import ModelCard, TensorSpec
from app.errors import Forbidden, InvalidModel, InvalidRequest, TooLarge, Unavailable
from app.jobs.statistics import model_statistics
from app.operations import triton
from app.platform.database import Database, transactional
from app.repository import code_intake, control, intake, overrides
from app.repository.control import Check
from app.repository.intake import Added, check_loadable, check_ref
from app.repository.registry import PUBLIC, ModelRepository, VersionStatus
from app.repository.states import READY, State, forget_states, set_states
from app.tenancy.keys import TenantRef

__all__ = [
    "PUBLIC",
    "Added",
    "ModelCard",
    "ModelOperations",
    "TensorSpec",
    "VersionStatus",
    "check_ref",
]

logger = logging.getLogger(__name__)

_CHUNK = 1024 * 1024


class ModelOperations:
    def __init__(
        self,
        database: Database,
        repository: ModelRepository,
        announce: Callable[[], None] | None = None,
        check: Check = check_loadable,
    ) -> None:
        """`announce`: tells every process the repository changed (its generation);
        `check`: how a load checks a version (ONNX Runtime, against its card)."""
        self.database, self.repository, self.check = database, repository, check
        self._announce = announce

    def model(self, tenant: str | None, name: str, version: str | None = None) -> ModelCard:
        """The card the caller may see: `tenant` a tenant's name, PUBLIC for an
        anonymous caller (open models only), None for an operator (every model).
        Another tenant's model is UnknownModel, like an absent one."""
        return self.repository.resolve(name, version, tenant)

    def list_models(self, tenant: str | None) -> list[tuple[ModelCard, list[str]]]:
        """The serving models the caller may see, each with its serving versions."""
        cards = [self.repository.resolve(name) for name in self.repository.names(tenant)]
        return [(card, self.repository.versions(card.name)) for card in cards]

    def model_ready(self, tenant: str | None, name: str, version: str | None = None) -> ModelCard:
        """The card of a model that can serve now; Unavailable while its file is gone."""
        card = self.model(tenant, name, version)
        if not card.main_file.is_file():
            raise Unavailable(
                f"model {card.ref} is not ready: {card.main_file.name} is missing", retry_after=5
            )
        return card

    def model_config(
        self, tenant: str | None, name: str, version: str | None = None
    ) -> dict[str, Any]:
        """Triton's model configuration of the card the caller may see, as Triton's
        JSON (both KServe doors answer it; `app.operations.triton`)."""
        return triton.model_config(self.model(tenant, name, version))

    def statistics(
        self, tenant: TenantRef, name: str | None = None, version: str | None = None
    ) -> dict[str, Any]:
        """Triton's statistics (`{"model_stats": [...]}`) of every serving version of
        every model the tenant may see, of `name`'s versions, or of `name` at
        `version`: counted from this tenant's jobs only, never another tenant's
        (`app.jobs.statistics`), in one query. A model the tenant may not see is
        UnknownModel, as for its metadata."""
        if name is None:
            cards = self.repository.all(tenant.name)
            version = None
        elif version is None:
            self.model(tenant.name, name)  # UnknownModel first, as for its metadata
            cards = [self.model(tenant.name, name, v) for v in self.repository.versions(name)]
        else:
            cards = [self.model(tenant.name, name, version)]
        figures = model_statistics(
            self.database.session(), tenant.id, sorted({c.name for c in cards}), version
        )
        return {
            "model_stats": [
                triton.model_statistics(card, figures.get((card.name, card.version)))
                for card in cards
            ]
        }

    def built(self) -> str:
        """`ok` when at least one model is built, else what to do (readiness)."""
        if not self.repository.all():
            self.repository.refresh()
        if not self.repository.all():
            return "no model is built; run `python manage.py models build`"
        return "ok"

    def index(self, *, ready_only: bool = False) -> list[VersionStatus]:
        """Every version in the folder: READY, UNAVAILABLE and why, or LOADING while
        a load checks it (Triton's index)."""
        statuses = self.repository.index()
        return [s for s in statuses if s.state == READY] if ready_only else statuses

    def build_bundled(self, *, force: bool = False, cuda: bool = False) -> list[Path]:
        """Build the bundled models (offline, from installed packages), with the CUDA
        provider's variants where asked; the folders built. The builders (modelbuild/)
        are imported here only, so no process that serves loads their packages."""
        from modelbuild.bundled import ensure_models

        return ensure_models(self.repository.root, force=force, cuda=cuda)

    def add(
        self,
        source: Path,
        name: str,
        version: str | None = None,
        *,
        force: bool = False,
        move: bool = False,
        description: str = "",
        tenants: list[str] | None = None,
        weights: str | None = None,
    ) -> Added:
        """Check `source` with ONNX Runtime, draft its card, place both as `name` /
        `version` (default: one past the highest), and mark the version READY for
        every process. Conflict when it exists and not `force`; `move` takes the
        file (a staged upload) instead of copying it. A GGUF file is built into a
        graph first (`weights`: int4 or fp32; by default int4 for a 4-bit file), its card from its
        metadata; one this service cannot serve is InvalidModel, nothing added."""
        added = intake.add_model(
            self.repository.root, source, name, version,
            force=force, move=move, build=_gguf_builder(source, weights),
            card={**({"description": description} if description else {}),
                  **({"tenants": tenants} if tenants is not None else {})},
        )  # fmt: skip
        try:
            self._record(name, {added.card.version: State(READY)})
        except SQLAlchemyError as exc:  # the files are in place: processes rescan anyway
            logger.warning("could not record %s as READY in the database: %s", added.card.ref, exc)
        self._changed()
        return added

    def add_upload(
        self,
        read: Callable[[int], bytes],
        name: str,
        version: str,
        limit: int,
        *,
        force: bool = False,
        description: str = "",
        allow_code: bool = False,
    ) -> Added:
        """`add` for a version whose file arrives as a stream (`read(n)`), written to a
        staging file inside the repository as it comes: TooLarge past `limit` bytes.
        An archive of a folder with a model.py is code the workers will run: Forbidden
        unless `allow_code` (ALLOW_CODE_UPLOADS, off by default)."""
        check_ref(name, version)  # before the upload, not after it
        staged = _staged(self.repository.root, read, limit)
        try:
            if not allow_code and code_intake.has_code(staged):
                raise Forbidden(
                    "this upload brings a model.py, code the workers would run, and code "
                    "uploads are off: add it with `manage.py models add <folder>` on a "
                    "machine of the service, or set ALLOW_CODE_UPLOADS=true to let operator "
                    "keys upload code"
                )
            return self.add(staged, name, version, move=True, force=force, description=description)
        finally:
            staged.unlink(missing_ok=True)

    def load(self, name: str, parameters: Mapping[str, Any] | None = None) -> list[VersionStatus]:
        """Triton's load: rescan the folder and check every version of `name`; those
        that pass serve (as their version policy allows), those that fail are
        UNAVAILABLE with the reason, and InvalidModel names them.

        `parameters` are Triton's: `config`, a model configuration (JSON) whose
        fields are written into the cards first (`app.repository.overrides`;
        InvalidParameter, with nothing written, for one they cannot honour).
        Each step is a unit of work of its own, committed before the next: the
        versions coming in (those not serving) are recorded LOADING, so every
        process's index shows them so while ONNX Runtime checks them (a serving
        version serves on meanwhile, as Triton reloads one in the background);
        then the states the check found."""
        config = overrides.load_config(parameters)
        self.repository.refresh()
        control.statuses_of(self.repository, name)  # UnknownModel before anything
        changes = None
        if config is not None:
            changes = overrides.parse_config(name, config, self.repository.on_disk(name))
        coming = control.loading_states(self.repository, name)
        self._record(name, coming)
        self._changed()  # every index shows them LOADING
        try:
            if changes is not None:
                overrides.apply(self.repository.on_disk(name), changes)
            self.repository.sync(force=True)
            states = control.checked_states(self.repository, name, self.check)
        except Exception as exc:  # never left LOADING by a load that did not end
            self._record(name, control.unfinished_states(coming, exc))
            raise
        self._record(name, states)
        self._changed()
        if (failed := control.load_failures(name, states)) is not None:
            raise failed
        return control.statuses_of(self.repository, name)

    def unload(
        self,
        name: str,
        version: str | None = None,
        parameters: Mapping[str, Any] | None = None,
    ) -> list[VersionStatus]:
        """Stop serving every version of `name` (or only `version`): new calls get
        404 at once in every process, calls and jobs already running on it finish,
        then its sessions and caches are closed everywhere; queued jobs of it fail
        `model_unavailable` when a worker reaches them. Triton's `unload_dependents`
        parameter (a boolean) is taken and changes nothing: our models have no
        dependents (no ensembles are built on them), so the model alone is unloaded."""
        overrides.unload_dependents(parameters)
        self.repository.refresh()  # a model added by hand since this process looked
        self._record(name, control.unloaded_states(self.repository, name, version))
        self._changed()
        return control.statuses_of(self.repository, name)

    def remove(self, name: str, version: str | None = None) -> list[VersionStatus]:
        """Take every version of `name` (or only `version`) out of the repository:
        its files are deleted, its shared states forgotten, and every process stops
        serving it as for `unload`; the versions left. UnknownModel when absent."""
        removed = control.remove_files(self.repository, name, version)
        self._forget(name, removed)
        self._changed()
        return [s for s in self.repository.index() if s.name == name]

    def _changed(self) -> None:
        """This process sees the change now; every other one within a second."""
        self.repository.sync(force=True)
        if self._announce is None:
            return
        try:
            self._announce()
        except Exception as exc:  # Redis away: every process still polls on its own
            logger.warning("could not announce the repository change (%s); processes see it "
                           "within MODEL_STATE_CACHE_SECONDS", exc)  # fmt: skip

    @transactional
    def _forget(self, name: str, versions: list[str]) -> None:
        forget_states(self.database.session(), name, versions)

    @transactional
    def _record(self, name: str, states: dict[str, State]) -> None:
        set_states(self.database.session(), name, states)


def _gguf_builder(
    source: Path, weights: str | None
) -> Callable[[Path, Path], dict[str, Any]] | None:
    """The builder of a GGUF file (its first bytes say so), else None."""
    if source.is_dir():
        return None
    with source.open("rb") as file:
        gguf = file.read(4) == b"GGUF"
    if not gguf:
        if weights is not None:
            raise InvalidRequest("weights: only a GGUF file is built with chosen weights",
                                 errors={"weights": ["not a GGUF file"]})  # fmt: skip
        return None

    def build(path: Path, target: Path) -> dict[str, Any]:
        try:
            import gguf  # noqa: F401  (the builders' packages, requirements-build.txt)

            from modelbuild.own_gguf import WEIGHTS, UnsupportedModel, build_own_gguf
        except ModuleNotFoundError as exc:
            raise Unavailable(
                f"building a GGUF file needs {exc.name}, which this "
                "installation leaves out (requirements-build.txt)"
            ) from None

        if weights is not None and weights not in WEIGHTS:
            raise InvalidRequest(f"weights {weights!r}: one of {', '.join(WEIGHTS)}",
                                 errors={"weights": ["invalid"]})  # fmt: skip
        try:
            return build_own_gguf(path, target, weights)
        except UnsupportedModel as exc:
            raise InvalidModel(f"this GGUF file cannot be served: {exc}") from None

    return build


def _staged(root: Path, read: Callable[[int], bytes], limit: int) -> Path:
    """The stream, written in chunks to a staging file in the repository."""
    path = intake.staging_file(root)
    size = 0
    try:
        with path.open("wb") as out:
            while chunk := read(_CHUNK):
                size += len(chunk)
                if size > limit:
                    raise TooLarge(f"the model is larger than MAX_MODEL_BYTES ({limit} bytes)")
                out.write(chunk)
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    return path


def queues_in(root: Path) -> set[str]:
    """The queues the cards under `root` name (beside DEFAULT_MODEL_QUEUE): what the
    launcher's worker serves, read from the folder before any database is up."""
    return ModelRepository(root).queues()
