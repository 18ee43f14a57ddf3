"""ModelStreamInfer: many requests on one bidirectional stream, each answered as
its job finishes, matched by the request's `id`.

A reader thread takes requests off the stream and starts each as a sync call
(a job, ahead of async work); the RPC's own thread follows all of them at once
(`DataPlane.follow_calls`) and writes each answer when its job ends. A request
that cannot start (unknown model, inputs that do not fit, a full queue) is
answered at once with `error_message`, and the stream goes on, as Triton does;
so is one whose job failed or ran out of time.

Bounds, so one caller cannot take the door from the others: the stream holds
one of its tenant's waits (MAX_WAITS_PER_TENANT) for its life, and at most
GRPC_STREAM_MAX_IN_FLIGHT of its requests are under way; beyond that the
reader stops reading, and HTTP/2 flow control holds the client back. When the
client cancels or the connection drops, the stream's unfinished jobs are
cancelled. The stream ends (OK) once the client closed its side and every
request was answered.
"""

from __future__ import annotations

import logging
import queue
import threading
import uuid
from collections.abc import Iterator

import grpc

from app.container import Container
from app.errors import DomainError
from app.grpc import codec, status
from app.grpc.calls import check_outputs, infer_request
from app.grpc.door import Refused
from app.grpc.generated import grpc_service_pb2 as pb
from app.jobs.sync import Answer, Call, Calls
from app.observability import metrics
from app.platform.database import database_unavailable
from app.tenancy.keys import TenantRef

logger = logging.getLogger(__name__)

POLL_S = 1.0  # the longest the answering thread waits before it looks again
# A request as the door hands it over: parsed, or refused when it is not a message.
Request = pb.ModelInferRequest | Refused


class CallStream:
    def __init__(
        self, container: Container, tenant: TenantRef, context: grpc.ServicerContext
    ) -> None:
        self.container, self.tenant, self.context = container, tenant, context
        self.plane = container.dataplane
        self._slots = threading.Semaphore(container.settings.grpc_stream_max_in_flight)
        self._ready: queue.SimpleQueue[pb.ModelStreamInferResponse] = queue.SimpleQueue()
        self._requests: dict[uuid.UUID, codec.Call] = {}  # a job's request, to answer it
        self._reading = True
        self._calls: Calls

    def run(self, requests: Iterator[Request]) -> Iterator[pb.ModelStreamInferResponse]:
        release = self.plane.hold(self.tenant)  # TooManyWaits: RESOURCE_EXHAUSTED, nothing read
        calls = self._calls = self.plane.follow_calls(self.tenant)
        try:
            if not self.context.add_callback(calls.leave):
                return  # over before it began
            reader = threading.Thread(
                target=self._read, args=(requests, calls), name="grpc-stream-reader", daemon=True
            )
            reader.start()
            yield from self._answer(calls)
        finally:  # also when the server closes this generator: the caller is gone
            if calls.jobs():
                self._cancel(calls)
            calls.close()
            release()

    # -- the reader's side -----------------------------------------------------------

    def _read(self, requests: Iterator[Request], calls: Calls) -> None:
        try:
            for request in requests:
                while not self._slots.acquire(timeout=POLL_S):
                    if calls.left:
                        return
                if calls.left:
                    return
                self._start(request, calls)
        except Exception as exc:  # the stream broke (a cancel reads as an error here)
            if not calls.left:
                logger.info("stream of %s ended while reading: %s", self.tenant.name, exc)
        finally:
            self._reading = False
            calls.wake()

    def _start(self, request: Request, calls: Calls) -> None:
        """Start one request's call, or answer it now (an error, an inline model)."""
        if isinstance(request, Refused):  # not a message at all: nothing names it
            self._post(_failure("", "", request.status, None))
            return
        call: codec.Call | None = None
        try:
            call = codec.decode(request)
            with self.container.database.scope():
                card = self.plane.model(self.tenant.name, call.model, call.version)
                check_outputs(card, call)
                started = self.plane.start_call(self.tenant, infer_request(call, self.context))
        except Exception as exc:
            self._post(_error(request, call, exc))
            return
        if started.done is not None:
            self._post(_answered(call, started.done, started))
            return
        assert started.job_id is not None
        self._requests[started.job_id] = call
        calls.add(started)

    def _post(self, response: pb.ModelStreamInferResponse) -> None:
        """An answer the reader made itself: out at once, its slot free again."""
        self._ready.put(response)
        self._slots.release()
        self._calls.wake()

    # -- the answering side -----------------------------------------------------------

    def _answer(self, calls: Calls) -> Iterator[pb.ModelStreamInferResponse]:
        while not calls.left:
            while not self._ready.empty():
                yield self._ready.get_nowait()
            if not self._reading and not len(calls) and self._ready.empty():
                return  # the client is done and every request was answered
            for call, ended in calls.finished(POLL_S):
                request = self._requests.pop(call.job_id)  # type: ignore[arg-type]
                self._slots.release()
                yield _answered(request, ended, call)

    def _cancel(self, calls: Calls) -> None:
        """The caller left: its unfinished jobs are cancelled (queued ones never run)."""
        jobs = calls.jobs()
        if not jobs:
            return
        try:
            with self.container.database.scope():
                cancelled = self.plane.cancel_jobs(self.tenant, jobs)
            logger.info("stream of %s cut: %d unfinished job(s) cancelled", self.tenant.name,
                        cancelled)  # fmt: skip
        except Exception:  # the lease and deadline sweeps still end them
            logger.exception("could not cancel the jobs of a cut stream")


def _answered(
    request: codec.Call, ended: Answer | DomainError, call: Call
) -> pb.ModelStreamInferResponse:
    if isinstance(ended, DomainError):
        return _failure(request.id, request.model, status.of(ended), call.job_id)
    parameters = {"job_id": str(call.job_id)} if call.job_id else {}
    try:
        response = codec.encode(ended.card, request, ended.outputs, parameters)
    except DomainError as exc:
        return _failure(request.id, request.model, status.of(exc), call.job_id)
    metrics.GRPC_STREAM_REQUESTS.labels("OK").inc()
    return pb.ModelStreamInferResponse(infer_response=response)


def _error(
    request: pb.ModelInferRequest, call: codec.Call | None, exc: Exception
) -> pb.ModelStreamInferResponse:
    if isinstance(exc, DomainError):
        mapped = status.of(exc)
    elif database_unavailable(exc):
        mapped = status.Status(grpc.StatusCode.UNAVAILABLE, "the database did not answer")
    else:
        mapped = status.unexpected(exc)
    return _failure(request.id, request.model_name, mapped, None)


def _failure(
    request_id: str, model: str, mapped: status.Status, job_id: uuid.UUID | None
) -> pb.ModelStreamInferResponse:
    """An error answer: `error_message` names the request (tritonclient hands over
    only that), and `infer_response` carries its id and the error's metadata as
    parameters for clients that read the message themselves."""
    metrics.GRPC_STREAM_REQUESTS.labels(mapped.code.name).inc()
    response = pb.ModelInferResponse(id=request_id, model_name=model)
    response.parameters["grpc_code"].string_param = mapped.code.name
    for key, value in mapped.metadata:
        response.parameters[key.replace("-", "_")].string_param = value
    if job_id is not None:
        response.parameters["job_id"].string_param = str(job_id)
    return pb.ModelStreamInferResponse(
        error_message=f"request {request_id!r}: {mapped.message()}", infer_response=response
    )
