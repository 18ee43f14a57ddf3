"""OpenAI's names for the batch and file operations: /v1/files and /v1/batches.

An upload is a file of the file store, a batch one of the batch operations (its
lines cut into chunk jobs by the same split, run by the same workers, listed at
/batches too); what this adds is OpenAI's ids and objects, and the model a
batch runs, read from its file's first requests. A batch's output and error
files are read from its chunks each time they are asked for, never copied.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import IO, Any

from app.batches import openai_format, progress
from app.batches.tables import Batch, File
from app.errors import InvalidRequest, NotFound
from app.operations.batches import BatchOperations
from app.operations.files import FileOperations, Upload
from app.operations.requests import BatchRequest
from app.tenancy.keys import TenantRef

ENDPOINTS = tuple(openai_format.ENDPOINTS)
COMPLETION_WINDOW = openai_format.COMPLETION_WINDOW
_MAX_METADATA = 16


class OpenAIBatches:
    """Made for a call from the batch and file operations it names anew."""

    def __init__(self, batches: BatchOperations, files: FileOperations) -> None:
        self._batches, self._files, self.database = batches, files, batches.database

    # -- files -----------------------------------------------------------------

    def upload(self, tenant: TenantRef, filename: str, body: IO[bytes]) -> dict[str, Any]:
        """A batch's input file (JSONL, whatever its name), as OpenAI's FileObject."""
        return _file_object(self._files.upload(tenant, Upload(filename, "jsonl", body)))

    def file(self, tenant: TenantRef, file_id: str) -> dict[str, Any]:
        """An upload, or a finished batch's output or error file (its size counted)."""
        upload, batch, errors = self._file(tenant, file_id)
        if upload is not None:
            return _file_object(upload)
        assert batch is not None
        size = sum(len(part) for part in self._results(tenant, batch, errors))
        name = f"batch_{batch.id.hex}_{'error' if errors else 'output'}.jsonl"
        finished = batch.finished_at or batch.created_at
        return {"id": file_id, "object": "file", "bytes": size,
                "created_at": int(finished.timestamp()), "filename": name,
                "purpose": "batch_output", "status": "processed", "expires_at": None,
                "status_details": None}  # fmt: skip

    def content(self, tenant: TenantRef, file_id: str) -> Iterator[bytes]:
        """A file's bytes, streamed with no connection held while a client reads."""
        upload, batch, errors = self._file(tenant, file_id)
        if upload is not None:
            return self._files.content(tenant, upload.id)
        assert batch is not None
        return self._results(tenant, batch, errors)

    def list_files(self, tenant: TenantRef) -> list[dict[str, Any]]:
        return [_file_object(file) for file in self._files.list_files(tenant)]

    def delete_file(self, tenant: TenantRef, file_id: str) -> dict[str, Any]:
        upload, _, _ = self._file(tenant, file_id)
        if upload is None:
            raise InvalidRequest(f"{file_id} is a batch's results: they go with the batch",
                                 errors={"file_id": ["an uploaded file"]})  # fmt: skip
        self._files.delete(tenant, upload.id)
        return {"id": file_id, "object": "file", "deleted": True}

    def _file(self, tenant: TenantRef, file_id: str) -> tuple[File | None, Batch | None, bool]:
        """The upload, or the batch and whether its error file is meant; NotFound
        for an id that is not one of ours, or not the tenant's."""
        parsed = openai_format.parse_id(file_id, "file-")
        if parsed is None or parsed[1] not in ("", "output", "errors"):
            raise NotFound(f"no file with id {file_id}")
        key, kind = parsed
        if not kind:
            return self._files.get(tenant, key), None, False
        return None, self._batch(tenant, key), kind == "errors"

    def _results(self, tenant: TenantRef, batch: Batch, errors: bool) -> Iterator[bytes]:
        fmt = openai_format.ERRORS if errors else openai_format.OUTPUT
        return self._batches.results(tenant, batch.id, fmt, None)[0]

    # -- batches ---------------------------------------------------------------

    def create(
        self, tenant: TenantRef, input_file_id: str, endpoint: str,
        metadata: dict[str, str] | None = None,
    ) -> dict[str, Any]:  # fmt: skip
        """A batch of the file's requests, of the model they name; the file is read
        whole (custom_ids, models) and cut by a worker while it is `validating`."""
        if endpoint not in openai_format.ENDPOINTS:
            raise InvalidRequest(f"endpoint: expected one of {', '.join(ENDPOINTS)}",
                                 errors={"endpoint": list(ENDPOINTS)})  # fmt: skip
        _check_metadata(metadata)
        parsed = openai_format.parse_id(input_file_id, "file-")
        if parsed is None or parsed[1]:
            raise NotFound(f"no file with id {input_file_id}")
        file, head = self._files.head(tenant, parsed[0])
        try:
            model = openai_format.model_of(head)
        except openai_format.FileRefused as exc:
            raise InvalidRequest(f"input_file_id: {exc}", errors=exc.errors) from None
        spec = {"endpoint": endpoint, "input_file_id": input_file_id, "metadata": metadata}
        made = self._batches.create(tenant, BatchRequest(model, file_id=file.id, openai=spec))
        return self.get(tenant, openai_format.batch_id(made["id"]))

    def get(self, tenant: TenantRef, batch: str) -> dict[str, Any]:
        found = self._batch(tenant, self._key(batch))
        return openai_format.batch_object(found, progress.progress(self.database.session(), found))

    def list_batches(self, tenant: TenantRef, limit: int, after: str | None) -> dict[str, Any]:
        """OpenAI's cursor page of the tenant's batches, newest first."""
        session = self.database.session()
        before = self._batch(tenant, self._key(after)) if after else None
        found = progress.list_batches(session, tenant.id, limit + 1, after=before, openai=True)
        data = [openai_format.batch_object(b, progress.progress(session, b)) for b in found]
        return {"object": "list", "data": data[:limit], "has_more": len(data) > limit,
                "first_id": data[0]["id"] if data else None,
                "last_id": data[: limit][-1]["id"] if data else None}  # fmt: skip

    def cancel(self, tenant: TenantRef, batch: str) -> dict[str, Any]:
        key = self._key(batch)
        self._batch(tenant, key)
        self._batches.cancel(tenant, key)
        return self.get(tenant, batch)

    @staticmethod
    def _key(batch: str) -> uuid.UUID:
        parsed = openai_format.parse_id(batch, "batch_")
        if parsed is None or parsed[1]:
            raise NotFound(f"no batch with id {batch}")
        return parsed[0]

    def _batch(self, tenant: TenantRef, key: uuid.UUID) -> Batch:
        """The tenant's batch made in OpenAI's format (any other is not found here)."""
        batch = progress.get(self.database.session(), tenant.id, key)
        if batch.openai is None:
            raise NotFound(f"no batch with id {openai_format.batch_id(key)}")
        return batch


def _file_object(file: File) -> dict[str, Any]:
    return {"id": openai_format.upload_id(file.id), "object": "file", "bytes": file.size_bytes,
            "created_at": int(file.created_at.timestamp()), "filename": file.filename,
            "purpose": "batch", "status": "processed", "expires_at": None,
            "status_details": None}  # fmt: skip


def _check_metadata(metadata: Any) -> None:
    """OpenAI's rule: at most 16 pairs of strings (keys to 64 characters, values to 512)."""
    if metadata is None:
        return
    fits = (
        isinstance(metadata, dict)
        and len(metadata) <= _MAX_METADATA
        and all(
            isinstance(k, str) and isinstance(v, str) and len(k) <= 64 and len(v) <= 512
            for k, v in metadata.items()
        )
    )
    if not fits:
        expected = "at most 16 pairs of strings (keys up to 64 characters, values up to 512)"
        raise InvalidRequest(f"metadata: expected {expected}", errors={"metadata": [expected]})
