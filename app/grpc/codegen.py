"""Generate `app/grpc/generated/` from `app/grpc/protos/*.proto`.

`python -m app.grpc.codegen` writes the committed files; the codegen test calls
`generate` into a temporary folder and compares. Needs `grpcio-tools` (a
development requirement only): the service itself imports just the output.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

PROTOS = Path(__file__).parent / "protos"
GENERATED = Path(__file__).parent / "generated"
PACKAGE = "app.grpc.generated"
_HEADER = '"""Generated from app/grpc/protos by `python -m app.grpc.codegen`: do not edit."""\n'
# protoc writes `import model_config_pb2 as ...` (a top-level module); ours live
# in a package.
_IMPORT = re.compile(r"^import (\w+_pb2) as ", re.MULTILINE)


def generate(out: Path = GENERATED) -> list[Path]:
    """Run protoc over every .proto; returns the files written (sorted)."""
    from grpc_tools import protoc

    out.mkdir(parents=True, exist_ok=True)
    protos = sorted(p.name for p in PROTOS.glob("*.proto"))
    include = Path(protoc.__file__).parent / "_proto"  # google/protobuf/*.proto
    args = ["protoc", f"-I{PROTOS}", f"-I{include}", f"--python_out={out}",
            f"--pyi_out={out}", f"--grpc_python_out={out}", *protos]  # fmt: skip
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed on {protos}")
    written = sorted(p for p in out.iterdir() if p.suffix in (".py", ".pyi") and "_pb2" in p.name)
    for path in written:
        text = _IMPORT.sub(rf"from {PACKAGE} import \1 as ", path.read_text())
        path.write_text(text)
    init = out / "__init__.py"
    init.write_text(_HEADER)
    return sorted([*written, init])


if __name__ == "__main__":
    for path in generate(Path(sys.argv[1]) if len(sys.argv) > 1 else GENERATED):
        print(path)
