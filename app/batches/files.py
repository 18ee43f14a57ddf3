"""Uploaded input files: their bytes in the file store, their metadata in PostgreSQL.

An upload is streamed to the store a MiB at a time, so memory stays at one
part whatever the size, under a key made from the file's new id (never from
its name); the object appears only once it is complete. Files uploaded before
the store keep their bytes in `file_parts` (`store_key` NULL) and are read
from there: nothing had to be copied when the store came.
"""

from __future__ import annotations

import errno
import hashlib
import uuid
from collections.abc import Iterable, Iterator
from typing import IO

from sqlalchemy import delete, select
from sqlalchemy.orm import Session, sessionmaker

from app.batches import readers
from app.batches.tables import Batch, File, FilePart
from app.errors import Conflict, InsufficientStorage, InvalidRequest, TooLarge, Unavailable
from app.jobs.chunks import PART_BYTES, file_key
from app.platform.filestore import FileStore
from app.platform.orm import owned
from app.statuses import BATCH_OPEN

FORMATS = (*readers.FORMATS, "parquet")


def format_of(filename: str, declared: str | None) -> str:
    fmt = (declared or filename.rpartition(".")[2]).lower()
    if fmt not in FORMATS:
        raise InvalidRequest(
            f"cannot tell the format of {filename!r}; name the file .npy, .jsonl, .csv or "
            ".parquet, or pass format=npy|jsonl|csv|parquet",
            errors={"format": [f"one of {', '.join(FORMATS)}"]},
        )
    return fmt


def store_refused(exc: OSError) -> InsufficientStorage | Unavailable:
    """The store's failure during an upload as the client's answer: no room (a full
    disk, a quota) is InsufficientStorage, any other failure Unavailable. Either
    way the writer left nothing behind and no file was recorded."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return InsufficientStorage(
            "the file store is full, so nothing of the upload was kept; send it again "
            "later, once space has been freed", retry_after=30,
        )  # fmt: skip
    return Unavailable(
        f"the file store failed ({exc}), so nothing of the upload was kept; send it again",
        retry_after=5,
    )


def store_parts(
    session: Session,
    files: FileStore,
    tenant_id: int,
    filename: str,
    fmt: str,
    parts: Iterable[bytes],
    max_bytes: int,
) -> File:
    """A new file of these parts, written to the store and added to the session
    (the caller commits). TooLarge or an empty file leave no object behind."""
    file_id = uuid.uuid4()
    key = file_key(tenant_id, file_id)
    digest, size = hashlib.sha256(), 0
    with files.writer(key) as out:
        for part in parts:
            size += len(part)
            if size > max_bytes:
                raise TooLarge(
                    f"the file is larger than the upload limit of {max_bytes} bytes "
                    "(MAX_UPLOAD_BYTES); split it into several batches",
                    limit_bytes=max_bytes,
                )
            digest.update(part)
            out.write(part)
        if size == 0:
            raise InvalidRequest("the file is empty", errors={"body": ["send the file's bytes"]})
    file = File(id=file_id, tenant_id=tenant_id, filename=filename[:255], format=fmt,
                size_bytes=size, sha256=digest.hexdigest(), parts=0, store_key=key)  # fmt: skip
    session.add(file)
    session.flush()
    return file


def read_parts(body: IO[bytes]) -> Iterator[bytes]:
    """`body` a part of PART_BYTES at a time, to its end."""
    return iter(lambda: _read_part(body), b"")


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


def unread(session: Session, tenant_id: int, file_id: uuid.UUID) -> File:
    """The tenant's file, if no unfinished batch still reads it (Conflict if one does)."""
    file = get(session, tenant_id, file_id)
    busy = session.scalar(
        select(Batch.id)
        .where(Batch.input_file_id == file_id, Batch.status.in_(BATCH_OPEN))
        .limit(1)
    )
    if busy is not None:
        raise Conflict(f"batch {busy} is still reading file {file_id}; cancel it or wait")
    return file


def remove(session: Session, file: File) -> str | None:
    """Delete the file's row; returns its object's key, for the caller to delete
    from the store once the deletion is committed."""
    key = file.store_key
    session.execute(delete(File).where(File.id == file.id))
    return key


def head(session: Session, files: FileStore, file: File) -> bytes:
    """The file's first MiB (its first part), for checks of its first rows; read in
    the session's own transaction for a file kept in PostgreSQL."""
    if file.store_key is not None:
        return files.read(file.store_key, 0, min(PART_BYTES, file.size_bytes))
    data = session.scalar(
        select(FilePart.data).where(FilePart.file_id == file.id, FilePart.seq == 0)
    )
    return bytes(data or b"")


def parts(sessions: sessionmaker[Session], files: FileStore, file: File) -> Iterator[bytes]:
    """The file's bytes, a MiB at a time, with no transaction held between reads."""
    if file.store_key is not None:
        with files.open(file.store_key) as reader:
            yield from iter(lambda: reader.read(PART_BYTES), b"")
        return
    yield from _database_parts(sessions, file.id)


def _database_parts(
    sessions: sessionmaker[Session], file_id: uuid.UUID, per_query: int = 8
) -> Iterator[bytes]:
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
