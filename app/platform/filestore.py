"""The file store: uploaded batch inputs and batch results, as objects by key.

A local directory by default (VAR_DIR/files), any fsspec URL in production
(`s3://bucket/prefix` through s3fs), so the bytes of a batch never pass
through PostgreSQL, which keeps only their metadata. Every API and worker
process must name the same store: a worker reads the rows the API stored.

Keys are made by the service from ids it generated (never from a client's
file name), and checked here, so no key can leave the store's root.
Writes are atomic: on a local disk an object is written under a temporary
name and renamed into place; an object store makes an object visible only
once its upload completes. A reader never sees half an object, and writing
a key again replaces it whole; a write that fails leaves nothing behind (no
temporary file, no unfinished multipart upload).

Every process reads what the others wrote: no listing is cached (s3fs would
answer `size` and `open` from a folder's listing, missing what another
process wrote since). The store failing (unreachable, timing out, refusing the
credentials) is an OSError, as a local disk's failures are, whatever the
backend's client raises: callers retry it (a chunk's `store_unavailable`).
"""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO, Any

import fsspec
from fsspec.implementations.local import LocalFileSystem

_KEY = re.compile(r"[a-z]+(/[A-Za-z0-9_-]+)+")

logger = logging.getLogger(__name__)


def _client_errors(protocol: str) -> tuple[type[Exception], ...]:
    """What a backend's client raises, besides OSError, when the store fails: for
    s3fs, botocore's errors (an endpoint that does not answer, a timeout, no
    credentials) come through as they are."""
    if protocol in ("s3", "s3a"):
        from botocore.exceptions import BotoCoreError

        return (BotoCoreError,)
    return ()


class FileStore:
    """Objects under one root URL; `options` are fsspec's storage options
    (for s3fs: endpoint_url, key, secret, client_kwargs...)."""

    def __init__(self, url: str, options: dict[str, Any] | None = None) -> None:
        protocol = fsspec.utils.get_protocol(url)
        options = dict(options or {})
        if protocol not in ("file", "local"):
            # Other processes write and delete objects: a listing kept here goes stale.
            options.setdefault("use_listings_cache", False)
        fs, root = fsspec.core.url_to_fs(url, **options)
        self.fs, self.root = fs, root.rstrip("/")
        self._local = isinstance(fs, LocalFileSystem)
        self._client_errors = _client_errors(protocol)
        if self._local:
            fs.makedirs(self.root, exist_ok=True)

    @contextmanager
    def _failing(self) -> Iterator[None]:
        """The store's failures as OSError, whatever its client raised."""
        try:
            yield
        except self._client_errors as exc:
            raise OSError(f"the file store failed: {exc}") from exc

    def path(self, key: str) -> str:
        if not _KEY.fullmatch(key):
            raise ValueError(f"not a store key: {key!r}")
        return f"{self.root}/{key}"

    @contextmanager
    def writer(self, key: str) -> Iterator[IO[bytes]]:
        """A file to write the object to; it appears under `key` only when the block
        ends without an error (and replaces what was there)."""
        final = self.path(key)
        target = f"{final}.tmp-{uuid.uuid4().hex}" if self._local else final
        with self._failing():
            if self._local:
                self.fs.makedirs(final.rpartition("/")[0], exist_ok=True)
            out = self.fs.open(target, "wb")
        try:
            yield out
            out.close()  # S3: the upload completes, and the object appears
            if self._local:
                self.fs.mv(target, final)
        except BaseException as exc:
            self._abandon(out, target)
            if isinstance(exc, self._client_errors):
                raise OSError(f"the file store failed: {exc}") from exc
            raise

    def _abandon(self, out: Any, target: str) -> None:
        """Undo a write that failed, as far as the store lets us (a failure here is
        logged: the write's own error is the one to raise)."""
        try:
            if self._local:
                out.close()
                self.fs.rm_file(target)
            else:
                out.discard()  # an unfinished upload is aborted, never completed
        except Exception:
            logger.warning("could not clean up after a failed write of %s", target, exc_info=True)
        finally:
            if not self._local:
                # s3fs leaves a discarded file open: closed later by the garbage
                # collector, it would try to finish the upload (and fail, in __del__).
                out.closed = True

    def write(self, key: str, data: bytes) -> int:
        with self.writer(key) as out:
            out.write(data)
        return len(data)

    def read(self, key: str, offset: int = 0, size: int | None = None) -> bytes:
        """`size` bytes from `offset` (to the end if None): only those are fetched.
        ValueError if the object holds fewer."""
        end = None if size is None else offset + size
        path = self.path(key)
        with self._failing():
            try:
                data: bytes = self.fs.cat_file(path, start=offset, end=end)
            except FileNotFoundError:
                raise
            except OSError:
                # S3 refuses a range that starts past the object's end (416): no bytes,
                # as from a file on disk, not the store failing.
                known = self.size(key) if offset else None
                if known is None or offset < known:
                    raise
                data = b""
        if size is not None and len(data) != size:
            raise ValueError(f"object {key} has no bytes {offset}-{offset + size - 1}")
        return data

    def open(self, key: str) -> IO[bytes]:
        """A seekable reader (Parquet reads its footer first, then row groups)."""
        with self._failing():
            reader: IO[bytes] = self.fs.open(self.path(key), "rb")
        return reader

    def size(self, key: str) -> int | None:
        """The object's size, None if there is none."""
        path = self.path(key)
        try:
            with self._failing():
                return int(self.fs.size(path))
        except FileNotFoundError:
            return None

    def delete(self, key: str) -> None:
        """Remove the object, or every object under `key/`; nothing there is fine."""
        path = self.path(key)
        with self._failing():
            if self.fs.exists(path):
                self.fs.rm(path, recursive=True)
