"""What the service answers, as typed dataclasses. Each keeps the JSON it came
from in `raw`, so members a newer service adds are never lost."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from inference_client.client import Client

JOB_TERMINAL = frozenset({"succeeded", "failed", "cancelled", "expired"})
BATCH_TERMINAL = frozenset({"succeeded", "partially_succeeded", "failed", "cancelled"})


def _time(value: Any) -> datetime | None:
    return datetime.fromisoformat(value) if isinstance(value, str) and value else None


def _float(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) else None


def _int(value: Any) -> int | None:
    return int(value) if isinstance(value, int) else None


@dataclass(frozen=True)
class JobError:
    """Why a job (or a batch, or a batch's row) has no outputs."""

    code: str
    message: str | None = None

    @classmethod
    def from_json(cls, data: Any) -> JobError | None:
        if not isinstance(data, Mapping) or data.get("code") is None:
            return None
        message = data.get("message")
        return cls(str(data["code"]), str(message) if message is not None else None)


@dataclass(frozen=True)
class Job:
    """A job as GET /jobs/<id> shows it. `outputs` are nested lists, by output name."""

    id: str
    status: str
    model: str
    model_version: str | None = None
    outputs: dict[str, Any] | None = None
    error: JobError | None = None
    attempts: int = 0
    max_attempts: int | None = None
    webhook: dict[str, Any] | None = None
    deadline_at: datetime | None = None
    cancel_requested_at: datetime | None = None
    purged_at: datetime | None = None
    created_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    queued_seconds: float | None = None
    running_seconds: float | None = None
    priority: int | None = None
    compute_seconds: float | None = None
    batch_share: float | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def finished(self) -> bool:
        """Succeeded, failed, cancelled or expired: it will not change again."""
        return self.status in JOB_TERMINAL

    @property
    def succeeded(self) -> bool:
        return self.status == "succeeded"

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Job:
        outputs, webhook = data.get("outputs"), data.get("webhook")
        return cls(
            id=str(data["id"]),
            status=str(data["status"]),
            model=str(data.get("model", "")),
            model_version=data.get("model_version"),
            outputs=dict(outputs) if isinstance(outputs, Mapping) else None,
            error=JobError.from_json(data.get("error")),
            attempts=_int(data.get("attempts")) or 0,
            max_attempts=_int(data.get("max_attempts")),
            webhook=dict(webhook) if isinstance(webhook, Mapping) else None,
            deadline_at=_time(data.get("deadline_at")),
            cancel_requested_at=_time(data.get("cancel_requested_at")),
            purged_at=_time(data.get("purged_at")),
            created_at=_time(data.get("created_at")),
            started_at=_time(data.get("started_at")),
            finished_at=_time(data.get("finished_at")),
            queued_seconds=_float(data.get("queued_seconds")),
            running_seconds=_float(data.get("running_seconds")),
            priority=_int(data.get("priority")),
            compute_seconds=_float(data.get("compute_seconds")),
            batch_share=_float(data.get("batch_share")),
            raw=dict(data),
        )


@dataclass(frozen=True)
class Event:
    """One Server-Sent Event of a job: `type` is `job.<status>`; the terminal
    event's data carries the whole job. A generation's `output` events carry a
    piece of its text in `text` (their data is not JSON): joined, the pieces are
    the job's `outputs["text"]`."""

    id: int | None
    type: str
    data: dict[str, Any]
    text: str | None = None

    @property
    def status(self) -> str | None:
        status = self.data.get("status")
        return str(status) if status is not None else None

    @property
    def terminal(self) -> bool:
        return self.status in JOB_TERMINAL

    @property
    def job(self) -> Job | None:
        job = self.data.get("job")
        return Job.from_json(job) if isinstance(job, Mapping) else None


@dataclass(frozen=True)
class UploadedFile:
    """An input file stored by POST /files, for batches."""

    id: str
    filename: str
    format: str
    size_bytes: int
    sha256: str | None = None
    created_at: datetime | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> UploadedFile:
        return cls(
            id=str(data["id"]),
            filename=str(data.get("filename", "")),
            format=str(data.get("format", "")),
            size_bytes=_int(data.get("size_bytes")) or 0,
            sha256=data.get("sha256"),
            created_at=_time(data.get("created_at")),
            raw=dict(data),
        )


@dataclass(frozen=True)
class Batch:
    """A batch and its progress, as GET /batches/<id> shows it."""

    id: str
    status: str
    model: str
    model_version: str | None = None
    file_id: str | None = None
    rows: int | None = None
    rows_done: int = 0
    rows_failed: int = 0
    rows_pending: int = 0
    chunk_rows: int | None = None
    chunks: dict[str, int] = field(default_factory=dict)
    failed_rows: list[dict[str, Any]] = field(default_factory=list)
    eta_seconds: float | None = None
    error: JobError | None = None
    results_url: str | None = None
    created_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def finished(self) -> bool:
        return self.status in BATCH_TERMINAL

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Batch:
        chunks = data.get("chunks")
        file_id = data.get("file_id")
        return cls(
            id=str(data["id"]),
            status=str(data["status"]),
            model=str(data.get("model", "")),
            model_version=data.get("model_version"),
            file_id=str(file_id) if file_id is not None else None,
            rows=_int(data.get("rows")),
            rows_done=_int(data.get("rows_done")) or 0,
            rows_failed=_int(data.get("rows_failed")) or 0,
            rows_pending=_int(data.get("rows_pending")) or 0,
            chunk_rows=_int(data.get("chunk_rows")),
            chunks={str(k): int(v) for k, v in chunks.items()}
            if isinstance(chunks, Mapping)
            else {},
            failed_rows=list(data.get("failed_rows") or []),
            eta_seconds=_float(data.get("eta_seconds")),
            error=JobError.from_json(data.get("error")),
            results_url=data.get("results_url"),
            created_at=_time(data.get("created_at")),
            started_at=_time(data.get("started_at")),
            finished_at=_time(data.get("finished_at")),
            raw=dict(data),
        )


@dataclass(frozen=True)
class ResultRow:
    """One row of a batch's results: its outputs, or the error of its chunk."""

    row: int
    outputs: dict[str, Any] | None = None
    error: JobError | None = None

    @property
    def ok(self) -> bool:
        return self.outputs is not None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ResultRow:
        outputs = data.get("outputs")
        return cls(
            row=int(data["row"]),
            outputs=dict(outputs) if isinstance(outputs, Mapping) else None,
            error=JobError.from_json(data.get("error")),
        )


class BatchResults(Iterable[ResultRow]):
    """A finished batch (`batch`) and its results: its rows, streamed in input
    order as they are iterated, or `to_pandas()`. From `client.batches.run` each
    iteration reads the rows anew; given `rows`, they are iterated once."""

    def __init__(
        self,
        batch: Batch,
        rows: Iterator[ResultRow] | None = None,
        *,
        client: Client | None = None,
        index: Any = None,
    ) -> None:
        if rows is None and client is None:
            raise ValueError("give the rows, or the client to read them with")
        self.batch = batch
        self._rows, self._client, self._index = rows, client, index

    def __iter__(self) -> Iterator[ResultRow]:
        if self._rows is not None:
            return self._rows
        return self._reader().batches.results(self.batch.id)

    def to_pandas(self) -> Any:
        """The results as a pandas DataFrame: a row per input row, in input order
        (indexed like the DataFrame the batch was run on), a column per output,
        and `error` / `error_message` columns where rows failed (see
        `client.batches.frame`). Needs the `parquet` extra."""
        return self._reader().batches.frame(self.batch.id, index=self._index)

    def _reader(self) -> Client:
        if self._client is None:
            raise ValueError("these results were given their rows, not a client to read them")
        return self._client
