"""ModelStreamInfer: many requests on one bidirectional stream, each answered as
its job finishes, matched by the request's `id`.

A reader thread takes requests off the stream; a submitter starts them as sync
calls (jobs, ahead of async work), as many at once as arrived while the last
ones were being started; the RPC's own thread follows all of them at once
(`CallOperations.follow_calls`) and writes each answer when its job ends. A request
that cannot start (unknown model, inputs that do not fit, a full queue) is
answered at once with `error_message`, and the stream goes on, as Triton does;
so is one whose job failed or ran out of time.

A generative model's request (smollm2) is answered as Triton answers a decoupled
model's (app.grpc.generations): a response per piece of text as the worker makes
it (`triton_final_response` false), then an empty one flagged true, where the
request asked for it (tritonclient's `enable_empty_final_response=True`):

    client.start_stream(on_response, headers=key)
    client.async_stream_infer("smollm2", [text_input], parameters={"max_tokens": 16},
                              enable_empty_final_response=True)
    # on_response: result.as_numpy("text_output") per piece, then a result whose
    # get_response().parameters["triton_final_response"].bool_param is True

Bounds, so one caller cannot take the door from the others: a tenant holds at
most GRPC_MAX_STREAMS_PER_TENANT streams, each also one of its waits
(GRPC_MAX_WAITS_PER_TENANT) for its life; at most GRPC_STREAM_MAX_IN_FLIGHT of
a stream's requests are under way (an answer frees its slot once it is sent, a
generation's once its last response is, so a client that does not read its
answers stops being read), and at most GRPC_STREAM_MAX_IN_FLIGHT_BYTES of them
are held before they start (their tensors then live in the job rows; a running
request keeps only its id and the outputs it wants). Beyond either the reader
stops reading, and HTTP/2 flow control holds the client back. When the client
cancels or the connection drops, the stream's unfinished jobs are cancelled
(generations too: their decode slots free within a step), those started while
it went too. The stream ends (OK) once the client closed its side and every
request was answered; INTERNAL if it could not start them.
"""

from __future__ import annotations

import logging
import queue
import sys
import threading
import uuid
from collections.abc import Callable, Iterator

import grpc

from app.container import Container
from app.errors import DomainError
from app.grpc import codec
from app.grpc.answers import answered, failure, refused
from app.grpc.calls import check_outputs, infer_request
from app.grpc.door import Refused
from app.grpc.generated import grpc_service_pb2 as pb
from app.grpc.generations import Generations
from app.operations import TenantRef
from app.operations.calls import Call, Calls
from app.operations.holds import Holds, Wording

logger = logging.getLogger(__name__)

POLL_S = 1.0  # the longest the answering thread waits before it looks again
GATHER_S = 0.005  # changes gathered before a read: answers in batches, fewer reads
SUBMIT_BATCH = 64  # requests started together at most
JOIN_S = 5.0  # how long a cut stream waits for its submitter before cancelling its jobs
# A request as the door hands it over: parsed, or refused when it is not a message.
Request = pb.ModelInferRequest | Refused


def open_streams(per_tenant: int) -> Holds:
    """Streams open per tenant on this process (GRPC_MAX_STREAMS_PER_TENANT; the
    process's total is GRPC_MAX_WAITS, which each stream's wait counts in)."""
    wording = Wording(
        what="streams",
        per_tenant="GRPC_MAX_STREAMS_PER_TENANT",
        total="GRPC_MAX_WAITS",
        advice="send more requests on one of them, or close one",
    )
    return Holds(per_tenant, sys.maxsize, wording)


class _Budget:
    """Bytes of requests read and not yet started; one request alone always fits."""

    def __init__(self, limit: int) -> None:
        self.limit, self.used = limit, 0
        self._changed = threading.Condition()

    def take(self, size: int, give_up: Callable[[], bool]) -> bool:
        with self._changed:
            while self.used and self.used + size > self.limit:
                if give_up():
                    return False
                self._changed.wait(POLL_S)
            self.used += size
            return True

    def give(self, size: int) -> None:
        with self._changed:
            self.used -= size
            self._changed.notify_all()


