"""Reading a batch's rows in chunks from a file cut into parts at any byte: the
same rows whatever the part size, resumable from any chunk, bad rows named."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from app.batches import readers
from app.cards import ModelCard, TensorSpec

CARD = ModelCard(
    name="digits", version="1", path=Path("."),
    inputs=(TensorSpec("pixels", "FP32", (-1, 64)),),
    outputs=(TensorSpec("label", "INT64", (-1,)),),
)  # fmt: skip
PIXELS = (np.random.default_rng(3).random((103, 64)) * 16).astype(np.float32)


def encoded(fmt: str, pixels: np.ndarray = PIXELS) -> bytes:
    if fmt == "npy":
        out = io.BytesIO()
        np.save(out, pixels)
        return out.getvalue()
    if fmt == "jsonl":
        return "".join(json.dumps({"pixels": r.tolist()}) + "\n" for r in pixels).encode()
    return "".join(",".join(repr(float(v)) for v in r) + "\r\n" for r in pixels).encode()


def parts(data: bytes, size: int) -> Iterator[bytes]:
    return (data[i : i + size] for i in range(0, len(data), size))


@pytest.mark.parametrize("fmt", readers.FORMATS)
@pytest.mark.parametrize("part_size", [7, 1000, 1 << 20])
def test_rows_come_back_whole_in_order_whatever_the_part_size(fmt: str, part_size: int) -> None:
    chunks = list(readers.chunks(CARD, fmt, parts(encoded(fmt), part_size), 16))
    assert [len(c["pixels"]) for c in chunks] == [16] * 6 + [7]
    assert np.array_equal(np.concatenate([c["pixels"] for c in chunks]), PIXELS)


@pytest.mark.parametrize("fmt", ["jsonl", "csv"])
def test_text_is_parsed_in_blocks_and_joined_into_whole_chunks(
    fmt: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A chunk of text rows is parsed TEXT_BLOCK_ROWS at a time (never a whole large
    chunk's Python objects at once), yet comes back as chunks of exactly chunk_rows."""
    monkeypatch.setattr(readers, "TEXT_BLOCK_ROWS", 7)
    gathered: list[int] = []
    gather = readers._gathered

    def counted(rows: Iterator[dict[str, object]], names: list[str], n: int) -> Iterator[dict]:
        for block in gather(rows, names, n):
            gathered.append(len(block["pixels"]))
            yield block

    monkeypatch.setattr(readers, "_gathered", counted)
    chunks = list(readers.chunks(CARD, fmt, parts(encoded(fmt), 500), 20, skip_rows=3))
    assert [len(c["pixels"]) for c in chunks] == [20] * 5
    assert np.array_equal(np.concatenate([c["pixels"] for c in chunks]), PIXELS[3:])
    assert max(gathered) == 7 and sum(gathered) == 100


@pytest.mark.parametrize("fmt", readers.FORMATS)
def test_a_split_resumes_after_the_rows_it_already_cut(fmt: str) -> None:
    chunks = list(readers.chunks(CARD, fmt, parts(encoded(fmt), 333), 16, skip_rows=48))
    assert np.array_equal(np.concatenate([c["pixels"] for c in chunks]), PIXELS[48:])


def test_bad_rows_are_named() -> None:
    lines = encoded("jsonl").decode().splitlines()
    lines[40] = '{"pixels": [1, 2]}'
    with pytest.raises(readers.BadRows) as bad:
        list(readers.chunks(CARD, "jsonl", ["\n".join(lines).encode()], 16))
    assert bad.value.first_row == 32 and "pixels" in str(bad.value)
    with pytest.raises(readers.BadRows, match="row 5: is not JSON"):
        list(readers.chunks(CARD, "jsonl", [b"[0]\n" * 5 + b"{oops\n"], 16))
    with pytest.raises(readers.BadRows, match="not a number"):
        list(readers.chunks(CARD, "csv", [b"1,2\nx,3\n"], 16))
    truncated = encoded("npy")[:-100]
    with pytest.raises(readers.BadRows, match="ends early"):
        list(readers.chunks(CARD, "npy", [truncated], 16))
    with pytest.raises(readers.BadRows, match="not UTF-8"):
        list(readers.chunks(CARD, "jsonl", [b"\xff\xfe\n"], 16))


def test_npy_of_another_dtype_is_converted_and_objects_are_refused() -> None:
    as_float64 = list(readers.chunks(CARD, "npy", [encoded("npy", PIXELS.astype(np.float64))], 200))
    assert as_float64[0]["pixels"].dtype == np.float32
    assert np.array_equal(as_float64[0]["pixels"], PIXELS)
    out = io.BytesIO()
    np.save(out, np.array([[1, "a"]], dtype=object), allow_pickle=True)
    with pytest.raises(readers.BadRows, match="pickle"):
        list(readers.chunks(CARD, "npy", [out.getvalue()], 16))


@pytest.mark.parametrize("shape", [(-1, 64), (3, -64), (1, 2**62, 64)])
def test_npy_header_of_a_shape_no_array_has_is_a_bad_file(shape: tuple[int, ...]) -> None:
    """numpy's header reader takes a negative dimension (read as no rows, or rows of
    no values) and a shape whose byte count wraps round an int64 (then a reshape
    failed: a 500 where the file was checked at POST /batches)."""
    out = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        out, {"descr": "<f4", "fortran_order": False, "shape": shape}
    )
    with pytest.raises(readers.BadRows, match=r"row 0: not a readable \.npy file .*shape"):
        list(readers.chunks(CARD, "npy", [out.getvalue() + bytes(64)], 16))


def test_a_jsonl_line_nested_too_deeply_is_a_bad_row() -> None:
    """json's decoder recurses per level: a line of 100,000 '[' was a RecursionError."""
    data = b"[" + b",".join([b"0"] * 64) + b"]\n"
    with pytest.raises(readers.BadRows, match=r"row 2: .*nested too deeply"):
        list(readers.chunks(CARD, "jsonl", [data * 2 + b"[" * 100_000 + b"\n"], 16))


def test_npy_header_numpy_cannot_tokenize_is_a_bad_file() -> None:
    """An unclosed bracket in the header: numpy's retry with its filter for Python 2
    headers raised tokenize.TokenError, which is no ValueError (a 500)."""
    good = encoded("npy", PIXELS[:2])
    bad = good.replace(b"'shape': (2, 64)", b"'shape': (2, 64(")
    assert bad != good
    with pytest.raises(readers.BadRows, match=r"row 0: not a readable \.npy file"):
        list(readers.chunks(CARD, "npy", [bad], 16))
