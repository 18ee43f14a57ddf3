"""The file store on a real directory: atomic writes, ranges, keys that cannot escape."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.platform.filestore import FileStore


def test_an_object_appears_whole_or_not_at_all(tmp_path: Path) -> None:
    store = FileStore(str(tmp_path))
    store.write("batches/b1/results/00000001", b"first")
    with pytest.raises(RuntimeError), store.writer("batches/b1/results/00000001") as out:
        out.write(b"half of a second")
        raise RuntimeError("the worker died mid-write")
    assert store.read("batches/b1/results/00000001") == b"first"  # the old one, whole
    assert [p.name for p in (tmp_path / "batches" / "b1" / "results").iterdir()] == ["00000001"]
    store.write("batches/b1/results/00000001", b"second")  # a retry replaces it
    assert store.read("batches/b1/results/00000001") == b"second"


def test_ranges_sizes_and_deletes(tmp_path: Path) -> None:
    store = FileStore(str(tmp_path))
    store.write("files/7/abc", bytes(range(100)))
    assert store.read("files/7/abc", 10, 5) == bytes(range(10, 15))
    assert store.size("files/7/abc") == 100 and store.size("files/7/none") is None
    with pytest.raises(ValueError, match="no bytes 98-102"):
        store.read("files/7/abc", 98, 5)
    store.write("batches/x/inputs/00000000", b"a")
    store.write("batches/x/results/00000000", b"b")
    store.delete("batches/x")
    assert store.size("batches/x/inputs/00000000") is None
    assert store.size("files/7/abc") == 100
    store.delete("batches/x")  # nothing there is fine


@pytest.mark.parametrize(
    "key", ["../etc/passwd", "files/../../x", "/abs/path", "files/7/a b", "files", "files/7/.."]
)
def test_keys_cannot_leave_the_store(tmp_path: Path, key: str) -> None:
    store = FileStore(str(tmp_path / "store"))
    with pytest.raises(ValueError, match="not a store key"):
        store.write(key, b"x")
    with pytest.raises(ValueError, match="not a store key"):
        store.read(key)
