"""The GPU check's packing (tools/gpu_check.py): what it carries, and parts that
come back whole or are named when one went missing or changed on the way. (Its
run is tried end to end by `make gpu-check`: it downloads wheels, builds the
models and runs the benchmarks, minutes of both cores.)"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tools.gpu_check import cut, join, one_version_each, pinned


def test_it_carries_the_service_s_pins_less_what_the_gpu_machine_holds() -> None:
    carried = pinned(("requirements.txt", "requirements-build.txt"), {"numpy", "scikit-learn"})
    names = {line.split("==")[0].lower() for line in carried}
    assert "onnxruntime-gpu==1.31.1" in carried
    assert {"celery[redis]", "pgserver", "gguf", "onnx"} <= names
    assert not {"numpy", "scikit-learn"} & names, "what the machine holds stays here"
    assert len(carried) == len(set(carried)), "requirements.txt, named twice, is read once"


def test_parts_join_back_whole_and_a_changed_or_missing_one_is_named(tmp_path: Path) -> None:
    archive = tmp_path / "wheels.tar"
    archive.write_bytes(os.urandom(10_000))
    stage = tmp_path / "stage"
    stage.mkdir()
    parts = cut(archive, stage, 4096)
    assert [p.name for p in parts] == ["part-00", "part-01", "part-02"]
    assert max(p.stat().st_size for p in parts) <= 4096
    join(stage, tmp_path / "joined.tar")
    assert (tmp_path / "joined.tar").read_bytes() == archive.read_bytes()

    data = bytearray(parts[1].read_bytes())
    data[0] ^= 1
    parts[1].write_bytes(bytes(data))
    with pytest.raises(SystemExit, match="part-01: missing or not as packed"):
        join(stage, tmp_path / "again.tar")
    parts[2].unlink()
    with pytest.raises(SystemExit, match="part-01"):
        join(stage, tmp_path / "again.tar")


def test_a_locked_package_brought_again_by_a_test_tool_keeps_its_locked_version(
    tmp_path: Path,
) -> None:
    for name in (
        "packaging-26.3-py3-none-any.whl",
        "packaging-26.4-py3-none-any.whl",
        "pluggy-1.7.0-py3-none-any.whl",
        "typing_extensions-4.16.0-py3-none-any.whl",
    ):
        (tmp_path / name).write_bytes(b"")  # fmt: skip
    one_version_each(tmp_path, ["packaging==26.3", "typing-extensions==4.16.0"])
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "packaging-26.3-py3-none-any.whl", "pluggy-1.7.0-py3-none-any.whl",
        "typing_extensions-4.16.0-py3-none-any.whl"]  # fmt: skip
