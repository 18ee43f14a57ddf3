"""Where a decode engine keeps its key/value cache: host memory or a CUDA device.

Both hold one buffer per graph cache input, [slots, kv_heads, positions, head],
bound as both the past input and the present output of a call (so
GroupQueryAttention appends in place), and both can grow or shrink the
positions keeping what is written, move or swap one slot's rows, and save a
slot's first rows apart (the prefix cache, app.runtime.prefixes) and load them
into a slot again.

On the CPU provider the buffers are numpy arrays. On the CUDA provider a host
buffer would be copied to the device and back on every call (60 tensors a
step), so `DeviceCache` allocates them on the session's GPU and binds raw
device pointers to a range of slots; its copies (growth, moving a slot) are
CUDA runtime copies between device addresses, through ctypes, since ONNX
Runtime's Python API has no device-to-device copy of part of a tensor.
"""

from __future__ import annotations

import ctypes
from typing import Any, Protocol

import numpy as np
import onnxruntime as ort

_DTYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16}


class KVCache(Protocol):
    positions: int
    epoch: int  # counts reallocations: bindings made before one are stale

    def fit(self, positions: int) -> None: ...
    def move(self, source: int, target: int, filled: int) -> None: ...
    def swap(self, a: int, a_filled: int, b: int, b_filled: int) -> None: ...
    def bind(self, binding: Any, first: int, end: int) -> None: ...
    def save(self, slot: int, filled: int) -> Any: ...
    def load(self, rows: Any, slot: int, filled: int) -> None: ...
    @property
    def token_bytes(self) -> int: ...


def cache_for(session: ort.InferenceSession, slots: int, positions: int) -> KVCache:
    """The cache that suits the session's provider, sized for `positions`."""
    caches = [i for i in session.get_inputs() if i.name.startswith("past_key_values.")]
    names = [i.name for i in caches]
    kv_heads, head = int(caches[0].shape[1]), int(caches[0].shape[3])
    dtype = _DTYPES[caches[0].type]
    if session.get_providers()[0] == "CUDAExecutionProvider":
        options = session.get_provider_options().get("CUDAExecutionProvider", {})
        device = int(options.get("device_id", 0))
        return DeviceCache(names, slots, kv_heads, head, dtype, positions, device)
    return HostCache(names, slots, kv_heads, head, dtype, positions)


def _present(name: str) -> str:
    return name.replace("past_key_values.", "present.")


class HostCache:
    def __init__(self, names: list[str], slots: int, kv_heads: int, head: int,
                 dtype: Any, positions: int) -> None:  # fmt: skip
        self.names, self.slots, self.kv_heads, self.head = names, slots, kv_heads, head
        self.dtype = dtype
        self.buffers: list[np.ndarray] = []
        self._views: dict[tuple[int, int], list[ort.OrtValue]] = {}
        self.positions = self.epoch = 0
        self.fit(positions)

    def fit(self, positions: int) -> None:
        shape = (self.slots, self.kv_heads, positions, self.head)
        old = self.buffers
        self.buffers = [np.zeros(shape, self.dtype) for _ in self.names]
        for buffer, previous in zip(self.buffers, old, strict=False):
            keep = min(previous.shape[2], positions)
            buffer[:, :, :keep] = previous[:, :, :keep]
        self.positions = positions
        self.epoch += 1
        self._views.clear()

    def move(self, source: int, target: int, filled: int) -> None:
        for buffer in self.buffers:
            buffer[target, :, :filled] = buffer[source, :, :filled]

    def swap(self, a: int, a_filled: int, b: int, b_filled: int) -> None:
        for buffer in self.buffers:
            kept = buffer[b, :, :b_filled].copy()
            buffer[b, :, :a_filled] = buffer[a, :, :a_filled]
            buffer[a, :, :b_filled] = kept

    @property
    def token_bytes(self) -> int:
        return len(self.names) * self.kv_heads * self.head * np.dtype(self.dtype).itemsize

    def save(self, slot: int, filled: int) -> list[np.ndarray]:
        return [buffer[slot, :, :filled].copy() for buffer in self.buffers]

    def load(self, rows: list[np.ndarray], slot: int, filled: int) -> None:
        for buffer, kept in zip(self.buffers, rows, strict=True):
            buffer[slot, :, :filled] = kept[:, :filled]

    def bind(self, binding: Any, first: int, end: int) -> None:
        key = (first, end)
        if key not in self._views:  # made once per range: values over the same memory
            self._views[key] = [ort.OrtValue.ortvalue_from_numpy(b[first:end])
                                for b in self.buffers]  # fmt: skip
        for name, value in zip(self.names, self._views[key], strict=True):
            binding.bind_ortvalue_input(name, value)
            binding.bind_ortvalue_output(_present(name), value)


_DEVICE_TO_DEVICE = 3  # cudaMemcpyDeviceToDevice


def _cudart() -> Any:
    """The CUDA runtime ONNX Runtime's CUDA provider has loaded (found by soname)."""
    for name in ("libcudart.so.13", "libcudart.so.12", "libcudart.so"):
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    raise RuntimeError("the CUDA runtime library (libcudart) is not loaded")


