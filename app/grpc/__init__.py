"""The gRPC door: KServe v2 / Triton's `inference.GRPCInferenceService` over the
operations (`servicer`), its RPC table and key check (`door`), the protobuf
tensor codec (`codec`), streams (`stream`), the status-code mapping (`status`)
and the server (`server`, `python -m app.grpc`). It needs nothing from `app.web`."""
