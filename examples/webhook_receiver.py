"""Results by webhook: start a receiver on loopback, submit a digit to the
`digits` model naming the receiver's URL, and print the event the service
delivers once the job has finished, after verifying its signature.

The service refuses webhook URLs on loopback unless it was started with
WEBHOOK_ALLOW_PRIVATE_NETWORKS=true (`WEBHOOK_ALLOW_PRIVATE_NETWORKS=true make run`).

Install: pip install "./inference_client[webhooks]"   (from the repository root)
Reads: INFERENCE_URL (default http://127.0.0.1:8000), INFERENCE_API_KEY and
INFERENCE_WEBHOOK_SECRET (the tenant's whsec_... signing secret).
"""

import os
import queue
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from inference_client import Client, WebhookVerificationError, verify_webhook

SECRET = os.environ["INFERENCE_WEBHOOK_SECRET"]
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
events: "queue.Queue[dict[str, Any]]" = queue.Queue()
seen: set[str] = set()  # webhook-id of each event handled: deliveries are at least once


class Hooks(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        try:  # the body exactly as received, before any JSON parsing
            event = verify_webhook(body, dict(self.headers), SECRET)
        except WebhookVerificationError:
            self.send_response(400)  # not signed with our secret, or too old
        else:
            self.send_response(204)  # any 2xx: delivered; anything else is retried
            if self.headers["webhook-id"] not in seen:
                seen.add(self.headers["webhook-id"])
                events.put(event)
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass  # quiet


server = ThreadingHTTPServer(("127.0.0.1", 0), Hooks)  # loopback, a free port
threading.Thread(target=server.serve_forever, daemon=True).start()
url = f"http://127.0.0.1:{server.server_port}/hooks/inference"
print("receiver:", url)

with Client() as client:  # INFERENCE_URL and INFERENCE_API_KEY from the environment
    # Events: the four terminal ones by default; "events": [...] to choose.
    job = client.jobs.submit("digits", {"pixels": PIXELS}, webhook=url)
    print("job:", job.id)
    event = events.get(timeout=60)  # the delivery comes from the webhook worker
    data = event["data"]  # the job, as GET /jobs/<id> returns it
    print("event:", event["type"], data["id"])
    print("digit:", data["outputs"]["label"][0])
server.shutdown()
