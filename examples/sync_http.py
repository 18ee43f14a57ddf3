"""A sync call over HTTP with Triton's own client: three 8x8 digit images to
the `digits` model on the KServe v2 door (POST /v2/models/digits/infer); the
answer comes back on the same request (`digits: [0 1 2]`) with the id of the
job that recorded it.

Install: pip install "tritonclient[http]"   (numpy comes with it)
Reads: INFERENCE_URL (default http://127.0.0.1:8000) and INFERENCE_API_KEY.
"""

import os
from urllib.parse import urlsplit

import numpy as np
import tritonclient.http as triton

url = urlsplit(os.environ.get("INFERENCE_URL", "http://127.0.0.1:8000"))
client = triton.InferenceServerClient(url.netloc, ssl=url.scheme == "https")
headers = {"Authorization": f"Bearer {os.environ['INFERENCE_API_KEY']}"}

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

pixels = triton.InferInput("pixels", list(rows.shape), "FP32")
pixels.set_data_from_numpy(rows)  # sent as binary tensor data, as tritonclient does
result = client.infer("digits", [pixels], headers=headers)
print("digits:", result.as_numpy("label"))
print("probabilities:", result.as_numpy("probabilities").shape)
print("job:", result.get_response()["parameters"]["job_id"])  # GET /jobs/<id> shows it
