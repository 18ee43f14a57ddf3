"""The committed code in app/grpc/generated is what the .proto files make, and its
descriptors are the very ones Triton's client was generated from."""

from __future__ import annotations

from pathlib import Path

from google.protobuf import descriptor_pb2
from tritonclient.grpc import model_config_pb2 as triton_config
from tritonclient.grpc import service_pb2 as triton_service

from app.grpc import codegen
from app.grpc.generated import grpc_service_pb2, model_config_pb2


def test_the_generated_code_matches_the_protos(tmp_path: Path) -> None:
    made = codegen.generate(tmp_path)
    committed = sorted(p for p in codegen.GENERATED.iterdir() if p.suffix in (".py", ".pyi"))
    assert [p.name for p in made] == [p.name for p in committed]
    for fresh, kept in zip(made, committed, strict=True):
        assert fresh.read_text() == kept.read_text(), (
            f"{kept} is stale: run `python -m app.grpc.codegen` and commit the result"
        )


def test_our_descriptors_are_tritons_so_both_live_in_one_process() -> None:
    for ours, theirs in ((grpc_service_pb2, triton_service), (model_config_pb2, triton_config)):
        mine, other = descriptor_pb2.FileDescriptorProto(), descriptor_pb2.FileDescriptorProto()
        ours.DESCRIPTOR.CopyToProto(mine)
        theirs.DESCRIPTOR.CopyToProto(other)
        assert mine == other, ours.DESCRIPTOR.name
    assert (
        grpc_service_pb2.ModelInferRequest.DESCRIPTOR is triton_service.ModelInferRequest.DESCRIPTOR
    )