class DeviceCache:
    def __init__(self, names: list[str], slots: int, kv_heads: int, head: int, dtype: Any,
                 positions: int, device: int) -> None:  # fmt: skip
        self.names, self.slots, self.kv_heads, self.head = names, slots, kv_heads, head
        self.dtype, self.device = dtype, device
        self.item = np.dtype(dtype).itemsize
        self.cuda = _cudart()
        for fn in (self.cuda.cudaMemcpy2D, self.cuda.cudaMemcpy):
            fn.restype = ctypes.c_int
        self.values: list[ort.OrtValue] = []
        self.scratch: ort.OrtValue | None = None
        self.positions = self.epoch = 0
        self.fit(positions)

    def _new(self, slots: int, positions: int) -> ort.OrtValue:
        shape = [slots, self.kv_heads, positions, self.head]
        return ort.OrtValue.ortvalue_from_shape_and_type(shape, self.dtype, "cuda", self.device)

    def _copy2d(self, target: int, target_pitch: int, source: int, source_pitch: int,
                width: int, rows: int) -> None:  # fmt: skip
        status = self.cuda.cudaMemcpy2D(
            ctypes.c_void_p(target), ctypes.c_size_t(target_pitch), ctypes.c_void_p(source),
            ctypes.c_size_t(source_pitch), ctypes.c_size_t(width), ctypes.c_size_t(rows),
            ctypes.c_int(_DEVICE_TO_DEVICE),
        )  # fmt: skip
        if status != 0:
            raise RuntimeError(f"cudaMemcpy2D failed with CUDA error {status}")

    def _synchronize(self) -> None:
        """ONNX Runtime runs on its own stream: the copies end before its next call."""
        status = self.cuda.cudaDeviceSynchronize()
        if status != 0:
            raise RuntimeError(f"cudaDeviceSynchronize failed with CUDA error {status}")

    def fit(self, positions: int) -> None:
        old, old_positions = self.values, self.positions
        self.values = [self._new(self.slots, positions) for _ in self.names]
        row, rows = self.head * self.item, self.slots * self.kv_heads
        keep = min(old_positions, positions)
        for value, previous in zip(self.values, old, strict=False):
            if keep:  # each (slot, kv head) row of positions: one pitched copy
                self._copy2d(value.data_ptr(), positions * row, previous.data_ptr(),
                             old_positions * row, keep * row, rows)  # fmt: skip
        self.positions = positions
        self.epoch += 1
        self.scratch = self._new(1, positions)
        self._synchronize()

    def _slot(self, value: ort.OrtValue, slot: int) -> int:
        return int(value.data_ptr()) + slot * self.kv_heads * self.positions * self.head * self.item

    def _rows(self, target: int, source: int, filled: int) -> None:
        pitch, row = self.positions * self.head * self.item, self.head * self.item
        self._copy2d(target, pitch, source, pitch, filled * row, self.kv_heads)

    def move(self, source: int, target: int, filled: int) -> None:
        for value in self.values:
            self._rows(self._slot(value, target), self._slot(value, source), filled)
        self._synchronize()

    def swap(self, a: int, a_filled: int, b: int, b_filled: int) -> None:
        assert self.scratch is not None
        kept = int(self.scratch.data_ptr())
        for value in self.values:
            self._rows(kept, self._slot(value, b), b_filled)
            self._rows(self._slot(value, b), self._slot(value, a), a_filled)
            self._rows(self._slot(value, a), kept, b_filled)
        self._synchronize()

    @property
    def token_bytes(self) -> int:
        return len(self.names) * self.kv_heads * self.head * self.item

    def save(self, slot: int, filled: int) -> list[ort.OrtValue]:
        """The slot's first rows copied into buffers of their own on the device."""
        row = self.head * self.item
        kept = [self._new(1, filled) for _ in self.names]
        for value, into in zip(self.values, kept, strict=True):
            self._copy2d(into.data_ptr(), filled * row, self._slot(value, slot),
                         self.positions * row, filled * row, self.kv_heads)  # fmt: skip
        self._synchronize()
        return kept

    def load(self, rows: list[ort.OrtValue], slot: int, filled: int) -> None:
        row = self.head * self.item
        for value, kept in zip(self.values, rows, strict=True):
            width = int(kept.shape()[2]) * row
            self._copy2d(self._slot(value, slot), self.positions * row, kept.data_ptr(),
                         width, filled * row, self.kv_heads)  # fmt: skip
        self._synchronize()

    def bind(self, binding: Any, first: int, end: int) -> None:
        shape = [end - first, self.kv_heads, self.positions, self.head]
        for name, value in zip(self.names, self.values, strict=True):
            pointer = self._slot(value, first)
            binding.bind_input(name, "cuda", self.device, self.dtype, shape, pointer)
            binding.bind_output(_present(name), "cuda", self.device, self.dtype, shape, pointer)
