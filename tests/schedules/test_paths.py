"""A tenant's data area: paths that lead out are refused, folders of .npy files
read as one array, without loading them."""

from __future__ import annotations

import io
import os
from pathlib import Path

import numpy as np
import pytest

from app.batches import readers
from app.errors import InvalidRequest
from app.schedules import paths
from tests.batches.test_readers import CARD


def test_paths_that_lead_out_are_refused(tmp_path: Path) -> None:
    root = tmp_path / "acme"
    (root / "in").mkdir(parents=True)
    os.symlink(tmp_path, root / "up")
    assert paths.inside(root, "in/x.npy", "input_path") == (root / "in" / "x.npy").resolve()
    for bad in ("../bob", "/etc/passwd", "in/../../bob", "up/bob", "C:/x", "", "a\x00b"):
        with pytest.raises(InvalidRequest):
            paths.inside(root, bad, "input_path")


def test_a_folder_of_npy_files_reads_as_one_array(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    parts = [rng.random((n, 64)).astype(np.float32) for n in (5, 11, 3)]
    for i, part in enumerate(parts):
        np.save(tmp_path / f"{i}.npy", part)
    (tmp_path / "notes.txt").write_text("ignored")
    fmt, found = paths.input_files(tmp_path, ".")
    assert fmt == "npy" and [p.name for p in found] == ["0.npy", "1.npy", "2.npy"]
    data = b"".join(paths.read(fmt, found))
    assert np.array_equal(np.load(io.BytesIO(data)), np.concatenate(parts))
    chunks = list(readers.chunks(CARD, "npy", [data], 7))
    assert np.array_equal(np.concatenate([c["pixels"] for c in chunks]), np.concatenate(parts))
    np.save(tmp_path / "3.npy", rng.random((2, 8)).astype(np.float32))
    with pytest.raises(paths.InputUnavailable, match="row shape"):
        list(paths.read(*paths.input_files(tmp_path, ".")))
    (tmp_path / "4.jsonl").write_text("[1]\n")
    with pytest.raises(paths.InputUnavailable, match="mixes formats"):
        paths.input_files(tmp_path, ".")
