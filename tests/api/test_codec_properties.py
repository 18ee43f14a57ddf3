"""Property tests of the tensor codecs: JSON inputs (both forms), KServe v2's binary
tensors, the packed form jobs are stored in, .npy, .jsonl and Parquet batch files and
results. Any array of a datatype and shape a model takes comes back bit for bit (NaN,
infinities and -0.0 where the codec carries them, the extreme integers, text); any
other input is refused naming the input, and through HTTP that is a 4xx problem+json."""

from __future__ import annotations

import io
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from flask.testing import FlaskClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from app.batches import parquet, readers, results
from app.cards import ModelCard, TensorSpec
from app.errors import InvalidRequest
from app.runtime.datatypes import V2_TO_NUMPY, encode_bytes, from_raw
from app.runtime.tensors import InvalidInputs, pack, parse_inputs, to_json, unpack
from app.web import json_codec, kserve

bounded = settings(
    max_examples=100,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
NUMERIC = sorted(set(V2_TO_NUMPY) - {"BYTES"})
TEXT = st.text(st.characters(exclude_categories=["Cs"]), max_size=12)  # UTF-8 has no surrogates


def card_for(datatype: str, width: int) -> ModelCard:
    """A model of one input `x`: rows of `width` values of `datatype`."""
    return ModelCard(
        name="codec",
        version="1",
        path=Path("."),
        inputs=(TensorSpec("x", datatype, (-1, width)),),
        outputs=(TensorSpec("y", datatype, (-1, width)),),
    )


@st.composite
def tensors(draw: st.DrawFn, *, finite: bool, datatypes: list[str] = NUMERIC) -> np.ndarray:
    """Rows (1 to 5) of 1 to 6 values of a datatype; floats drawn with their edges."""
    datatype = draw(st.sampled_from(datatypes))
    shape = (draw(st.integers(1, 5)), draw(st.integers(1, 6)))
    if datatype == "BYTES":
        values = draw(st.lists(TEXT, min_size=math.prod(shape), max_size=math.prod(shape)))
        array = np.empty(shape, dtype=object)
        array.reshape(-1)[:] = values
        return array
    dtype = V2_TO_NUMPY[datatype]
    elements = None
    if dtype.kind == "f":
        edges = [0.0, -0.0, float(np.finfo(dtype).max), float(np.finfo(dtype).smallest_subnormal)]
        floats = st.floats(
            width=dtype.itemsize * 8, allow_nan=not finite, allow_infinity=not finite
        )
        elements = st.one_of(floats, st.sampled_from(edges + [-e for e in edges]))
    elif dtype.kind in "iu":
        info = np.iinfo(dtype)
        elements = st.one_of(
            st.integers(int(info.min), int(info.max)),
            st.sampled_from([int(info.min), int(info.max)]),
        )
    return draw(hnp.arrays(dtype, shape, elements=elements))


def datatype_of(array: np.ndarray) -> str:
    return (
        "BYTES"
        if array.dtype == object
        else next(name for name, dtype in V2_TO_NUMPY.items() if dtype == array.dtype)
    )


def same(got: np.ndarray, want: np.ndarray) -> None:
    """Bit for bit: dtype, shape and bytes (NaN payloads and -0.0 included), or text."""
    assert got.shape == want.shape
    if want.dtype == object:
        assert got.tolist() == want.tolist()
        return
    assert got.dtype == want.dtype
    assert np.ascontiguousarray(got).tobytes() == np.ascontiguousarray(want).tobytes()


# --- JSON inputs: {"x": nested list} and KServe v2 tensors -------------------


@bounded
@given(tensors(finite=True, datatypes=[*NUMERIC, "BYTES"]), st.booleans())
def test_json_inputs_round_trip_exactly(array: np.ndarray, as_v2: bool) -> None:
    card = card_for(datatype_of(array), array.shape[1])
    raw: Any = {"x": array.tolist()}
    if as_v2:
        raw = [
            {
                "name": "x",
                "shape": list(array.shape),
                "datatype": datatype_of(array),
                "data": array.reshape(-1).tolist(),
            }
        ]
    sent = json_codec.loads(json_codec.dumps_bytes(raw))  # as a client's body arrives
    parsed = parse_inputs(card, sent)
    same(parsed["x"], array)
    stored = json_codec.loads(json_codec.dumps_bytes(to_json(parsed)))  # as GET /jobs shows it
    same(parse_inputs(card, stored)["x"], array)


@bounded
@given(tensors(finite=True), st.data())
def test_json_inputs_that_do_not_fit_are_refused_naming_the_input(
    array: np.ndarray, data: st.DataObject
) -> None:
    datatype = datatype_of(array)
    width = array.shape[1]
    wrong = data.draw(st.sampled_from(["width", "text", "ragged", "nan", "datatype", "range"]))
    card = card_for(datatype, width)
    value: Any = array.tolist()
    if wrong == "width":
        card = card_for(datatype, width + 1)
    elif wrong == "text":
        value[0][0] = data.draw(TEXT)
    elif wrong == "ragged":
        value[0] = value[0] + value[0]
    elif wrong == "nan":
        card, value = card_for("FP32", width), np.where(np.isnan(array), 0, 1).tolist()
        value[-1][-1] = data.draw(st.sampled_from([math.nan, math.inf, -math.inf, 1e39]))
    elif wrong == "datatype":
        other = data.draw(st.sampled_from([d for d in NUMERIC if d != datatype]))
        raw = [
            {
                "name": "x",
                "shape": list(array.shape),
                "datatype": other,
                "data": array.reshape(-1).tolist(),
            }
        ]
        with pytest.raises(InvalidInputs) as refused:
            parse_inputs(card, raw)
        assert set(refused.value.errors) == {"x"} and datatype in refused.value.errors["x"]
        return
    else:  # an integer beyond the datatype, or a fraction for an integer datatype
        card = card_for(data.draw(st.sampled_from(["INT8", "UINT8", "INT16", "INT32"])), width)
        value[0][0] = data.draw(st.sampled_from([2**40, -(2**40), 0.5]))
    with pytest.raises(InvalidInputs) as refused:
        parse_inputs(card, {"x": value})
    assert set(refused.value.errors) == {"x"}
    assert "expected" in refused.value.errors["x"] or "NaN" in refused.value.errors["x"]


# --- KServe v2 binary tensors, and the packed form jobs are stored in ---------


@bounded
@given(tensors(finite=False, datatypes=[*NUMERIC, "BYTES"]))
def test_binary_tensors_and_packed_jobs_round_trip_exactly(array: np.ndarray) -> None:
    datatype = datatype_of(array)
    blob = (
        encode_bytes(array)
        if datatype == "BYTES"
        else array.astype(array.dtype.newbyteorder("<")).tobytes()
    )
    same(from_raw(datatype, list(array.shape), blob), _as_sent(array))
    same(unpack(pack({"x": array}))["x"], array)
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "x",
                    "shape": list(array.shape),
                    "datatype": datatype,
                    "parameters": {"binary_data_size": len(blob)},
                }
            ]
        }
    ).encode()
    call = kserve.decode_request(header + blob, str(len(header)))
    same(call.tensors[0]["data"], _as_sent(array))
    # The answer, with the output asked for as binary: the same bytes come back.
    card = card_for(datatype, array.shape[1])
    body, headers = kserve.encode_response(
        card,
        kserve.decode_request(
            json.dumps({"inputs": [], "parameters": {"binary_data_output": True}}).encode(), None
        ),
        {"y": array},
    )
    head = json.loads(body[: int(headers[kserve.HEADER_LENGTH])])
    out = head["outputs"][0]
    assert out["parameters"]["binary_data_size"] == len(blob)
    same(
        from_raw(out["datatype"], out["shape"], body[int(headers[kserve.HEADER_LENGTH]) :]),
        _as_sent(array),
    )


