"""A streaming chat with OpenAI's own client against the OpenAI-compatible door
(/v1): ask the `smollm2` chat model a question and print its answer piece by
piece as the workers make it, then the job that recorded it.

Install: pip install openai
Reads: INFERENCE_URL (default http://127.0.0.1:8000) and INFERENCE_API_KEY.
"""

import os

from openai import OpenAI

base = os.environ.get("INFERENCE_URL", "http://127.0.0.1:8000")
client = OpenAI(base_url=f"{base}/v1", api_key=os.environ["INFERENCE_API_KEY"])

stream = client.chat.completions.create(
    model="smollm2",
    messages=[{"role": "user", "content": "What is 2+2?"}],
    temperature=0,  # greedy: the same answer every time
    max_tokens=64,
    stream=True,  # Server-Sent Events: a chunk per piece of text
)
pieces, job_id, finish = 0, "", None
for chunk in stream:
    job_id = chunk.id  # the job's id: GET /jobs/<id> shows the whole text
    if not chunk.choices:
        continue
    text = chunk.choices[0].delta.content
    if text:
        pieces += 1
        print(text, end="", flush=True)
    finish = chunk.choices[0].finish_reason or finish
print()
print(f"{pieces} pieces, finish_reason: {finish}, job: {job_id}")
