"""The RPCs this server answers, each a translation onto one operation.

Health and server metadata are open; model metadata and configuration are open
too, and a key, when sent, shows what its tenant is granted (as on the HTTP
door); inference and statistics (the tenant's own) need a tenant's key; the
model repository (index, load, unload: Triton's extension, the same operations
as `/v2/repository/...` and `manage.py models`) needs an operator key. Every
inference request is a job with its record, exactly as a call on
`/v2/models/<m>/infer`: `GET /jobs/<id>` and `/usage` show it, and its id comes
back in the response's `parameters["job_id"]`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import grpc
from google.protobuf import json_format

from app.container import Container
from app.errors import Unavailable, UnknownModel
from app.grpc import codec
from app.grpc.calls import check_outputs, infer_request, leaving
from app.grpc.door import Access, Refused, Rpc
from app.grpc.generated import grpc_service_pb2 as pb
from app.grpc.generated import model_config_pb2 as config_pb
from app.grpc.stream import CallStream, open_streams
from app.operations import Caller, TenantRef
from app.operations.models import PUBLIC
from app.operations.triton import EXTENSIONS

SERVER_NAME = "inference-jobs"
SERVER_VERSION = "0.1.0"


class Servicer:
    def __init__(self, container: Container) -> None:
        self.container = container
        self.models, self.settings = container.models, container.settings
        self.streams = open_streams(self.settings.grpc_max_streams_per_tenant)

    def rpcs(self) -> dict[str, Rpc]:
        """What each RPC runs, and who may call it."""
        return {
            "ServerLive": Rpc(self.server_live, Access.OPEN),
            "ServerReady": Rpc(self.server_ready, Access.OPEN),
            "ServerMetadata": Rpc(self.server_metadata, Access.OPEN),
            "ModelReady": Rpc(self.model_ready, Access.OPTIONAL),
            "ModelMetadata": Rpc(self.model_metadata, Access.OPTIONAL),
            "ModelConfig": Rpc(self.model_config, Access.OPTIONAL),
            "ModelStatistics": Rpc(self.model_statistics, Access.TENANT),
            "ModelInfer": Rpc(self.model_infer, Access.TENANT),
            "ModelStreamInfer": Rpc(self.model_stream_infer, Access.TENANT),
            "RepositoryIndex": Rpc(self.repository_index, Access.OPERATOR),
            "RepositoryModelLoad": Rpc(self.repository_model_load, Access.OPERATOR),
            "RepositoryModelUnload": Rpc(self.repository_model_unload, Access.OPERATOR),
        }

    def authenticate(self, key: str) -> Caller | None:
        with self.container.scope():
            caller = self.container.tenants.authenticate(key)
        return None if caller is None or caller.expired() else caller

    # -- health and metadata -----------------------------------------------------

    def server_live(self, _request: Any, _context: Any, _caller: Any) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=True)

    def server_ready(self, _request: Any, _context: Any, _caller: Any) -> pb.ServerReadyResponse:
        with self.container.scope():
            checks = self.container.status.readiness()
        return pb.ServerReadyResponse(ready=all(v == "ok" for v in checks.values()))

    def server_metadata(
        self, _request: Any, _context: Any, _caller: Any
    ) -> pb.ServerMetadataResponse:
        return pb.ServerMetadataResponse(
            name=SERVER_NAME, version=SERVER_VERSION, extensions=EXTENSIONS
        )

    def model_ready(
        self, request: pb.ModelReadyRequest, _context: Any, caller: Caller | None
    ) -> pb.ModelReadyResponse:
        """Ready or not, as Triton answers (an unknown model is not ready, no error)."""
        try:
            self.models.model_ready(_visibility(caller), request.name, request.version or None)
        except (UnknownModel, Unavailable):
            return pb.ModelReadyResponse(ready=False)
        return pb.ModelReadyResponse(ready=True)

    def model_metadata(
        self, request: pb.ModelMetadataRequest, _context: Any, caller: Caller | None
    ) -> pb.ModelMetadataResponse:
        card = self.models.model(_visibility(caller), request.name, request.version or None)
        tensor = pb.ModelMetadataResponse.TensorMetadata
        return pb.ModelMetadataResponse(
            name=card.name,
            versions=[card.version],
            platform=card.platform,
            inputs=[tensor(name=s.name, datatype=s.datatype, shape=s.shape) for s in card.inputs],
            outputs=[tensor(name=s.name, datatype=s.datatype, shape=s.shape) for s in card.outputs],
        )

    def model_config(
        self, request: pb.ModelConfigRequest, _context: Any, caller: Caller | None
    ) -> pb.ModelConfigResponse:
        config = self.models.model_config(
            _visibility(caller), request.name, request.version or None
        )
        return pb.ModelConfigResponse(config=json_format.ParseDict(config, config_pb.ModelConfig()))

    def model_statistics(
        self, request: pb.ModelStatisticsRequest, _context: Any, caller: Caller | None
    ) -> pb.ModelStatisticsResponse:
        """The calling tenant's own statistics (its jobs only); without a name, of
        every model it may see."""
        with self.container.scope():
            found = self.models.statistics(
                _tenant(caller), request.name or None, request.version or None
            )
        return json_format.ParseDict(found, pb.ModelStatisticsResponse())

    # -- inference ---------------------------------------------------------------

    def model_infer(
        self, request: pb.ModelInferRequest, context: grpc.ServicerContext, caller: Caller | None
    ) -> pb.ModelInferResponse:
        tenant = _tenant(caller)
        call = codec.decode(request)
        with self.container.scope():
            card = self.models.model(tenant.name, call.model, call.version)
            check_outputs(card, call)
            answer = self.container.calls.infer(
                tenant, infer_request(call, context), leaving=leaving(context)
            )
        parameters = {"job_id": str(answer.job_id)} if answer.job_id else {}
        return codec.encode(answer.card, call.reply(), answer.outputs, parameters)

    def model_stream_infer(
        self,
        requests: Iterator[pb.ModelInferRequest],
        context: grpc.ServicerContext,
        caller: Caller | None,
    ) -> Iterator[pb.ModelStreamInferResponse]:
        stream = CallStream(self.container, _tenant(caller), context, self.streams)
        return stream.run(requests)

    # -- the model repository (operators) ---------------------------------------------

    def repository_index(
        self, request: pb.RepositoryIndexRequest, _context: Any, _caller: Any
    ) -> pb.RepositoryIndexResponse:
        """Every version in the folder: READY, UNAVAILABLE and why, or LOADING
        (`ready`: only the READY ones)."""
        _one_repository(request.repository_name)
        with self.container.scope():
            statuses = self.models.index(ready_only=request.ready)
        entry = pb.RepositoryIndexResponse.ModelIndex
        return pb.RepositoryIndexResponse(
            models=[
                entry(name=s.name, version=s.version, state=s.state, reason=s.reason)
                for s in statuses
            ]
        )

    def repository_model_load(
        self, request: pb.RepositoryModelLoadRequest, _context: Any, _caller: Any
    ) -> pb.RepositoryModelLoadResponse:
        """Load (or reload) a model, with Triton's `config` parameter if sent."""
        _one_repository(request.repository_name)
        name, parameters = _model_name(request.model_name), _parameters(request.parameters)
        with self.container.scope():
            self.models.load(name, parameters)
        return pb.RepositoryModelLoadResponse()

    def repository_model_unload(
        self, request: pb.RepositoryModelUnloadRequest, _context: Any, _caller: Any
    ) -> pb.RepositoryModelUnloadResponse:
        """Unload a model (`unload_dependents` taken: our models have no dependents)."""
        _one_repository(request.repository_name)
        name, parameters = _model_name(request.model_name), _parameters(request.parameters)
        with self.container.scope():
            self.models.unload(name, parameters=parameters)
        return pb.RepositoryModelUnloadResponse()


