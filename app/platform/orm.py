"""The ORM's one declarative base, which every domain's tables use, and the read
every domain makes of a tenant's own row."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

from sqlalchemy.orm import DeclarativeBase, Session
from sqlalchemy.orm.interfaces import ORMOption

from app.errors import NotFound


class Base(DeclarativeBase):
    pass


T = TypeVar("T", bound=Base)


def owned(
    session: Session,
    model: type[T],
    tenant_id: int,
    key: Any,
    noun: str,
    *,
    lock: bool = False,
    options: Sequence[ORMOption] = (),
) -> T:
    """The row of `model` with primary key `key` if it belongs to `tenant_id`
    (locked FOR UPDATE with `lock`, loaded with `options`); NotFound (404)
    otherwise, never 403: another tenant's row is indistinguishable from a missing one."""
    row = session.get(model, key, with_for_update=lock or None, options=options)
    if row is None or getattr(row, "tenant_id", None) != tenant_id:
        raise NotFound(f"no {noun} with id {key}")
    return row
