"""Uploaded input files of a tenant: stored (bytes in the file store, metadata in
PostgreSQL) within the upload limit and the tenant's storage quota, listed, read,
deleted once nothing reads them. Each change is one unit of work."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO

from app.batches import files
from app.batches.files import FORMATS, format_of
from app.batches.tables import File
from app.errors import Conflict, TooLarge
from app.platform.database import Database, transactional
from app.platform.filestore import FileStore
from app.schedules.definitions import reader_of
from app.tenancy.keys import TenantRef
from app.tenancy.quotas import Quotas

__all__ = ["FORMATS", "File", "FileOperations", "Upload", "format_of"]


@dataclass(frozen=True)
class Upload:
    """A file as a door receives it: its name, its format, and its bytes as a stream."""

    filename: str
    format: str
    body: IO[bytes]


class FileOperations:
    def __init__(
        self, database: Database, store: FileStore, quotas: Quotas, max_upload_bytes: int
    ) -> None:
        """`max_upload_bytes`: MAX_UPLOAD_BYTES, the largest file a tenant may send."""
        self.database, self._store, self._quotas = database, store, quotas
        self.max_upload_bytes = max_upload_bytes

    def upload(self, tenant: TenantRef, upload: Upload) -> File:
        """Store an upload (committed); TooLarge past MAX_UPLOAD_BYTES, QuotaExceeded
        past what the tenant may still store, InsufficientStorage or Unavailable
        where the store cannot take it."""
        room = self._quotas.admit_upload(self.database.session(), tenant.id, 0)
        limit = self.max_upload_bytes if room is None else min(self.max_upload_bytes, room)
        try:
            return self._store_file(tenant, upload, limit)
        except TooLarge:
            if room is not None and limit < self.max_upload_bytes:  # the quota, read afresh
                self._quotas.admit_upload(self.database.session(), tenant.id, limit + 1)
            raise

    @transactional
    def _store_file(self, tenant: TenantRef, upload: Upload, limit: int) -> File:
        try:
            return files.store_parts(
                self.database.session(), self._store, tenant.id, upload.filename,
                upload.format, files.read_parts(upload.body), limit,
            )  # fmt: skip
        except OSError as exc:
            raise files.store_refused(exc) from exc

    def get(self, tenant: TenantRef, file_id: uuid.UUID) -> File:
        return files.get(self.database.session(), tenant.id, file_id)

    def list_files(self, tenant: TenantRef) -> list[File]:
        return files.list_files(self.database.session(), tenant.id)

    def head(self, tenant: TenantRef, file_id: uuid.UUID) -> tuple[File, bytes]:
        """The upload and its first MiB (to check its first rows by)."""
        session = self.database.session()
        file = files.get(session, tenant.id, file_id)
        return file, files.head(session, self._store, file)

    def content(self, tenant: TenantRef, file_id: uuid.UUID) -> Iterator[bytes]:
        """The upload's bytes, streamed with no connection held while a client reads."""
        file = files.get(self.database.session(), tenant.id, file_id)
        self.database.end_reads()
        return files.parts(self.database.sessionmaker, self._store, file)

    @transactional
    def delete(self, tenant: TenantRef, file_id: uuid.UUID) -> None:
        """Delete an upload, and then (once committed) its object; Conflict while a
        batch or a schedule reads it."""
        session = self.database.session()
        file = files.unread(session, tenant.id, file_id)
        if (schedule := reader_of(session, file_id)) is not None:
            raise Conflict(f"schedule {schedule!r} reads file {file_id}; change or delete it first")
        key = files.remove(session, file)
        if key is not None:
            self.database.once_committed(lambda: self._store.delete(key))
