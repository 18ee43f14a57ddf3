"""(k) bulk submit: the load client counts a bulk answer's jobs one by one, and a
service without the route gets a row that says so instead of a failed run."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from bench import bulk, load


class _Bulk(BaseHTTPRequestHandler):
    """POST /jobs/bulk: a job for each item, a problem for an item without "model";
    any other path 404."""

    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path != "/jobs/bulk":
            self._answer(404, {"title": "Not Found"})
            return
        jobs = [
            {"id": f"job-{i}", "status": "queued"} if "model" in item else {"status": 422}
            for i, item in enumerate(body["jobs"])
        ]
        self._answer(202, {"jobs": jobs})

    def _answer(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *_args: Any) -> None:
        pass


@pytest.fixture
def port() -> Iterator[int]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Bulk)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def test_bulk_bodies_carry_the_job_requests_unchanged() -> None:
    jobs = [json.dumps({"model": "digits", "inputs": {"pixels": [[float(i)]]}}).encode()
            for i in range(7)]  # fmt: skip
    bodies = load.bulk_bodies(jobs, 3)
    assert [len(json.loads(b)["jobs"]) for b in bodies] == [3, 3]
    assert json.loads(bodies[1])["jobs"][0] == json.loads(jobs[3])
    assert len(load.bulk_bodies(jobs[:2], 3)) == 1  # fewer jobs than a bulk: repeated


def test_each_item_of_a_bulk_answer_is_counted(port: int) -> None:
    good = json.dumps({"model": "digits", "inputs": {}}).encode()
    body = b'{"jobs":[' + b",".join([good, good, b"{}"]) + b"]}"
    endpoint = load.Endpoint(port, "/jobs/bulk", "id", many="jobs")
    result = load.closed_loop(endpoint, [body], 4, 2)
    assert (result.sent, result.accepted, result.items_refused) == (4, 8, 4)
    assert sorted(set(result.ids)) == ["job-0", "job-1"]
    assert len(result.latencies_ms) == 4


def test_a_missing_route_is_reported_not_raised(port: int) -> None:
    class NoBulk:
        bulk_endpoint = load.Endpoint(port, "/jobs/many", "id", many="jobs")
        store = object()  # not reached

    row = bulk.bulk_jobs(NoBulk(), [b'{"jobs":[]}'], 100, 1.0)  # type: ignore[arg-type]
    assert row is not None and row["jobs_per_s"] is None
    assert (row["missing"], row["answered"]) == ("route missing", 404)
