"""Sync calls over gRPC with Triton's own client, on the KServe v2 gRPC door:
one unary call (`digit: 0` and the job that recorded it), then three calls on
one stream, each answer matched to its request by id
(`stream: {'row-0': 0, 'row-1': 1, 'row-2': 2}`).

Install: pip install "tritonclient[grpc]"   (numpy comes with it)
         (in the service's .venv: pip install "tritonclient[http]"; grpcio is there already)
Reads: INFERENCE_GRPC_ADDRESS (default 127.0.0.1:8001) and INFERENCE_API_KEY.
"""

import os
from typing import Any

import numpy as np
import tritonclient.grpc as triton

client = triton.InferenceServerClient(os.environ.get("INFERENCE_GRPC_ADDRESS", "127.0.0.1:8001"))
key = {"authorization": f"Bearer {os.environ['INFERENCE_API_KEY']}"}  # metadata, as on HTTP

# Three 8x8 images, 64 pixel values from 0 (white) to 16 (black): a 0, a 1 and a 2.
rows = np.array([
    [0, 0, 5, 13, 9, 1, 0, 0, 0, 0, 13, 15, 10, 15, 5, 0, 0, 3, 15, 2, 0, 11, 8, 0,
     0, 4, 12, 0, 0, 8, 8, 0, 0, 5, 8, 0, 0, 9, 8, 0, 0, 4, 11, 0, 1, 12, 7, 0,
     0, 2, 14, 5, 10, 12, 0, 0, 0, 0, 6, 13, 10, 0, 0, 0],
    [0, 0, 0, 12, 13, 5, 0, 0, 0, 0, 0, 11, 16, 9, 0, 0, 0, 0, 3, 15, 16, 6, 0, 0,
     0, 7, 15, 16, 16, 2, 0, 0, 0, 0, 1, 16, 16, 3, 0, 0, 0, 0, 1, 16, 16, 6, 0, 0,
     0, 0, 1, 16, 16, 6, 0, 0, 0, 0, 0, 11, 16, 10, 0, 0],
    [0, 0, 0, 4, 15, 12, 0, 0, 0, 0, 3, 16, 15, 14, 0, 0, 0, 0, 8, 13, 8, 16, 0, 0,
     0, 0, 1, 6, 15, 11, 0, 0, 0, 1, 8, 13, 15, 1, 0, 0, 0, 9, 16, 16, 5, 0, 0, 0,
     0, 3, 13, 16, 16, 11, 5, 0, 0, 0, 0, 3, 11, 16, 9, 0],
], dtype=np.float32)  # fmt: skip


def pixels(row: np.ndarray) -> triton.InferInput:
    tensor = triton.InferInput("pixels", [1, 64], "FP32")
    tensor.set_data_from_numpy(row.reshape(1, 64))
    return tensor


# One call: the answer, and the job that ran it (GET /jobs/<id> shows it).
result = client.infer("digits", [pixels(rows[0])], headers=key)
job_id = result.get_response().parameters["job_id"].string_param
print("digit:", result.as_numpy("label")[0], "job:", job_id)

# Many calls on one stream: each answer comes as its job finishes, matched by id.
answers: dict[str, Any] = {}


def on_answer(result: Any, error: Any) -> None:  # on the client's thread, once per request
    if error is not None:
        answers["error"] = str(error)
    else:
        answers[result.get_response().id] = int(result.as_numpy("label")[0])


client.start_stream(on_answer, headers=key)
for i, row in enumerate(rows):
    client.async_stream_infer("digits", [pixels(row)], request_id=f"row-{i}")
client.stop_stream()  # returns once every request was answered
print("stream:", dict(sorted(answers.items())))
if "error" in answers:
    raise SystemExit(answers["error"])
