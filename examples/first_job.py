"""The first job with the Python client: submit an 8x8 image of a handwritten
digit to the `digits` model, wait for the job, print the prediction (`digit: 0`).

Install: pip install ./inference_client   (from the repository root)
Reads: INFERENCE_URL (default http://127.0.0.1:8000) and INFERENCE_API_KEY.
"""

from inference_client import Client

# An 8x8 image, 64 pixel values from 0 (white) to 16 (black): a handwritten 0.
PIXELS = [
    [0, 0, 5, 13, 9, 1, 0, 0,
     0, 0, 13, 15, 10, 15, 5, 0,
     0, 3, 15, 2, 0, 11, 8, 0,
     0, 4, 12, 0, 0, 8, 8, 0,
     0, 5, 8, 0, 0, 9, 8, 0,
     0, 4, 11, 0, 1, 12, 7, 0,
     0, 2, 14, 5, 10, 12, 0, 0,
     0, 0, 6, 13, 10, 0, 0, 0],
]  # fmt: skip

with Client() as client:  # INFERENCE_URL and INFERENCE_API_KEY from the environment
    job = client.jobs.submit("digits", {"pixels": PIXELS})  # 202: queued, with its id
    print("job:", job.id)
    done = client.jobs.wait(job.id, timeout=60)  # long-polls GET /jobs/<id>?wait=30
    print("status:", done.status)
    if not done.succeeded or done.outputs is None:
        raise SystemExit(f"the job ended {done.status}: {done.error}")
    print("digit:", done.outputs["label"][0])
