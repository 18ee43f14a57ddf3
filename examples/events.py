"""Follow a job's Server-Sent Events (GET /jobs/<id>/events): submit a digit to
the `digits` model and print each change of state as it happens, then the
prediction that the terminal event carries (`digit: 0`).

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
    job = client.jobs.submit("digits", {"pixels": PIXELS})
    print("job:", job.id)
    # One event per change of state, read as it comes; a dropped stream is resumed
    # with Last-Event-ID, so no event is missed or repeated. The terminal event
    # (job.succeeded, job.failed, ...) carries the whole job, then the stream ends.
    for event in client.jobs.events(job.id, timeout=60):
        print(f"event {event.id}: {event.type}")
        if event.terminal and event.job is not None and event.job.outputs is not None:
            print("digit:", event.job.outputs["label"][0])