def _one_repository(name: str) -> None:
    """Triton answers a repository_name with UNIMPLEMENTED; so does this server,
    which serves one repository (MODEL_REPOSITORY)."""
    if name:
        raise Refused(
            grpc.StatusCode.UNIMPLEMENTED,
            f"'repository_name' specification is not supported ({name!r}): this server "
            "serves one model repository; leave repository_name empty",
        )


def _model_name(name: str) -> str:
    if not name.strip():
        raise Refused(grpc.StatusCode.INVALID_ARGUMENT, "model_name is required")
    return name


def _parameters(parameters: Any) -> dict[str, Any]:
    """A `map<string, ModelRepositoryParameter>` as plain values (bool, int, str or
    bytes; None for one with no value): the operations check them."""
    found = {}
    for key, value in parameters.items():
        choice = value.WhichOneof("parameter_choice")
        found[key] = getattr(value, choice) if choice else None
    return found


def _tenant(caller: Caller | None) -> TenantRef:
    assert caller is not None and caller.tenant is not None, "Access.TENANT lets none other in"
    return caller.tenant


def _visibility(caller: Caller | None) -> str | None:
    """What models the caller sees: its tenant's, every model for an operator,
    the open ones without a key."""
    if caller is None:
        return PUBLIC
    return caller.tenant.name if caller.tenant else None
