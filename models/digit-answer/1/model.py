"""The digits classifier's outputs as an answer: the digit and how sure it is
(the probability of that digit)."""

import numpy as np

INPUTS = [
    {"name": "label", "datatype": "INT64", "shape": [-1]},
    {"name": "probabilities", "datatype": "FP32", "shape": [-1, 10]},
]
OUTPUTS = [
    {"name": "digit", "datatype": "INT64", "shape": [-1]},
    {"name": "confidence", "datatype": "FP32", "shape": [-1]},
]


def postprocess(batch):
    return [
        {
            "digit": request["label"].astype(np.int64),
            "confidence": request["probabilities"].max(axis=1).astype(np.float32),
        }
        for request in batch
    ]
