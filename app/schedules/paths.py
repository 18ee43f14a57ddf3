"""Each tenant's data area: the folder its schedules read inputs from and write
results to, `DATA_DIR/<tenant>`. It is a shared folder (NFS, a mounted bucket)
that the workers which fire schedules can all reach.

A path a tenant names is relative to its area and must stay inside it: an
absolute path, a `..` part, or a symlink whose target lies outside is
refused. It is checked when a schedule is saved and again at every run (a
symlink can be made in between), on the path as the filesystem resolves it.
"""

from __future__ import annotations

import io
import re
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

import numpy as np

from app.batches.files import PART_BYTES
from app.batches.readers import npy_header
from app.errors import InvalidRequest

INPUT_FORMATS = ("npy", "jsonl")
_SAFE_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,100}$")


class InputUnavailable(ValueError):
    """A run's input cannot be read now (missing, empty, mixed formats, ...)."""


def tenant_root(data_dir: Path, tenant_id: int, tenant_name: str) -> Path:
    """The tenant's area: named after the tenant where the name is a plain one."""
    safe = _SAFE_NAME.match(tenant_name) and tenant_name not in (".", "..")
    return data_dir / (tenant_name if safe else f"tenant-{tenant_id}")


def inside(root: Path, relative: str, field: str) -> Path:
    """`relative` resolved within `root`; 422 naming `field` if it leads out."""
    pure = PurePosixPath(relative)
    problem = None
    if not relative.strip() or "\x00" in relative:
        problem = "is empty"
    elif pure.is_absolute() or relative.startswith("\\") or re.match(r"^[A-Za-z]:", relative):
        problem = "is absolute; give a path relative to your data area"
    elif ".." in pure.parts:
        problem = "contains '..'; give a path inside your data area"
    else:
        resolved = (root / pure).resolve()
        if not resolved.is_relative_to(root.resolve()):
            problem = "leads out of your data area (through a symbolic link)"
        else:
            return resolved
    raise InvalidRequest(f"{field} {relative!r} {problem}", errors={field: [problem]})


def input_files(root: Path, relative: str) -> tuple[str, list[Path]]:
    """The format and files a run reads: the file, or a folder's `.npy` or
    `.jsonl` files in name order (one format per folder)."""
    path = inside(root, relative, "input_path")
    if path.is_file():
        candidates = [path]
    elif path.is_dir():
        candidates = sorted(p for p in path.iterdir() if p.suffix[1:] in INPUT_FORMATS)
    else:
        raise InputUnavailable(f"input_path {relative!r} does not exist")
    found = [inside(root, str(p.relative_to(root.resolve())), "input_path") for p in candidates]
    found = [p for p in found if p.is_file()]
    formats = {p.suffix[1:] for p in found}
    if not found:
        raise InputUnavailable(f"input_path {relative!r} holds no .npy or .jsonl file")
    if len(formats) > 1 or not formats <= set(INPUT_FORMATS):
        raise InputUnavailable(f"input_path {relative!r} mixes formats {sorted(formats)}")
    return formats.pop(), found


def read(fmt: str, paths: list[Path]) -> Iterator[bytes]:
    """The files as one input of `fmt`, in parts: `.jsonl` files one after the
    other; `.npy` files as one array (the header says the rows of all)."""
    if fmt == "jsonl":
        for path in paths:
            last = b"\n"
            for part in _parts(path, 0):
                last = part[-1:]
                yield part
            if last != b"\n":
                yield b"\n"
        return
    headers = [_npy_header(path) for path in paths]
    dtype, row_shape = headers[0][1], headers[0][2][1:]
    if any(h[1] != dtype or h[2][1:] != row_shape for h in headers):
        raise InputUnavailable(f"the .npy files differ in dtype or row shape: {paths[0].name} ...")
    header = {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False,
              "shape": (sum(h[2][0] for h in headers), *row_shape)}  # fmt: skip
    out = io.BytesIO()
    np.lib.format.write_array_header_2_0(out, header)
    yield out.getvalue()
    for path, (offset, _, _) in zip(paths, headers, strict=True):
        yield from _parts(path, offset)


def _npy_header(path: Path) -> tuple[int, np.dtype, tuple[int, ...]]:
    with path.open("rb") as f:
        try:
            shape, fortran, dtype = npy_header(f)
        except (ValueError, EOFError) as exc:
            raise InputUnavailable(f"{path.name} is not a readable .npy file ({exc})") from None
        if fortran or dtype.hasobject or not shape:
            raise InputUnavailable(f"{path.name}: a C-ordered array of numbers or text is needed")
        return f.tell(), dtype, tuple(shape)


def _parts(path: Path, offset: int) -> Iterator[bytes]:
    with path.open("rb") as f:
        f.seek(offset)
        while part := f.read(PART_BYTES):
            yield part