def _as_sent(array: np.ndarray) -> np.ndarray:
    """BYTES come back from binary as their UTF-8 bytes (parse_inputs makes them text)."""
    if array.dtype != object:
        return array
    encoded = np.empty(array.shape, dtype=object)
    encoded.reshape(-1)[:] = [s.encode() for s in array.reshape(-1)]
    return encoded


@bounded
@given(tensors(finite=False, datatypes=[*NUMERIC, "BYTES"]), st.data())
def test_binary_tensors_that_do_not_fit_are_refused_naming_the_input(
    array: np.ndarray, data: st.DataObject
) -> None:
    datatype = datatype_of(array)
    blob = encode_bytes(array) if datatype == "BYTES" else array.tobytes()
    cut = data.draw(st.integers(0, len(blob) - 1)) if blob else 0
    shape = list(array.shape)
    wrong = data.draw(st.sampled_from(["truncated", "shape", "datatype"]))
    if wrong == "truncated" and blob:
        blob = blob[:cut]
    elif wrong == "shape" or not blob:
        shape = [shape[0] + 1, shape[1]]
    else:
        datatype = data.draw(st.sampled_from(["FP8", "INT128", "", "fp32"]))
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "x",
                    "shape": shape,
                    "datatype": datatype,
                    "parameters": {"binary_data_size": len(blob)},
                }
            ]
        }
    ).encode()
    with pytest.raises(InvalidRequest) as refused:
        kserve.decode_request(header + blob, str(len(header)))
    assert list(refused.value.extra["errors"]) == ["inputs[0]"]


