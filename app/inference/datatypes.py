"""KServe v2 datatypes and their numpy / ONNX equivalents."""

from __future__ import annotations

import numpy as np

# v2 datatype -> numpy dtype
V2_TO_NUMPY: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16),
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
}

NUMPY_TO_V2: dict[np.dtype, str] = {dtype: name for name, dtype in V2_TO_NUMPY.items()}

# ONNX Runtime's type strings -> v2 datatype
ORT_TO_V2: dict[str, str] = {
    "tensor(bool)": "BOOL",
    "tensor(uint8)": "UINT8",
    "tensor(int8)": "INT8",
    "tensor(int16)": "INT16",
    "tensor(int32)": "INT32",
    "tensor(int64)": "INT64",
    "tensor(float16)": "FP16",
    "tensor(float)": "FP32",
    "tensor(double)": "FP64",
}


def is_float(datatype: str) -> bool:
    return datatype.startswith("FP")
