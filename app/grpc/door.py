"""Every RPC of the service, with its access rule, behind one generic handler.

The handlers are made from the service's descriptor (`grpc_service.proto`),
so each RPC the protocol defines answers: those the servicer implements run
it, the others answer UNIMPLEMENTED saying what is served. Requests reach the
handler as bytes: the caller's key is checked first (`authorization: Bearer
<key>` metadata), and only then is the message parsed, so an anonymous
caller costs no decoding. Errors are mapped once (`app.grpc.status`).
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf.descriptor import MethodDescriptor, ServiceDescriptor
from google.protobuf.message import DecodeError, Message

from app.errors import DomainError
from app.grpc import status
from app.observability import metrics
from app.operations import OPERATOR, Caller
from app.platform.broker import broker_unavailable
from app.platform.database import database_unavailable

logger = logging.getLogger(__name__)


class Access(enum.Enum):
    OPEN = "open"  # no key needed (health, server metadata)
    OPTIONAL = "optional"  # a key is checked if sent (model metadata: tenants see more)
    TENANT = "tenant"  # a tenant's key (inference)
    OPERATOR = "operator"  # an operator's key (the model repository)


@dataclass(frozen=True)
class Rpc:
    """`run(request, context, caller)`; for a streaming RPC `request` is an iterator
    of requests and `run` yields responses. `caller` is None for an anonymous call."""

    run: Callable[[Any, grpc.ServicerContext, Caller | None], Any]
    access: Access


class Refused(Exception):
    """An RPC refused by the door itself (no key, a bad message)."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.status = status.Status(code, details)


Authenticate = Callable[[str], Caller | None]


class Door(grpc.GenericRpcHandler):
    def __init__(
        self,
        service: ServiceDescriptor,
        messages: Any,
        rpcs: dict[str, Rpc],
        authenticate: Authenticate,
    ) -> None:
        """`messages`: the generated module holding the service's message classes."""
        unknown = set(rpcs) - {method.name for method in service.methods}
        assert not unknown, f"{service.full_name} has no RPC {unknown}"
        self._authenticate = authenticate
        served = ", ".join(sorted(rpcs))
        self._handlers = {
            f"/{service.full_name}/{method.name}": self._handler(method, messages, rpcs, served)
            for method in service.methods
        }

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        return self._handlers.get(details.method)

    def _handler(
        self, method: MethodDescriptor, messages: Any, rpcs: dict[str, Rpc], served: str
    ) -> grpc.RpcMethodHandler:
        request_type: type[Message] = getattr(messages, method.input_type.name)
        serialize = getattr(messages, method.output_type.name).SerializeToString
        rpc = rpcs.get(method.name) or Rpc(_unimplemented(method.name, served), Access.OPEN)
        name = method.name
        if method.client_streaming and method.server_streaming:
            return grpc.stream_stream_rpc_method_handler(
                self._streaming(name, rpc, request_type), response_serializer=serialize
            )
        assert not (method.client_streaming or method.server_streaming), name
        return grpc.unary_unary_rpc_method_handler(
            self._unary(name, rpc, request_type), response_serializer=serialize
        )

    def _unary(
        self, name: str, rpc: Rpc, request_type: type[Message]
    ) -> Callable[[bytes, grpc.ServicerContext], Any]:
        def behavior(raw: bytes, context: grpc.ServicerContext) -> Any:
            started = time.perf_counter()
            try:
                caller = self._caller(context, rpc.access)
                response = rpc.run(_parse(request_type, raw), context, caller)
            except BaseException as exc:  # mapped to a status; never a server crash
                _fail(context, name, exc, started)
            _count(name, grpc.StatusCode.OK, started)
            return response

        return behavior

    def _streaming(
        self, name: str, rpc: Rpc, request_type: type[Message]
    ) -> Callable[[Iterator[bytes], grpc.ServicerContext], Iterator[Any]]:
        def behavior(raw: Iterator[bytes], context: grpc.ServicerContext) -> Iterator[Any]:
            started = time.perf_counter()
            try:
                caller = self._caller(context, rpc.access)
                yield from rpc.run(_parsing(request_type, raw), context, caller)
            except GeneratorExit:  # the caller went away; the stream cleaned up after itself
                _count(name, grpc.StatusCode.CANCELLED, started)
                raise
            except BaseException as exc:
                _fail(context, name, exc, started)
            _count(name, grpc.StatusCode.OK, started)

        return behavior

    def _caller(self, context: grpc.ServicerContext, access: Access) -> Caller | None:
        if access is Access.OPEN:
            return None
        header = dict(context.invocation_metadata()).get("authorization")
        if header is None:
            if access is Access.OPTIONAL:
                return None
            raise Refused(
                grpc.StatusCode.UNAUTHENTICATED,
                "send the metadata `authorization: Bearer <api key>`",
            )
        scheme, _, key = str(header).partition(" ")
        if scheme.lower() != "bearer" or not key.strip():
            raise Refused(
                grpc.StatusCode.UNAUTHENTICATED,
                "the authorization metadata must be `Bearer <api key>`",
            )
        caller = self._authenticate(key.strip())
        if caller is None:
            raise Refused(
                grpc.StatusCode.UNAUTHENTICATED, "the API key is not valid, was revoked or expired"
            )
        if access is Access.TENANT and caller.kind == OPERATOR:
            raise Refused(
                grpc.StatusCode.PERMISSION_DENIED,
                "this RPC needs a tenant's API key; an operator key has no jobs",
            )
        if access is Access.OPERATOR and caller.kind != OPERATOR:
            raise Refused(
                grpc.StatusCode.PERMISSION_DENIED,
                "this RPC needs an operator key (create-api-key --operator); "
                "a tenant's key does not manage the model repository",
            )
        return caller


