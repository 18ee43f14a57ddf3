"""A light gRPC load client: grpcio's own channel, requests serialized once.

Like `load.py` for HTTP: the client shares the cores with the service, so it
sends pre-encoded `ModelInferRequest` bytes (no per-call protobuf building)
and reads only what it must to tell an answer from an error. Two shapes, each
from C clients:

- unary: C threads, each its own channel, one `ModelInfer` at a time (a closed
  loop, or at the times of an open loop's `Schedule`);
- stream: C threads, each one `ModelStreamInfer` stream on its own channel,
  keeping up to `window` requests in flight on it (answers are matched by id).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import grpc
import numpy as np

from app.grpc.generated import grpc_service_pb2 as pb
from bench.load import LoadResult, Schedule, run_clients, sleep_until

UNARY = "/inference.GRPCInferenceService/ModelInfer"
STREAM = "/inference.GRPCInferenceService/ModelStreamInfer"
MAX_MESSAGE = 64 * 1024 * 1024


@dataclass(frozen=True)
class GrpcEndpoint:
    target: str  # host:port
    api_key: str

    def metadata(self) -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {self.api_key}"),)


def infer_messages(rows: Sequence[Sequence[float]], model: str = "digits") -> list[bytes]:
    """One serialized ModelInferRequest a row (raw contents, as tritonclient sends)."""
    messages = []
    for i, row in enumerate(rows):
        request = pb.ModelInferRequest(model_name=model, id=str(i))
        request.inputs.add(name="pixels", datatype="FP32", shape=[1, len(row)])
        request.raw_input_contents.append(np.asarray([row], dtype="<f4").tobytes())
        messages.append(request.SerializeToString())
    return messages


def _channel(endpoint: GrpcEndpoint) -> grpc.Channel:
    return grpc.insecure_channel(
        endpoint.target,
        options=[("grpc.max_receive_message_length", MAX_MESSAGE),
                 ("grpc.max_send_message_length", MAX_MESSAGE)],
    )  # fmt: skip


def unary(
    endpoint: GrpcEndpoint, messages: Sequence[bytes], calls: int, clients: int
) -> LoadResult:
    """A closed loop: each client sends its next call when the last is answered."""
    counter = itertools.count()

    def take() -> tuple[int, float] | None:
        i = next(counter)
        return (i, time.perf_counter()) if i < calls else None

    return _unary(endpoint, messages, take, clients)


def open_unary(
    endpoint: GrpcEndpoint, messages: Sequence[bytes], schedule: Schedule, clients: int
) -> LoadResult:
    """One call at each time of `schedule`, latency from that time (see load.py)."""
    return _unary(endpoint, messages, schedule.slots(), clients)


def _unary(
    endpoint: GrpcEndpoint,
    messages: Sequence[bytes],
    take: Callable[[], tuple[int, float] | None],
    clients: int,
) -> LoadResult:
    """`clients` threads, each its own channel, making one call per (index, send
    time) that `take` gives until it gives None."""

    def client(tally: LoadResult, first: list[float]) -> None:
        with _channel(endpoint) as channel:
            call = channel.unary_unary(UNARY)  # bytes in, bytes out
            while (slot := take()) is not None:
                i, started = slot
                sleep_until(started)
                if not first:
                    first.append(time.time())
                tally.sent += 1
                try:
                    call(messages[i % len(messages)], metadata=endpoint.metadata(), timeout=60)
                except grpc.RpcError as exc:
                    tally.failed(started, f"{exc.code().name}: {exc.details()}")
                    continue
                tally.accepted += 1
                tally.answered(started)

    return run_clients(clients, client)


def stream(
    endpoint: GrpcEndpoint, messages: Sequence[bytes], calls: int, clients: int, window: int
) -> LoadResult:
    counter = itertools.count()

    def client(tally: LoadResult, first: list[float]) -> None:
        slots = threading.Semaphore(window)
        sent_at: dict[str, float] = {}

        def requests() -> Iterator[bytes]:
            while True:
                slots.acquire()
                i = next(counter)
                if i >= calls:
                    return
                request = messages[i % len(messages)]
                request_id = f"s{i}"
                # The id, set without building the message again: a field appended to
                # a serialized message overrides the one before it.
                tagged = request + _id_field(request_id)
                if not first:
                    first.append(time.time())
                sent_at[request_id] = time.perf_counter()
                tally.sent += 1
                yield tagged

        with _channel(endpoint) as channel:
            call = channel.stream_stream(STREAM)
            try:
                for raw in call(requests(), metadata=endpoint.metadata(), timeout=600):
                    answer = pb.ModelStreamInferResponse.FromString(raw)
                    started = sent_at.pop(answer.infer_response.id, None)
                    if answer.error_message:
                        tally.failed(started or 0.0, answer.error_message)
                    elif started is not None:
                        tally.accepted += 1
                        tally.answered(started)
                    slots.release()
            except grpc.RpcError as exc:
                tally.failed(time.perf_counter(), f"stream: {exc.code().name}: {exc.details()}")

    return run_clients(clients, client)


def _id_field(request_id: str) -> bytes:
    """ModelInferRequest.id (field 3, length-delimited), serialized."""
    data = request_id.encode()
    assert len(data) < 128
    return bytes([3 << 3 | 2, len(data)]) + data
