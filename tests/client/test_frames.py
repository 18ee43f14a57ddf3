"""The client's batches with pandas and Parquet against the real service: a
DataFrame in, a DataFrame out (equal to the .npy results and to ONNX Runtime),
a Parquet file, rows that failed, frames the service refuses, and the progress
bars (tqdm on stderr) for uploads and rows."""

from __future__ import annotations

import sys
import uuid
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from tqdm import tqdm

from app.cards import ModelCard
from app.runtime.sessions import SessionPool
from inference_client import ApiError, Client
from tests.client.conftest import CHUNKED

RNG = np.random.default_rng(29)
PIXELS = [f"p{i}" for i in range(64)]


def pixels(rows: int) -> np.ndarray:
    return (RNG.random((rows, 64)) * 16).astype(np.float32)


def direct(model_repository: Path, x: np.ndarray) -> dict[str, np.ndarray]:
    """ONNX Runtime called directly on the model's file: the reference."""
    return SessionPool("cpu").run(ModelCard.load(model_repository / "digits" / "1"), {"pixels": x})


def wide(x: np.ndarray, **columns: object) -> pd.DataFrame:
    """A frame as data often comes: a column per pixel (float32), plus others."""
    return pd.DataFrame(x, columns=PIXELS).assign(**columns)


@pytest.mark.usefixtures("worker")
def test_a_dataframe_in_gives_a_dataframe_out_equal_to_the_npy_results(
    api: Client, model_repository: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    x = pixels(40)  # 3 chunks of at most 16 rows
    frame = wide(x, customer=[f"c{i}" for i in range(40)]).set_index(
        pd.Index([f"r{i}" for i in range(40)], name="key")
    )
    results = api.batches.run(CHUNKED, frame, columns={"pixels": PIXELS}, interval=0.2, timeout=180)
    out = results.to_pandas()
    assert results.batch.status == "succeeded" and results.batch.rows_done == 40
    assert list(out.columns) == ["label", "probabilities"]
    assert out.index.equals(frame.index)  # a row per input row, in input order: joinable
    assert out["label"].dtype == np.int64 and out["probabilities"].iloc[0].dtype == np.float32

    from_npy = api.batches.run(CHUNKED, x, interval=0.2, timeout=180).batch.id
    assert np.array_equal(out["label"].to_numpy(), api.batches.array(from_npy, output="label"))
    probabilities = np.stack(out["probabilities"].to_list())
    assert np.array_equal(probabilities, api.batches.array(from_npy, output="probabilities"))
    expected = direct(model_repository, x)
    assert np.array_equal(out["label"].to_numpy(), expected["label"])
    assert np.array_equal(probabilities, expected["probabilities"])

    # The service's own shape of a frame, a column per model input: the same.
    own = api.batches.run(CHUNKED, pd.DataFrame({"pixels": list(x)}), interval=0.2, timeout=180)
    pd.testing.assert_frame_equal(own.to_pandas(), out.reset_index(drop=True))
    # The rows stream as before, and the results also come as a Parquet file.
    assert [row.outputs["label"] for row in results if row.outputs] == expected["label"].tolist()
    saved = api.batches.download_results(results.batch.id, tmp_path / "out.parquet")
    pd.testing.assert_frame_equal(pd.read_parquet(saved), out.reset_index(drop=True))
    assert [p.name for p in tmp_path.iterdir()] == ["out.parquet"]  # no partial file left
    assert capsys.readouterr() == ("", "")  # progress=None without a terminal: silent


@pytest.mark.usefixtures("worker")
def test_a_parquet_file_runs_as_a_batch(
    api: Client, model_repository: Path, tmp_path: Path
) -> None:
    x = pixels(20)
    path = tmp_path / "rows.parquet"
    values = pa.array(x.astype(np.float64).tolist())  # list<double>: the service casts to FP32
    pq.write_table(pa.table({"id": list(range(20)), "pixels": values}), path)
    assert api.files.upload(path).format == "parquet"
    results = api.batches.run(CHUNKED, path, interval=0.2, timeout=180)
    assert results.batch.status == "succeeded", results.batch
    out = results.to_pandas()
    expected = direct(model_repository, x)
    assert out["label"].tolist() == expected["label"].tolist()
    assert np.array_equal(np.stack(out["probabilities"].to_list()), expected["probabilities"])


@pytest.mark.usefixtures("worker")
def test_rows_that_failed_come_out_with_their_error(api: Client, model_repository: Path) -> None:
    x = pixels(48)
    x[20] = 3e38  # the model's softmax gives NaN: rows 16-31 (chunk 1) cannot succeed
    results = api.batches.run(
        CHUNKED, wide(x), columns={"pixels": PIXELS}, interval=0.2, timeout=180
    )
    assert results.batch.status == "partially_succeeded", results.batch
    out = results.to_pandas()
    failed = np.zeros(48, bool)
    failed[16:32] = True
    assert len(out) == 48 and list(out.index) == list(range(48))
    assert list(out.columns) == ["label", "probabilities", "error", "error_message"]
    assert out["error"].isna().to_numpy().tolist() == (~failed).tolist()
    assert set(out["error"][failed]) == {"non_finite_output"}
    assert out["label"][failed].isna().all() and out["probabilities"][failed].isna().all()
    expected = direct(model_repository, x[~failed])
    assert out["label"][~failed].astype(np.int64).tolist() == expected["label"].tolist()
    assert np.array_equal(np.stack(out["probabilities"][~failed].to_list()),
                          expected["probabilities"])  # fmt: skip


@pytest.mark.parametrize(
    ("frame", "columns", "says"),
    [
        (pd.DataFrame({"pixel": [[1.0] * 64]}), None, "has no column pixels; it has pixel"),
        (pd.DataFrame({"pixels": ["1 2"]}), None, "column pixels is large_string; expected a"),
        (wide(pixels(2)), {"pixels": PIXELS[:63]}, "has 63 values in column pixels; expected 64"),
    ],
    ids=["missing-column", "wrong-type", "wrong-length"],
)
def test_a_frame_that_does_not_fit_the_model_gets_the_service_error(
    api: Client, frame: pd.DataFrame, columns: dict[str, list[str]] | None, says: str
) -> None:
    with pytest.raises(ApiError) as refused:
        api.batches.run(CHUNKED, frame, columns=columns)
    error = refused.value
    assert error.status == 422 and error.type == "/problems/invalid-input", error
    assert says in error.detail and "pixels" in error.errors, error


def test_columns_the_frame_lacks_are_named_before_any_request(api: Client) -> None:
    with pytest.raises(KeyError, match="no p63"):
        api.files.upload(wide(pixels(1)).drop(columns=["p63"]), columns={"pixels": PIXELS})


def test_without_pyarrow_the_error_says_what_to_install(
    api: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # as if it were not installed
    with pytest.raises(ImportError, match=r"inference_client\[parquet\]"):
        api.batches.frame(str(uuid.uuid4()))


def test_the_upload_bar_counts_every_byte(
    api: Client, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "rows.npy"
    np.save(path, pixels(2000))  # 512 KiB: read in many blocks
    size = path.stat().st_size
    uploaded = api.files.upload(path, progress=True)
    assert uploaded.size_bytes == size
    shown = tqdm.format_sizeof(size, divisor=1024)
    err = capsys.readouterr().err
    assert "upload rows.npy: 100%" in err and f" {shown}/{shown} " in err, err

    api.files.upload(path, progress=False)
    api.files.upload(path)  # None: stderr (captured here) is not a terminal
    assert capsys.readouterr() == ("", "")


@pytest.mark.usefixtures("worker")
def test_the_batch_bars_count_the_bytes_and_the_rows(
    api: Client, capsys: pytest.CaptureFixture[str]
) -> None:
    x = pixels(48)
    x[20] = 3e38  # rows 16-31 fail: finished rows count done and failed ones
    results = api.batches.run(CHUNKED, x, progress=True, interval=0.2, timeout=180)
    assert (results.batch.rows_done, results.batch.rows_failed) == (32, 16)
    err = capsys.readouterr().err
    shown = tqdm.format_sizeof(x.nbytes + 128, divisor=1024)  # .npy: a 128-byte header
    assert "upload rows.npy: 100%" in err and f" {shown}/{shown} " in err, err
    assert f"batch {results.batch.id[:8]}: 100%" in err and " 48/48 " in err, err
    assert "failed=16" in err, err
