"""Generated from app/grpc/protos by `python -m app.grpc.codegen`: do not edit."""
