"""Structured data out of documents with OpenAI's own client: each support ticket
read into a JSON object that matches a schema (guaranteed, by constrained
decoding), given a tone label with its probability (label scores, not sampled),
and an embedding to find similar tickets; then one answer made in the
background, stored by the service, and fetched when it is done.

Install: pip install openai
Reads: INFERENCE_URL (default http://127.0.0.1:8000) and INFERENCE_API_KEY.
"""

import json
import os
import time

from openai import OpenAI

base = os.environ.get("INFERENCE_URL", "http://127.0.0.1:8000")
client = OpenAI(base_url=f"{base}/v1", api_key=os.environ["INFERENCE_API_KEY"])

TICKETS = [
    "I was charged twice for my subscription this month, please refund me.",
    "The app crashes every time I open the settings page on my phone.",
    "Could someone tell me about your enterprise pricing for 200 seats?",
    "Thank you so much, your support team was wonderful!",
]
SCHEMA = {
    "type": "object",
    "properties": {
        "summary": {"type": "string", "maxLength": 80},
        "urgent": {"type": "boolean"},
        "product_area": {"enum": ["billing", "mobile app", "sales", "other"]},
    },
    "required": ["summary", "urgent", "product_area"],
    "additionalProperties": False,
}
TONES = ["positive", "negative", "neutral"]

for ticket in TICKETS:
    # 1. A JSON object that parses and matches SCHEMA, whatever the model would say.
    extracted = client.chat.completions.create(
        model="smollm2",
        messages=[{"role": "user", "content": f"Read this support ticket:\n\n{ticket}"}],
        temperature=0,
        max_tokens=120,
        response_format={"type": "json_schema",
                         "json_schema": {"name": "ticket", "schema": SCHEMA, "strict": True}},
    )  # fmt: skip
    row = json.loads(extracted.choices[0].message.content or "")
    # 2. Its tone: each label's probability, from one read of the prompt.
    scored = client.chat.completions.create(
        model="smollm2",
        messages=[{"role": "user", "content": "Is the sentiment of this ticket positive, "
                   f"negative or neutral? Answer with one word.\n\n{ticket}"}],
        extra_body={"labels": TONES},
    )  # fmt: skip
    scores = (scored.choices[0].model_extra or {})["label_scores"]
    tone = max(scores, key=scores.get)
    print(json.dumps(row), f"tone={tone} ({scores[tone]:.2f})")

# 3. Embeddings: one unit vector per ticket; a dot product is their similarity.
vectors = [d.embedding for d in client.embeddings.create(model="minilm", input=TICKETS).data]
similar = sum(a * b for a, b in zip(vectors[0], vectors[1], strict=True))
print(f"{len(vectors)} embeddings of {len(vectors[0])} dimensions; 1~2: {similar:.2f}")

# 4. A response made in the background: stored in the service's database, so it
# survives restarts; poll it (or stream it, or get a webhook) until it is done.
response = client.responses.create(
    model="smollm2", input=f"Write a short, polite reply to this ticket:\n\n{TICKETS[0]}",
    temperature=0, max_output_tokens=80, background=True,
)  # fmt: skip
while response.status in ("queued", "in_progress"):
    time.sleep(0.5)
    response = client.responses.retrieve(response.id)
print(f"response {response.id}: {response.status}, {len(response.output_text)} characters")
