"""A light gRPC load client: grpcio's own channel, requests serialized once.

Like `load.py` for HTTP: the client shares the cores with the service, so it
sends pre-encoded `ModelInferRequest` bytes (no per-call protobuf building)
and reads only what it must to tell an answer from an error. Two shapes, both
closed loops of C clients:

- unary: C threads, each its own channel, one `ModelInfer` at a time;
- stream: C threads, each one `ModelStreamInfer` stream on its own channel,
  keeping up to `window` requests in flight on it (answers are matched by id).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import grpc
import numpy as np

from app.grpc.generated import grpc_service_pb2 as pb
from bench.load import LoadResult, run_clients

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
    counter = itertools.count()

    def client(tally: LoadResult, first: list[float]) -> None:
        with _channel(endpoint) as channel:
            call = channel.unary_unary(UNARY)  # bytes in, bytes out
            while (i := next(counter)) < calls:
                started = time.perf_counter()
                if not first:
                    first.append(time.time())
                tally.sent += 1
                try:
                    call(messages[i % len(messages)], metadata=endpoint.metadata(), timeout=60)
                except grpc.RpcError as exc:
                    _error(tally, f"{exc.code().name}: {exc.details()}")
                    continue
                tally.accepted += 1
                tally.latencies_ms.append((time.perf_counter() - started) * 1000)

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
                        _error(tally, answer.error_message)
                    elif started is not None:
                        tally.accepted += 1
                        tally.latencies_ms.append((time.perf_counter() - started) * 1000)
                    slots.release()
            except grpc.RpcError as exc:
                _error(tally, f"stream: {exc.code().name}: {exc.details()}")

    return run_clients(clients, client)


def _id_field(request_id: str) -> bytes:
    """ModelInferRequest.id (field 3, length-delimited), serialized."""
    data = request_id.encode()
    assert len(data) < 128
    return bytes([3 << 3 | 2, len(data)]) + data


def _error(tally: LoadResult, sample: str) -> None:
    tally.errors += 1
    if len(tally.error_samples) < 5:
        tally.error_samples.append(sample[:200])