# --- batch files: .npy, .jsonl and Parquet in; .npy and Parquet results out ----


def _parts(data: bytes, size: int) -> Iterator[bytes]:
    return (data[i : i + size] for i in range(0, len(data), size))


def _npy(array: np.ndarray) -> bytes:
    out = io.BytesIO()
    np.save(out, array, allow_pickle=False)
    return out.getvalue()


def _parquet(table: pa.Table) -> bytes:
    out = io.BytesIO()
    pq.write_table(table, out, row_group_size=3)
    return out.getvalue()


def _fixed_lists(array: np.ndarray) -> pa.Array:
    return pa.FixedSizeListArray.from_arrays(pa.array(array.reshape(-1)), array.shape[1])


def _read(card: ModelCard, fmt: str, data: bytes, part: int, chunk_rows: int) -> np.ndarray:
    if fmt == "parquet":
        got = list(parquet.chunks(card, io.BytesIO(data), chunk_rows))
    else:
        got = list(readers.chunks(card, fmt, _parts(data, part), chunk_rows))
    return np.concatenate([c["x"] for c in got])


@bounded
@given(
    tensors(finite=True, datatypes=[d for d in NUMERIC if d != "FP16"]),
    st.sampled_from(["npy", "jsonl", "parquet"]),
    st.integers(1, 300),
    st.integers(1, 4),
)
def test_batch_files_round_trip_exactly(array: np.ndarray, fmt: str, part: int, rows: int) -> None:
    """FP16 is left out only because Parquet (Arrow) writes no half floats from numpy."""
    card = card_for(datatype_of(array), array.shape[1])
    data = {
        "npy": lambda: _npy(array),
        "jsonl": lambda: b"".join(json.dumps({"x": r}).encode() + b"\n" for r in array.tolist()),
        "parquet": lambda: _parquet(pa.table({"x": _fixed_lists(array)})),
    }[fmt]()
    same(_read(card, fmt, data, part, rows), array)


@bounded
@given(tensors(finite=False), st.sampled_from([results.NPY, results.PARQUET]), st.integers(1, 3))
def test_batch_results_round_trip_exactly(array: np.ndarray, fmt: str, rows: int) -> None:
    """Outputs may be NaN or infinite (a model computes them): .npy and Parquet keep them."""
    if fmt == results.PARQUET and array.dtype == np.float16:
        array = array.astype(np.float32)  # Arrow has no half floats from numpy
    card = card_for(datatype_of(array), array.shape[1])
    chunks = [
        results.Chunk(first, len(part), "succeeded", None, None, pack({"y": part}))
        for first, part in ((i, array[i : i + rows]) for i in range(0, len(array), rows))
    ]
    if fmt == results.NPY:
        got = np.load(io.BytesIO(b"".join(results.npy(["y"], len(array), iter(chunks)))))
        same(got, array)
        return
    table = pq.read_table(io.BytesIO(b"".join(results.parquet_file(card, ["y"], iter(chunks)))))
    column = table.column("y").combine_chunks()
    same(column.flatten().to_numpy(zero_copy_only=False).reshape(array.shape), array)


def test_an_npy_header_whose_dtype_is_no_literal_is_refused() -> None:
    """numpy reads '<,4' as a comma string and lets out a SyntaxError (a byte of the
    header changed, as the property below once drew)."""
    bad = _npy(np.zeros((3, 2), np.float32)).replace(b"'<f4'", b"'<,4'")
    with pytest.raises(readers.BadRows) as refused:
        _read(card_for("FP32", 2), "npy", bad, 1, 2)
    assert str(refused.value).startswith("row ")


