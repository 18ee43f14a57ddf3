"""The textbook's API: insert the row and commit, then `run_job.delay(id)`.
Served by gunicorn (2 workers, gthread, 16 threads), like the service's API."""

from __future__ import annotations

import uuid
from typing import Any

from flask import Flask, abort, request

from bench.peers.textbook.db import Job, Session
from bench.peers.textbook.tasks import run_job

app = Flask(__name__)


@app.post("/jobs")
def submit() -> tuple[dict[str, Any], int]:
    body = request.get_json()
    if not isinstance(body, dict) or "model" not in body or "inputs" not in body:
        abort(422)
    job_id = uuid.uuid4()
    with Session() as db:
        db.add(Job(id=job_id, model=body["model"], inputs=body["inputs"], status="queued"))
        db.commit()
    run_job.delay(str(job_id))
    return {"id": str(job_id)}, 202


@app.get("/jobs/<uuid:job_id>")
def get_job(job_id: uuid.UUID) -> dict[str, Any]:
    with Session() as db:
        job = db.get(Job, job_id)
        if job is None:
            abort(404)
        return job.to_dict()


@app.get("/health")
def health() -> dict[str, bool]:
    return {"ok": True}