class CallStream:
    def __init__(
        self,
        container: Container,
        tenant: TenantRef,
        context: grpc.ServicerContext,
        streams: Holds,
    ) -> None:
        self.container, self.tenant, self.context = container, tenant, context
        self.calls, self.models, self.streams = container.calls, container.models, streams
        settings = container.settings
        self._slots = threading.Semaphore(settings.grpc_stream_max_in_flight)
        self._budget = _Budget(settings.grpc_stream_max_in_flight_bytes)
        # Responses ready to go, each with whether sending it frees its request's slot.
        self._ready: queue.SimpleQueue[tuple[pb.ModelStreamInferResponse, bool]] = (
            queue.SimpleQueue()
        )
        self._replies: dict[uuid.UUID, codec.Reply] = {}  # what answering a job needs
        self._generations = Generations(
            lambda job_id: container.openai.completions.follow(tenant, job_id), self._post_piece
        )
        self._arrived: queue.SimpleQueue[tuple[Request, int] | None] = queue.SimpleQueue()
        self._reading = True
        self._failure: BaseException | None = None
        self._calls: Calls

    def run(self, requests: Iterator[Request]) -> Iterator[pb.ModelStreamInferResponse]:
        # TooManyWaits (RESOURCE_EXHAUSTED) before anything is read.
        with self.streams.holding(self.tenant.id):
            release = self.calls.hold(self.tenant)
            calls: Calls | None = None
            submitter: threading.Thread | None = None
            try:
                calls = self._calls = self.calls.follow_calls(self.tenant, GATHER_S)
                if not self.context.add_callback(calls.leave):
                    return  # over before it began
                reader = threading.Thread(target=self._read, args=(requests, calls),
                                          name="grpc-stream-reader", daemon=True)  # fmt: skip
                submitter = threading.Thread(target=self._submit, args=(calls,),
                                             name="grpc-stream-submitter", daemon=True)  # fmt: skip
                reader.start()
                submitter.start()
                yield from self._answer(calls)
                if self._failure is not None:
                    raise self._failure  # INTERNAL, never a clean end with requests unanswered
            finally:  # also when the server closes this generator: the caller is gone
                if calls is not None:
                    calls.leave()  # the reader and the submitter stop
                    if submitter is not None:
                        submitter.join(JOIN_S)
                    self._generations.close()
                    self._cancel(calls.pending())
                    calls.close()
                release()

    # -- the reader's side -----------------------------------------------------------

    def _read(self, requests: Iterator[Request], calls: Calls) -> None:
        """Take requests off the stream while a slot and the byte budget allow;
        the submitter starts them."""
        try:
            for request in requests:
                size = request.ByteSize() if isinstance(request, pb.ModelInferRequest) else 0
                while not self._slots.acquire(timeout=POLL_S):
                    if calls.left:
                        return
                if calls.left or not self._budget.take(size, lambda: calls.left):
                    return
                self._arrived.put((request, size))
        except Exception as exc:  # the stream broke (a cancel reads as an error here)
            if not calls.left:
                logger.info("stream of %s ended while reading: %s", self.tenant.name, exc)
        finally:
            self._arrived.put(None)  # no more

    def _submit(self, calls: Calls) -> None:
        """Start what arrived, as many requests at once as came while the last
        ones were being started (one insert, one commit for all of them)."""
        try:
            more = True
            while more and not calls.left:
                batch: list[Request] = []
                size = 0
                item = self._arrived.get()
                while item is not None:
                    batch.append(item[0])
                    size += item[1]
                    if len(batch) >= SUBMIT_BATCH:
                        break
                    try:
                        item = self._arrived.get_nowait()
                    except queue.Empty:
                        break
                more = item is not None
                try:
                    self._start(batch, calls)
                finally:
                    self._budget.give(size)
        except Exception as exc:  # never a stream waiting on a dead submitter
            logger.exception("the stream of %s could not start its requests", self.tenant.name)
            self._failure = exc
            calls.leave()
        finally:
            self._reading = False
            calls.wake()

    def _start(self, batch: list[Request], calls: Calls) -> None:
        """Start each request's call, or answer it now (an error, an inline model)."""
        decoded: list[tuple[pb.ModelInferRequest, codec.Call]] = []
        for request in batch:
            if isinstance(request, Refused):  # not a message at all: nothing names it
                self._post(failure("", "", request.status, None))
                continue
            try:
                call = codec.decode(request)
                check_outputs(self.models.model(self.tenant.name, call.model, call.version), call)
            except Exception as exc:
                self._post(refused(request, exc))
                continue
            decoded.append((request, call))
        if not decoded:
            return
        try:
            with self.container.scope():
                started = self.calls.start_calls(
                    self.tenant, [infer_request(call, self.context) for _, call in decoded]
                )
        except Exception as exc:  # none of them started (the database did not answer)
            for request, _ in decoded:
                self._post(refused(request, exc))
            return
        if calls.left:  # the caller went while they were being started: nobody waits
            self._cancel([r for r in started if isinstance(r, Call) and r.job_id])
            return
        for (request, call), result in zip(decoded, started, strict=True):
            if isinstance(result, DomainError):
                self._post(refused(request, result))
            elif result.done is not None:
                self._post(answered(call.reply(), result.done, result))
            else:
                assert result.job_id is not None
                reply = self._replies[result.job_id] = call.reply()
                if Generations.generates(result):
                    self._generations.start(reply, result)
                calls.add(result)

    def _post(self, response: pb.ModelStreamInferResponse) -> None:
        """An answer the submitter made itself: out at once."""
        self._ready.put((response, True))
        self._calls.wake()

    def _post_piece(self, response: pb.ModelStreamInferResponse) -> None:
        """A generation's piece (its request is still under way): out at once."""
        self._ready.put((response, False))
        self._calls.wake()

    # -- the answering side -----------------------------------------------------------

    def _answer(self, calls: Calls) -> Iterator[pb.ModelStreamInferResponse]:
        """Each answer as it comes; its request's slot is free once it was sent (a
        generation's once its last response was)."""
        while not calls.left:
            yield from self._sent_ready()
            if not self._reading and not len(calls) and self._ready.empty():
                return  # the client is done and every request was answered
            for call, ended in calls.finished(POLL_S):
                reply = self._replies.pop(call.job_id)  # type: ignore[arg-type]
                generation = self._generations.pop(call.job_id)
                if generation is None:
                    yield answered(reply, ended, call)
                else:
                    last = generation.end(ended)  # its pieces so far are all ready now
                    yield from self._sent_ready()
                    yield from last
                self._slots.release()

    def _sent_ready(self) -> Iterator[pb.ModelStreamInferResponse]:
        while not self._ready.empty():
            response, frees = self._ready.get_nowait()
            yield response
            if frees:
                self._slots.release()

    def _cancel(self, jobs: list[Call]) -> None:
        """The caller left: these unfinished calls are cancelled (queued ones never run)."""
        if not jobs:
            return
        try:
            with self.container.scope():
                cancelled = self.calls.cancel(self.tenant, jobs)
            logger.info("stream of %s cut: %d unfinished job(s) cancelled", self.tenant.name,
                        cancelled)  # fmt: skip
        except Exception:  # the lease and deadline sweeps still end them
            logger.exception("could not cancel the jobs of a cut stream")