@bounded
@given(tensors(finite=True, datatypes=["FP32", "INT64"]), st.data())
def test_npy_and_parquet_that_do_not_fit_are_refused(
    array: np.ndarray, data: st.DataObject
) -> None:
    card = card_for(datatype_of(array), array.shape[1])
    good = _npy(array)
    wrong = data.draw(st.sampled_from(["truncated", "header", "width", "nan", "column", "type"]))
    if wrong in ("column", "type"):
        column = (
            _fixed_lists(array) if wrong == "column" else pa.array([str(v) for v in array[:, 0]])
        )
        bad = _parquet(pa.table({"z" if wrong == "column" else "x": column}))
        with pytest.raises(readers.BadRows) as refused:
            _read(card, "parquet", bad, 1, 2)
        assert "x" in refused.value.errors, refused.value
        return
    if wrong == "truncated":
        bad = good[: data.draw(st.integers(0, len(good) - 1))]
    elif wrong == "header":
        at = data.draw(st.integers(0, 70))
        bad = good[:at] + bytes([good[at] ^ data.draw(st.integers(1, 255))]) + good[at + 1 :]
    elif wrong == "width":
        bad = _npy(np.concatenate([array, array], axis=1))
    else:
        bad = _npy(np.where(array == array, np.float32(math.nan), 0).astype(np.float32))
        card = card_for("FP32", array.shape[1])
    try:
        got = _read(card, "npy", bad, data.draw(st.integers(1, 100)), 2)
    except readers.BadRows as refused:
        assert str(refused).startswith("row ")
        if wrong in ("width", "nan"):
            assert "x" in refused.errors
        return
    # A flipped header byte may leave a well-formed .npy (another header length, a space
    # for a space): then its rows are those numpy reads, as the model's datatype.
    assert wrong == "header", wrong
    same(got, np.load(io.BytesIO(bad)).astype(array.dtype))


# --- through HTTP: a 4xx problem+json naming the input --------------------------

over_http = settings(
    max_examples=12,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def _problem(response: Any, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.data[:500]
    assert response.mimetype == "application/problem+json"
    body: dict[str, Any] = response.json
    assert body["status"] == status and body["detail"]
    return body


@over_http
@given(tensors(finite=True, datatypes=["FP32"]), st.data())
def test_binary_infer_that_does_not_fit_is_a_422_naming_the_input(
    client: FlaskClient, auth: dict[str, str], array: np.ndarray, data: st.DataObject
) -> None:
    pixels = np.resize(array, (array.shape[0], 64))
    blob = pixels.tobytes()
    blob = blob[: data.draw(st.integers(0, len(blob) - 1))]
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "pixels",
                    "shape": list(pixels.shape),
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": len(blob)},
                }
            ]
        }
    ).encode()
    response = client.post(
        "/v2/models/digits/infer",
        data=header + blob,
        headers={**auth, "Content-Type": kserve.BINARY, kserve.HEADER_LENGTH: str(len(header))},
    )
    body = _problem(response, 422)
    assert list(body["errors"]) == ["inputs[0]"] and "does not fit shape" in body["detail"]


@over_http
@given(
    st.lists(
        st.one_of(TEXT, st.none(), st.lists(st.integers(-(2**63), 2**63 - 1), max_size=2)),
        min_size=1,
        max_size=64,
    )
)
def test_a_job_of_non_numeric_json_is_a_422_naming_the_input(
    client: FlaskClient, auth: dict[str, str], values: list[Any]
) -> None:
    row: list[Any] = [0.0] * 64
    row[: len(values)] = values
    response = client.post(
        "/jobs", json={"model": "digits", "inputs": {"pixels": [row]}}, headers=auth
    )
    body = _problem(response, 422)
    assert list(body["errors"]) == ["pixels"] and "FP32" in body["detail"]


@settings(over_http, max_examples=8)
@given(st.sampled_from(["npy", "jsonl"]), st.data())
def test_a_batch_of_a_file_that_does_not_fit_is_a_422_naming_it(
    client: FlaskClient, auth: dict[str, str], fmt: str, data: st.DataObject
) -> None:
    good = _npy(np.zeros((3, 64), np.float32))
    if fmt == "npy":
        shape = data.draw(st.sampled_from([(-1, 64), (2, -64), (1, 2**62, 64), (3, 60)]))
        out = io.BytesIO()
        np.lib.format.write_array_header_1_0(
            out, {"descr": "<f4", "fortran_order": False, "shape": shape}
        )
        bad = out.getvalue() + good[128:]
    else:
        depth = data.draw(st.sampled_from([2, 3, 50_000]))
        bad = b"[" * depth + b"0" + b"]" * depth + b"\n"
    uploaded = client.post(f"/files?filename=rows.{fmt}", data=bad, headers=auth)
    assert uploaded.status_code == 201, uploaded.json
    response = client.post(
        "/batches", json={"model": "digits", "file_id": uploaded.json["id"]}, headers=auth
    )
    body = _problem(response, 422)
    assert body["errors"] and "the file does not fit model digits" in body["detail"]
