"""`client.files`: input files for batches, uploaded from a path, bytes, an
array, a pandas DataFrame or rows, with a byte bar on a terminal."""

from __future__ import annotations

import io
import json
from collections.abc import Mapping, Sequence
from os import PathLike, fspath
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from inference_client import progress as bars
from inference_client import tensors
from inference_client.resources import UploadedFile

if TYPE_CHECKING:
    import numpy.typing as npt

    from inference_client.client import Client

    # What `upload` and `batches.run` take: a file path, the bytes of a file, a
    # numpy array, rows (a list), a pandas DataFrame (typed Any: pandas has no
    # type hints), or (batches.run only) inline inputs `{"<input>": rows}`.
    Source = (
        str | PathLike[str] | bytes | Sequence[Any] | Mapping[str, Any] | npt.NDArray[Any] | Any
    )

__all__ = ["Files"]


class Files:
    """Input files for batches (`client.files`)."""

    def __init__(self, client: Client) -> None:
        self._client = client

    def upload(
        self,
        source: Source,
        *,
        filename: str | None = None,
        columns: Mapping[str, Sequence[str]] | None = None,
        progress: bool | None = None,
    ) -> UploadedFile:
        """POST /files: a path (streamed from disk; .npy, .jsonl, .csv or
        .parquet), the bytes of a file (give `filename`, whose extension says the
        format), a numpy array (sent as .npy), a pandas DataFrame (sent as
        Parquet, a column per model input; `columns={"<input>": [column, ...]}`
        gathers several columns into one input) or rows (a list, sent as JSON
        Lines). `progress`: a byte bar on stderr; None shows it only when stderr
        is a terminal."""
        from inference_client import frames

        if isinstance(source, str | PathLike):
            path = Path(fspath(source))
            with path.open("rb") as file:
                return self._upload(file, path.stat().st_size, filename or path.name, progress)
        if isinstance(source, bytes | bytearray):
            if filename is None:
                raise ValueError("name the bytes' format: filename='rows.npy' "
                                 "(or .jsonl, .csv, .parquet)")  # fmt: skip
            return self._sent(bytes(source), filename, progress)
        if frames.is_frame(source):
            return self._sent(frames.to_parquet(source, columns), filename or "frame.parquet",
                              progress)  # fmt: skip
        if columns is not None:
            raise TypeError("columns= gathers a DataFrame's columns: give a DataFrame")
        if tensors.is_array(source):
            return self._sent(tensors.to_npy(source), filename or "rows.npy", progress)
        if isinstance(source, Sequence):
            lines = "".join(json.dumps(tensors.jsonable(row)) + "\n" for row in source)
            return self._sent(lines.encode(), filename or "rows.jsonl", progress)
        raise TypeError(f"cannot upload a {type(source).__name__}: give a path, bytes, an array, "
                        "a DataFrame or a list of rows")  # fmt: skip

    def _sent(self, data: bytes, filename: str, progress: bool | None) -> UploadedFile:
        return self._upload(io.BytesIO(data), len(data), filename, progress)

    def _upload(
        self, file: IO[bytes], size: int, filename: str, progress: bool | None
    ) -> UploadedFile:
        with bars.bar(progress, total=size, desc=f"upload {filename}", unit="B",
                      unit_scale=True, unit_divisor=1024) as shown:  # fmt: skip
            return UploadedFile.from_json(
                self._client._json(
                    "POST", "/files", params={"filename": filename},
                    data=bars.CountingReader(file, size, shown),
                    headers={"Content-Type": "application/octet-stream"},
                )
            )  # fmt: skip
