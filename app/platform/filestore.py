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
a key again replaces it whole.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO, Any

import fsspec
from fsspec.implementations.local import LocalFileSystem

_KEY = re.compile(r"[a-z]+(/[A-Za-z0-9_-]+)+")


class FileStore:
    """Objects under one root URL; `options` are fsspec's storage options
    (for s3fs: endpoint_url, key, secret, client_kwargs...)."""

    def __init__(self, url: str, options: dict[str, Any] | None = None) -> None:
        fs, root = fsspec.core.url_to_fs(url, **(options or {}))
        self.fs, self.root = fs, root.rstrip("/")
        self._local = isinstance(fs, LocalFileSystem)
        if self._local:
            fs.makedirs(self.root, exist_ok=True)

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
        if self._local:
            self.fs.makedirs(final.rpartition("/")[0], exist_ok=True)
        out = self.fs.open(target, "wb")
        try:
            yield out
        except BaseException:
            if self._local:
                out.close()
                self.fs.rm_file(target)
            else:
                out.discard()  # an unfinished upload is abandoned, never completed
            raise
        out.close()
        if self._local:
            self.fs.mv(target, final)

    def write(self, key: str, data: bytes) -> int:
        with self.writer(key) as out:
            out.write(data)
        return len(data)

    def read(self, key: str, offset: int = 0, size: int | None = None) -> bytes:
        """`size` bytes from `offset` (to the end if None): only those are fetched."""
        end = None if size is None else offset + size
        data: bytes = self.fs.cat_file(self.path(key), start=offset, end=end)
        if size is not None and len(data) != size:
            raise ValueError(f"object {key} has no bytes {offset}-{offset + size - 1}")
        return data

    def open(self, key: str) -> IO[bytes]:
        """A seekable reader (Parquet reads its footer first, then row groups)."""
        reader: IO[bytes] = self.fs.open(self.path(key), "rb")
        return reader

    def size(self, key: str) -> int | None:
        """The object's size, None if there is none."""
        try:
            return int(self.fs.size(self.path(key)))
        except FileNotFoundError:
            return None

    def delete(self, key: str) -> None:
        """Remove the object, or every object under `key/`; nothing there is fine."""
        path = self.path(key)
        if self.fs.exists(path):
            self.fs.rm(path, recursive=True)
