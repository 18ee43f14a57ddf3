"""Stream bindings of a tenant: checks and rows. Nothing here commits; the binding
operations own the transaction (helpers flush, to surface a unique input at once)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from app.bindings import entries, names
from app.bindings.tables import StreamBinding
from app.errors import Conflict, InvalidRequest
from app.platform.database import flush_unique
from app.platform.orm import owned
from app.repository.registry import ModelRepository
from app.tenancy.keys import TenantRef
from app.tenancy.tables import Tenant

FIELDS = ("model", "version", "input", "output", "paused")
CHANGEABLE = ("model", "version", "output", "paused")


@dataclass(frozen=True, slots=True)
class ActiveBinding:
    """What a stream consumer needs of an unpaused binding."""

    id: uuid.UUID
    tenant: TenantRef
    model: str
    version: str | None
    input: str
    output: str
    dead_letter: str


def create(
    session: Session, repository: ModelRepository, prefix: str, tenant: TenantRef,
    spec: dict[str, Any],
) -> StreamBinding:  # fmt: skip
    """A binding from `spec` (model, version, input, output, paused): the model
    must serve this tenant; the logs are named under the tenant's prefix."""
    missing = [f for f in ("model", "input", "output") if spec.get(f) in (None, "")]
    if missing:
        raise InvalidRequest(
            f"a binding needs {', '.join(missing)}",
            errors={f: ["Missing data for required field."] for f in missing},
        )
    binding = StreamBinding(id=uuid.uuid4(), tenant_id=tenant.id, paused=False)
    binding.input = names.full_name(prefix, tenant.name, spec["input"], "input")
    binding.dead_letter = names.dead_letter_of(binding.input)
    _apply(session, repository, prefix, tenant, binding, spec)
    session.add(binding)
    _flush_unique(session, binding)
    return binding


def update(
    session: Session, repository: ModelRepository, prefix: str, tenant: TenantRef,
    binding_id: uuid.UUID, changes: dict[str, Any],
) -> StreamBinding:  # fmt: skip
    """Change the model, its version, the output log or `paused`. The input log is
    the binding's identity (its consumer group, its entries' records): to read
    another log, make another binding."""
    binding = get(session, tenant.id, binding_id, lock=True)
    if "input" in changes and changes["input"] is not None:
        given = names.full_name(prefix, tenant.name, changes["input"], "input")
        if given != binding.input:
            raise InvalidRequest(
                "input cannot change: it names the binding's consumer group and records; "
                "delete this binding and make one for the other log",
                errors={"input": ["unchangeable"]},
            )
    _apply(session, repository, prefix, tenant, binding, changes)
    binding.updated_at = datetime.now(UTC)
    _flush_unique(session, binding)
    return binding


def _apply(
    session: Session, repository: ModelRepository, prefix: str, tenant: TenantRef,
    binding: StreamBinding, spec: dict[str, Any],
) -> None:  # fmt: skip
    if "model" in spec or "version" in spec:
        model = spec.get("model") or binding.model
        version = spec.get("version", None if "model" in spec else binding.model_version)
        card = repository.resolve(model, version, tenant.name)  # UnknownModel: 404
        binding.model, binding.model_version = card.name, version
    if spec.get("output") is not None:
        binding.output = names.full_name(prefix, tenant.name, spec["output"], "output")
    if spec.get("paused") is not None:
        binding.paused = bool(spec["paused"])
    if binding.output == binding.input:
        raise InvalidRequest(
            "output must be another log than input: results appended to the input log "
            "would be read back as requests",
            errors={"output": ["not the input log"]},
        )
    # The output of one binding fed as the input of another would turn every result
    # into a dead letter there.
    looped = session.scalar(
        select(StreamBinding.id).where(
            StreamBinding.id != binding.id,
            or_(StreamBinding.input == binding.output, StreamBinding.output == binding.input),
        )
    )
    if looped is not None:
        raise InvalidRequest(
            f"binding {looped} reads {binding.output} or writes {binding.input}: a binding's "
            "output may not be another's input",
            errors={"output": ["not another binding's input"]},
        )


def _flush_unique(session: Session, binding: StreamBinding) -> None:
    """Write the binding now: an input log another binding reads is a Conflict."""
    flush_unique(session, lambda: Conflict(
        f"{binding.input} is already the input of a binding; GET /streams lists yours"
    ))  # fmt: skip


def get(
    session: Session, tenant_id: int, binding_id: uuid.UUID, *, lock: bool = False
) -> StreamBinding:
    return owned(session, StreamBinding, tenant_id, binding_id, "stream binding", lock=lock)


def list_bindings(session: Session, tenant_id: int) -> list[StreamBinding]:
    query = (
        select(StreamBinding)
        .where(StreamBinding.tenant_id == tenant_id)
        .order_by(StreamBinding.created_at, StreamBinding.id)
    )
    return list(session.scalars(query))


def delete(session: Session, tenant_id: int, binding_id: uuid.UUID) -> None:
    """The binding and its entries' records; its jobs stay, and so do its logs and
    consumer group (they are the tenant's: a new binding of the same input log
    reads on from the group's last delivered entry). Conflict while results of its
    entries are still to be appended: deleting the records would drop them."""
    binding = get(session, tenant_id, binding_id)
    waiting = entries.unpublished(session, binding.id)
    if waiting:
        raise Conflict(
            f"binding {binding_id} has {waiting} results not yet in its output log (their "
            "jobs are still running, or just ended); pause it, and delete it once they are out",
            unpublished=waiting,
        )
    session.delete(binding)
    session.flush()


def active(session: Session) -> list[ActiveBinding]:
    """Every unpaused binding of every tenant, for the consumers."""
    rows = session.execute(
        select(StreamBinding, Tenant.name)
        .join(Tenant, Tenant.id == StreamBinding.tenant_id)
        .where(StreamBinding.paused.is_(False))
        .order_by(StreamBinding.created_at, StreamBinding.id)
    ).all()
    return [_active(binding, tenant) for binding, tenant in rows]


def _active(b: StreamBinding, tenant: str) -> ActiveBinding:
    return ActiveBinding(b.id, TenantRef(b.tenant_id, tenant), b.model, b.model_version,
                         b.input, b.output, b.dead_letter)  # fmt: skip
