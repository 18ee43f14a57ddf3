"""The stream door: bind the `digits` model to an input log and an output log
(POST /streams), append 30 requests to the input log with redis-py, and read
each result from the output log as its job finishes (`<id> succeeded <digit>`).

Install: pip install ./inference_client redis   (from the repository root)
Reads: INFERENCE_URL (default http://127.0.0.1:8000), INFERENCE_API_KEY and
INFERENCE_REDIS_URL, the Redis of the stream door's logs (default: the socket
of `make run`'s own Redis, unix://$PWD/var/redis/redis.sock, from the repository root).
"""

import json
import os
import time
import uuid

import redis
import requests

BASE = os.environ.get("INFERENCE_URL", "http://127.0.0.1:8000")
AUTH = {"Authorization": f"Bearer {os.environ['INFERENCE_API_KEY']}"}
REDIS_URL = os.environ.get("INFERENCE_REDIS_URL", f"unix://{os.getcwd()}/var/redis/redis.sock")
# Three 8x8 images, 64 pixel values from 0 (white) to 16 (black): a 0, a 1 and a 2.
IMAGES = [
    [0, 0, 5, 13, 9, 1, 0, 0, 0, 0, 13, 15, 10, 15, 5, 0, 0, 3, 15, 2, 0, 11, 8, 0,
     0, 4, 12, 0, 0, 8, 8, 0, 0, 5, 8, 0, 0, 9, 8, 0, 0, 4, 11, 0, 1, 12, 7, 0,
     0, 2, 14, 5, 10, 12, 0, 0, 0, 0, 6, 13, 10, 0, 0, 0],
    [0, 0, 0, 12, 13, 5, 0, 0, 0, 0, 0, 11, 16, 9, 0, 0, 0, 0, 3, 15, 16, 6, 0, 0,
     0, 7, 15, 16, 16, 2, 0, 0, 0, 0, 1, 16, 16, 3, 0, 0, 0, 0, 1, 16, 16, 6, 0, 0,
     0, 0, 1, 16, 16, 6, 0, 0, 0, 0, 0, 11, 16, 10, 0, 0],
    [0, 0, 0, 4, 15, 12, 0, 0, 0, 0, 3, 16, 15, 14, 0, 0, 0, 0, 8, 13, 8, 16, 0, 0,
     0, 0, 1, 6, 15, 11, 0, 0, 0, 1, 8, 13, 15, 1, 0, 0, 0, 9, 16, 16, 5, 0, 0, 0,
     0, 3, 13, 16, 16, 11, 5, 0, 0, 0, 0, 3, 11, 16, 9, 0],
]  # fmt: skip

# 1. Bind: 201 with the full log names (<prefix>:<tenant>:<name>) a producer and a
#    reader use. The input log is bound once: a second run finds its binding (409).
wanted = {"model": "digits", "input": "digits-requests", "output": "digits-results"}
answer = requests.post(f"{BASE}/streams", json=wanted, headers=AUTH, timeout=30)
if answer.status_code == 409:
    bindings = requests.get(f"{BASE}/streams", headers=AUTH, timeout=30).json()["items"]
    binding = next(b for b in bindings if b["input"].endswith(":digits-requests"))
else:
    answer.raise_for_status()
    binding = answer.json()
print("binding:", binding["id"], binding["input"], "->", binding["output"])

r = redis.Redis.from_url(REDIS_URL)
newest = r.xrevrange(binding["output"], count=1)  # read only what this run appends
last = newest[0][0] if newest else "0-0"

# 2. Produce: one entry a request, `id` (yours, to match the result) and `inputs`
#    (JSON, as a job's), appended in one round trip.
run = uuid.uuid4().hex[:8]
pipe = r.pipeline(transaction=False)
for i in range(30):
    request = {"id": f"{run}-{i}", "inputs": json.dumps({"pixels": [IMAGES[i % 3]]})}
    pipe.xadd(binding["input"], request)
pipe.execute()

# 3. Read: one entry a result, in the order the jobs finish: match them by `id`.
seen, deadline = 0, time.monotonic() + 120
while seen < 30:
    if time.monotonic() > deadline:
        raise SystemExit(f"{seen} of 30 results in 120 s: is the stream consumer running?")
    # Block for less than redis-py's own socket timeout (5 s by default): a read
    # blocked as long as the socket waits races it and can end in TimeoutError.
    for _, entries in r.xread({binding["output"]: last}, block=2000) or []:
        for entry_id, fields in entries:
            last = entry_id  # the next read starts after it
            if not fields[b"id"].decode().startswith(run):
                continue  # another producer's result
            seen += 1
            status = fields[b"status"].decode()
            if status == "succeeded":
                label = json.loads(fields[b"outputs"])["label"][0]
                print(fields[b"id"].decode(), status, label, "job:", fields[b"job_id"].decode())
            else:
                print(fields[b"id"].decode(), status, json.loads(fields[b"error"])["detail"])
print(f"{seen} results read")
