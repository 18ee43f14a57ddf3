"""A generative model's requests on ModelStreamInfer, answered as Triton answers a
decoupled model's: one response per piece of text as the worker makes it, each
with `parameters["triton_final_response"].bool_param` false, then, once the job
has ended, an empty response flagged true, where the request asked for it
(`triton_enable_empty_final_response`: tritonclient's
`async_stream_infer(..., enable_empty_final_response=True)`). Without it no final
response comes, as from Triton for a model that sends its final flag on its own:
the client knows the pieces are all there when the stream ends. An error is the
request's last response (`error_message`, as for any request), flagged final.

A thread per request follows its job's pieces (`Completions.follow`, over Redis)
and puts each response on the stream's queue; the stream's follower of calls
still says when and how the job ended, as for every request (its error, its
deadline). Then the generation is closed (what its thread hears after is
dropped) and the text not passed on yet (the last pieces are published after the
job's answer) goes out from the job's outputs: the pieces joined are the whole
text. The thread ends at its next piece, or with the job.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import numpy as np

from app.errors import DomainError
from app.grpc import codec
from app.grpc.answers import answered
from app.grpc.generated import grpc_service_pb2 as pb
from app.observability import metrics
from app.operations.calls import TEXT_OUTPUT, Answer, Call

logger = logging.getLogger(__name__)

FINAL = "triton_final_response"
Post = Callable[[pb.ModelStreamInferResponse], None]


class Piece(Protocol):
    """What following a job's text yields (app.generation.pieces.Followed)."""

    @property
    def text(self) -> str: ...
    @property
    def final(self) -> dict[str, Any] | None: ...


# How a stream follows a job's pieces: the job's id to its pieces as they come.
Follow = Callable[[uuid.UUID], Iterator[Piece]]


class Generation:
    """One generative request: its pieces out as they come, until it is ended."""

    def __init__(self, reply: codec.Reply, call: Call, post: Post) -> None:
        self.reply, self.call, self._post = reply, call, post
        self._sent = ""
        self._closed = False
        self._lock = threading.Lock()  # a piece is posted whole before the end, or dropped

    def follow(self, pieces: Iterator[Piece]) -> None:
        """The follower thread: each piece's response, until the job's end or `end`."""
        try:
            for piece in pieces:
                with self._lock:
                    if self._closed:
                        return
                    if piece.text:
                        self._sent += piece.text
                        self._post(self._piece(piece.text))
                if piece.final is not None:
                    return
        except Exception as exc:  # Redis away, or the follow timed out: the end still comes
            logger.info("stopped following the pieces of job %s: %s", self.call.job_id, exc)

    def end(self, ended: Answer | DomainError) -> list[pb.ModelStreamInferResponse]:
        """The request's last responses, once its job ended: the text not passed on
        yet and the empty final response (where asked for), or the error. The
        follower passes on nothing after this."""
        sent = self.close()
        if isinstance(ended, DomainError):
            return [_flagged(answered(self.reply, ended, self.call), True)]
        metrics.GRPC_STREAM_REQUESTS.labels("OK").inc()
        whole = _text(ended.outputs.get(TEXT_OUTPUT))
        if not whole.startswith(sent):  # never seen: the pieces are a prefix of the output
            logger.warning("the pieces of job %s are not its output's start", self.call.job_id)
        rest = whole[len(sent) :] if whole.startswith(sent) else ""
        responses = [self._piece(rest)] if rest else []
        if self.reply.empty_final:
            responses.append(self._final())
        return responses

    def close(self) -> str:
        """Pass on nothing more; the text passed on."""
        with self._lock:
            self._closed = True
            return self._sent

    def _piece(self, text: str) -> pb.ModelStreamInferResponse:
        arrays = {TEXT_OUTPUT: np.array([text], dtype=object)}
        response = codec.encode(self.call.card, self.reply, arrays, self._parameters())
        response.parameters[FINAL].bool_param = False
        return pb.ModelStreamInferResponse(infer_response=response)

    def _final(self) -> pb.ModelStreamInferResponse:
        card = self.call.card
        response = pb.ModelInferResponse(
            id=self.reply.id, model_name=card.name, model_version=card.version
        )
        for key, value in self._parameters().items():
            response.parameters[key].string_param = value
        response.parameters[FINAL].bool_param = True
        return pb.ModelStreamInferResponse(infer_response=response)

    def _parameters(self) -> dict[str, str]:
        return {"job_id": str(self.call.job_id)}


class Generations:
    """A stream's generative requests under way, by job."""

    def __init__(self, follow: Follow, post: Post) -> None:
        self._follow, self._post = follow, post
        self._under_way: dict[uuid.UUID, Generation] = {}
        self._lock = threading.Lock()

    @staticmethod
    def generates(call: Call) -> bool:
        return call.card.generation is not None

    def start(self, reply: codec.Reply, call: Call) -> None:
        """Follow the call's pieces (before the stream's follower of calls has it,
        so that its end always finds the generation)."""
        assert call.job_id is not None, "a generation is a job"
        generation = Generation(reply, call, self._post)
        with self._lock:
            self._under_way[call.job_id] = generation
        pieces = self._follow(call.job_id)
        threading.Thread(target=generation.follow, args=(pieces,),
                         name="grpc-stream-pieces", daemon=True).start()  # fmt: skip

    def pop(self, job_id: uuid.UUID | None) -> Generation | None:
        """The call's generation, if it is one; the stream ends it."""
        with self._lock:
            return self._under_way.pop(job_id, None) if job_id else None

    def close(self) -> None:
        """The stream is over: nothing more is passed on (its jobs are cancelled)."""
        with self._lock:
            generations, self._under_way = list(self._under_way.values()), {}
        for generation in generations:
            generation.close()


def _flagged(response: pb.ModelStreamInferResponse, final: bool) -> pb.ModelStreamInferResponse:
    response.infer_response.parameters[FINAL].bool_param = final
    return response


def _text(array: np.ndarray | None) -> str:
    """The text of a generation's output tensor (shape [1])."""
    if array is None or not array.size:
        return ""
    value = array.reshape(-1)[0]
    return value.decode() if isinstance(value, bytes) else str(value)