def _parse(request_type: type[Message], raw: bytes) -> Message:
    try:
        return request_type.FromString(raw)
    except DecodeError:
        raise Refused(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"the request is not a {request_type.DESCRIPTOR.full_name} message",
        ) from None


def _parsing(request_type: type[Message], raw: Iterator[bytes]) -> Iterator[Message | Refused]:
    """A stream's messages, parsed one by one; one that is not a message is handed
    over as its Refused, so the stream can answer it and read on."""
    for message in raw:
        try:
            yield _parse(request_type, message)
        except Refused as refused:
            yield refused


def _fail(context: grpc.ServicerContext, name: str, exc: BaseException, started: float) -> None:
    """Abort the RPC with the status `exc` maps to (raises)."""
    if isinstance(exc, Refused):
        mapped = exc.status
    elif isinstance(exc, DomainError):
        mapped = status.of(exc)
    elif isinstance(exc, Exception) and database_unavailable(exc):
        logger.warning("%s: database unavailable: %s", name, exc)
        mapped = status.Status(
            grpc.StatusCode.UNAVAILABLE, "the database did not answer", (("retry-after", "5"),)
        )
    elif isinstance(exc, Exception) and broker_unavailable(exc):
        logger.warning("%s: Redis unavailable: %s", name, exc)
        unavailable, retry = grpc.StatusCode.UNAVAILABLE, (("retry-after", "2"),)
        mapped = status.Status(unavailable, "Redis (the broker) did not answer", retry)
    else:
        mapped = status.unexpected(exc)
    _count(name, mapped.code, started)
    if mapped.metadata:
        context.set_trailing_metadata(mapped.metadata)
    context.abort(mapped.code, mapped.details)


def _count(name: str, code: grpc.StatusCode, started: float) -> None:
    metrics.GRPC_REQUESTS.labels(name, code.name).inc()
    metrics.GRPC_SECONDS.labels(name).observe(time.perf_counter() - started)


def _unimplemented(name: str, served: str) -> Callable[..., Any]:
    def run(_request: Any, _context: grpc.ServicerContext, _caller: Caller | None) -> Any:
        raise Refused(
            grpc.StatusCode.UNIMPLEMENTED,
            f"{name} is not supported by this server; it serves {served}",
        )

    return run
