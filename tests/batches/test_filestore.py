"""The file store on a real directory and on a real S3-protocol server (moto's on
loopback, through s3fs): atomic writes, ranges, deletes, what other processes wrote,
keys that cannot escape."""

from __future__ import annotations

import gc
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import s3fs
from fsspec.implementations.local import LocalFileSystem

from app.platform.filestore import FileStore
from tests.s3 import BLOCK, S3
from tests.support import free_port

KEY = "batches/b1/results/00000001"


class Place:
    """Where a test's store lives: a directory, or a prefix of the test bucket."""

    def __init__(self, kind: str, tmp_path: Path, s3: S3 | None) -> None:
        self.kind, self.s3 = kind, s3
        self.root = tmp_path / "store"
        self.prefix = f"unit-{uuid.uuid4().hex[:12]}"

    def store(self, **options: Any) -> FileStore:
        if self.s3 is None:
            return FileStore(str(self.root), options)
        return FileStore(self.s3.url(self.prefix), {**self.s3.options, **options})

    def objects(self) -> list[str]:
        """Every object there, temporary files included."""
        if self.s3 is None:
            return sorted(
                str(p.relative_to(self.root)) for p in self.root.rglob("*") if p.is_file()
            )
        return sorted(self.s3.objects(self.prefix))

    def unfinished(self) -> list[str]:
        return [] if self.s3 is None else self.s3.unfinished_uploads(self.prefix)

    def fail_completing(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Every write fails as it completes: the rename into place (a directory), the
        completion of the upload (S3), as when the disk or the endpoint goes away."""

        def fail(*_: Any, **__: Any) -> None:
            raise OSError("the store went away")

        if self.s3 is None:
            monkeypatch.setattr(LocalFileSystem, "mv", fail)
        else:
            monkeypatch.setattr(s3fs.S3File, "commit", fail)


@pytest.fixture(params=["local", "s3"])
def place(request: pytest.FixtureRequest, tmp_path: Path) -> Place:
    s3 = request.getfixturevalue("s3") if request.param == "s3" else None
    return Place(request.param, tmp_path, s3)


@pytest.fixture
def unraisable(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """What `__del__` methods raised (and Python could only print) during the test."""
    seen: list[str] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: seen.append(repr(u.exc_value)))
    return seen


@pytest.mark.parametrize("size", [16, BLOCK + 1024 * 1024], ids=["small", "past-a-block"])
def test_an_object_appears_whole_or_not_at_all(
    place: Place, size: int, unraisable: list[str]
) -> None:
    store = place.store()
    store.write(KEY, b"first")
    with pytest.raises(RuntimeError), store.writer(KEY) as out:
        out.write(b"h" * size)  # past a block, s3fs has begun a multipart upload
        raise RuntimeError("the worker died mid-write")
    del out
    gc.collect()  # the abandoned file, closed by the collector, must not finish it either
    assert unraisable == []
    assert store.read(KEY) == b"first"  # the old one, whole
    assert place.objects() == [KEY] and place.unfinished() == []
    store.write(KEY, b"second")  # a retry replaces it
    assert store.read(KEY) == b"second"


def test_a_write_that_fails_as_it_completes_leaves_nothing_behind(
    place: Place, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = place.store()
    place.fail_completing(monkeypatch)
    with pytest.raises(OSError, match="went away"):
        store.write(KEY, b"x" * (BLOCK + 1024))
    assert place.objects() == [] and place.unfinished() == []


def test_ranges_sizes_and_deletes(place: Place) -> None:
    store = place.store()
    store.write("files/7/abc", bytes(range(100)))
    store.write("files/7/abcd", b"a key the first is a prefix of")
    assert store.read("files/7/abc", 10, 5) == bytes(range(10, 15))
    assert store.read("files/7/abc", 95) == bytes(range(95, 100))
    assert store.size("files/7/abc") == 100 and store.size("files/7/none") is None
    with pytest.raises(ValueError, match="no bytes 98-102"):
        store.read("files/7/abc", 98, 5)
    with pytest.raises(ValueError, match="no bytes 120-124"):  # S3: 416, not a store failure
        store.read("files/7/abc", 120, 5)
    with pytest.raises(FileNotFoundError):
        store.read("files/7/none")
    store.write("batches/x/inputs/00000000", b"a")
    store.write("batches/x/results/00000000", b"b")
    store.write("batches/xy/results/00000000", b"c")
    store.delete("batches/x")
    assert store.size("batches/x/inputs/00000000") is None
    assert store.size("batches/x/results/00000000") is None
    store.delete("files/7/abc")
    assert place.objects() == ["batches/xy/results/00000000", "files/7/abcd"]
    store.delete("batches/x")  # nothing there is fine
    store.delete("files/7/abc")


def test_a_store_sees_what_other_processes_wrote_and_deleted(place: Place) -> None:
    store = place.store()
    store.write("batches/b/results/00000000", b"a")
    store.write("batches/b/results/00000001", b"b")
    # A listing in this process, through the same filesystem (fsspec shares one per
    # storage options): s3fs would keep it and answer from it.
    assert len(store.fs.ls(f"{store.root}/batches/b/results")) == 2
    other = place.store(skip_instance_cache=True)  # its own client, as another process's
    other.write("batches/b/results/00000002", b"ccc")
    other.delete("batches/b/results/00000000")
    assert store.size("batches/b/results/00000002") == 3
    assert store.read("batches/b/results/00000002") == b"ccc"
    assert store.open("batches/b/results/00000002").read() == b"ccc"
    assert store.size("batches/b/results/00000000") is None
    store.delete("batches/b")
    assert place.objects() == []


@pytest.mark.parametrize(
    "key", ["../etc/passwd", "files/../../x", "/abs/path", "files/7/a b", "files", "files/7/.."]
)
def test_keys_cannot_leave_the_store(place: Place, key: str) -> None:
    store = place.store()
    with pytest.raises(ValueError, match="not a store key"):
        store.write(key, b"x")
    with pytest.raises(ValueError, match="not a store key"):
        store.read(key)
    with pytest.raises(ValueError, match="not a store key"):
        store.delete(key)
    assert place.objects() == []


def test_an_s3_store_that_does_not_answer_fails_with_oserror(s3: S3) -> None:
    """As a local disk's failures are, so callers take it for the store failing (a
    chunk is tried again later: store_unavailable), not for a bug of theirs."""
    gone = {"endpoint_url": f"http://127.0.0.1:{free_port()}",
            "config_kwargs": {"retries": {"total_max_attempts": 1}}}  # fmt: skip
    store = FileStore(s3.url("gone"), {**s3.options, **gone})
    calls: dict[str, Callable[[], object]] = {
        "write": lambda: store.write(KEY, b"x"),
        "read": lambda: store.read(KEY, 0, 1),
        "open": lambda: store.open(KEY),
        "size": lambda: store.size(KEY),
        "delete": lambda: store.delete(KEY),
    }
    for name, call in calls.items():
        with pytest.raises(OSError, match="the file store failed") as raised:
            call()
        assert "Could not connect" in str(raised.value), name
