"""Uploaded input files, kept in PostgreSQL in parts of a MiB.

An upload is streamed into `file_parts` in one transaction: memory stays at
one part whatever the size, an aborted upload leaves nothing, and workers on
other machines read the file from the database the API wrote it to.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Iterable, Iterator
from typing import IO

from sqlalchemy import delete, insert, select
from sqlalchemy.orm import Session, sessionmaker

from app.batches.readers import FORMATS
from app.errors import Conflict, InvalidRequest, TooLarge
from app.jobs.chunks import PART_BYTES, read_range
from app.jobs.quotas import Quotas
from app.platform.tables import Batch, File, FilePart, Schedule
from app.tenancy.owned import owned

__all__ = ["PART_BYTES", "read_range"]


def format_of(filename: str, declared: str | None) -> str:
    fmt = (declared or filename.rpartition(".")[2]).lower()
    if fmt not in FORMATS:
        raise InvalidRequest(
            f"cannot tell the format of {filename!r}; name the file .npy, .jsonl or .csv, "
            "or pass format=npy|jsonl|csv",
            errors={"format": [f"one of {', '.join(FORMATS)}"]},
        )
    return fmt


def store(
    session: Session,
    tenant_id: int,
    filename: str,
    fmt: str,
    body: IO[bytes],
    max_bytes: int,
    limits: Quotas | None = None,
) -> File:
    """Read `body` to its end into a new file (the caller commits); TooLarge past `max_bytes`,
    QuotaExceeded past what the tenant may still store."""
    room = limits.admit_upload(session, tenant_id, 0) if limits else None
    limit = max_bytes if room is None else min(max_bytes, room)
    try:
        file = store_parts(session, tenant_id, filename, fmt,
                           iter(lambda: _read_part(body), b""), limit)  # fmt: skip
    except TooLarge:
        session.rollback()  # the parts written so far go; the quota is read afresh
        if limits is not None and limit < max_bytes:
            limits.admit_upload(session, tenant_id, limit + 1)  # raises QuotaExceeded
        raise
    return file


def store_parts(
    session: Session,
    tenant_id: int,
    filename: str,
    fmt: str,
    parts: Iterable[bytes],
    max_bytes: int,
) -> File:
    """A new file of these parts, in the session's transaction: the caller
    commits, or rolls back on an error (TooLarge, an empty file)."""
    file = File(id=uuid.uuid4(), tenant_id=tenant_id, filename=filename[:255], format=fmt,
                size_bytes=0, sha256="", parts=0)  # fmt: skip
    session.add(file)
    session.flush()
    digest, size, seq = hashlib.sha256(), 0, 0
    for part in _exact(parts):
        size += len(part)
        if size > max_bytes:
            raise TooLarge(
                f"the file is larger than the upload limit of {max_bytes} bytes "
                "(MAX_UPLOAD_BYTES); split it into several batches",
                limit_bytes=max_bytes,
            )
        digest.update(part)
        session.execute(insert(FilePart).values(file_id=file.id, seq=seq, data=part))
        seq += 1
    if size == 0:
        raise InvalidRequest("the file is empty", errors={"body": ["send the file's bytes"]})
    file.size_bytes, file.sha256, file.parts = size, digest.hexdigest(), seq
    session.flush()
    return file


def _exact(parts: Iterable[bytes]) -> Iterator[bytes]:
    """Parts of exactly PART_BYTES (the last may be shorter), whatever came in:
    then byte N of a file is in part N // PART_BYTES, for range reads."""
    buffer = bytearray()
    for part in parts:
        buffer += part
        while len(buffer) >= PART_BYTES:
            yield bytes(buffer[:PART_BYTES])
            del buffer[:PART_BYTES]
    if buffer:
        yield bytes(buffer)


def _read_part(body: IO[bytes]) -> bytes:
    """Up to PART_BYTES: a stream's read may return less before its end."""
    pieces, left = [], PART_BYTES
    while left:
        piece = body.read(left)
        if not piece:
            break
        pieces.append(piece)
        left -= len(piece)
    return b"".join(pieces)


def get(session: Session, tenant_id: int, file_id: uuid.UUID) -> File:
    return owned(session, File, tenant_id, file_id, "file")


def list_files(session: Session, tenant_id: int, limit: int = 100) -> list[File]:
    query = select(File).where(File.tenant_id == tenant_id).order_by(File.created_at.desc())
    return list(session.scalars(query.limit(limit)))


def remove(session: Session, tenant_id: int, file_id: uuid.UUID) -> None:
    """Delete a file no unfinished batch still reads."""
    get(session, tenant_id, file_id)
    busy = session.scalar(
        select(Batch.id)
        .where(Batch.input_file_id == file_id, Batch.status.in_(("queued", "running")))
        .limit(1)
    )
    if busy is not None:
        raise Conflict(f"batch {busy} is still reading file {file_id}; cancel it or wait")
    schedule = session.scalar(select(Schedule.name).where(Schedule.input_file_id == file_id))
    if schedule is not None:
        raise Conflict(f"schedule {schedule!r} reads file {file_id}; change or delete it first")
    session.execute(delete(File).where(File.id == file_id))


def first_part(session: Session, file_id: uuid.UUID) -> bytes:
    """The file's first part, read in the session's own transaction (a file
    stored in it and not yet committed included)."""
    data = session.scalar(
        select(FilePart.data).where(FilePart.file_id == file_id, FilePart.seq == 0)
    )
    return data or b""


def parts(
    sessions: sessionmaker[Session], file_id: uuid.UUID, per_query: int = 8
) -> Iterator[bytes]:
    """The file's bytes, a part at a time, with no transaction held between reads."""
    seq = 0
    while True:
        with sessions() as session:
            query = (
                select(FilePart.data)
                .where(FilePart.file_id == file_id, FilePart.seq >= seq)
                .order_by(FilePart.seq)
                .limit(per_query)
            )
            batch = list(session.scalars(query))
        yield from batch
        if len(batch) < per_query:
            return
        seq += per_query
