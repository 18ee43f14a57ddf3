"""The status page in a real browser (headless Chromium, over DevTools): a real
HTTP server on loopback serves the app, a real worker runs the jobs submitted
to it, one of which fails into a dead letter. What the browser rendered must
equal the tables; the operator view appears only after the sign-in form was
posted with an operator key, through a cookie scripts cannot read, and goes
with "sign out". `UPDATE_SCREENSHOTS=1` writes docs/status-page.png."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import sqlalchemy as sa
from flask import Flask

from app import create_app
from app.platform.database import Database
from app.platform.settings import ROOT, Settings
from app.tenancy.keys import create_operator_key
from app.web.context import container_of
from tests.browser.chromium import Browser
from tests.conftest import STAGED, WorkerProcess, insert_queued_job, make_tenant
from tests.models import HUGE
from tests.status.oracle import as_page, expected_lines, open_dead_letters, table_of
from tests.support import LiveServer, starts_processes, wait_until

DIGIT = [[0, 0, 5, 13, 9, 1, 0, 0] * 8]
# Every element with a number, as the browser rendered its text.
CELLS = """JSON.stringify([...document.querySelectorAll('[data-metric]')].map(
    e => [e.dataset.model || e.dataset.queue || '', e.dataset.metric, e.innerText.trim()]))"""


@pytest.fixture(scope="module")
def served_app(settings: Settings) -> Iterator[Flask]:
    """Jobs get one attempt (a failure is a dead letter at once); nothing cached."""
    app = create_app(
        settings.with_overrides(
            status_cache_seconds=0,
            api_key_cache_seconds=0,
            job_max_attempts=1,
            flower_url="http://127.0.0.1:5555",
        )
    )
    yield app
    container_of(app).parts.database.engine.dispose()


@pytest.fixture
def base_url(served_app: Flask, serve: Callable[[Flask], LiveServer]) -> str:
    return serve(served_app).url


@pytest.fixture
@starts_processes
def browser(tmp_path: Path) -> Iterator[Browser]:
    chromium = Browser(tmp_path / "profile")
    yield chromium
    chromium.close()


def rendered(browser: Browser) -> dict[tuple[str, str], str]:
    import json

    return {(model, metric): text for model, metric, text in json.loads(browser.run(CELLS))}


def steady(database: Database, public: set[str] | None) -> tuple[Any, Any]:
    return expected_lines(database, public), open_dead_letters(database)


def load_and_compare(
    browser: Browser, url: str, database: Database, public: set[str] | None
) -> dict[tuple[str, str], str]:
    """Load the page and check its numbers against the tables, read before and
    after the load (again if something finished in between)."""
    for _ in range(3):
        before = steady(database, public)
        browser.open(url)
        cells = rendered(browser)
        if steady(database, public) == before:
            break
    lines, letters = before
    assert table_of(cells) == as_page(lines)
    assert int(cells[("", "dead-letters")]) == letters
    return cells


def test_the_status_page_in_a_browser(
    served_app: Flask,
    base_url: str,
    browser: Browser,
    worker: WorkerProcess,
    database: Database,
    settings: Settings,
    tmp_path: Path,
) -> None:
    tenant = make_tenant(database)
    with database.sessionmaker.begin() as session:
        operator_key = create_operator_key(session)
    # Work for the page: jobs that succeed, one that fails (ORT cannot allocate 40 TB)
    # and so becomes a dead letter, and a few that wait in a queue nobody drains.
    submitted = [
        requests.post(f"{base_url}/jobs", headers=tenant.headers, timeout=30, json=body).json()
        for body in [{"model": "digits", "inputs": {"pixels": DIGIT}}] * 3
        + [{"model": "memhog", "inputs": {"n": [HUGE]}}]
    ]
    for _ in range(4):
        insert_queued_job(database, tenant.id, model=STAGED, enqueued_seconds_ago=240)
    failed_id = submitted[-1]["id"]
    finished = [_wait(base_url, tenant.headers, job["id"]) for job in submitted]
    assert [j["status"] for j in finished] == ["succeeded"] * 3 + ["failed"]
    with database.engine.connect() as conn:
        letter = conn.execute(
            sa.text("SELECT id, error_code FROM dead_letters WHERE job_id = :j"), {"j": failed_id}
        ).one()

    public = {m["name"] for m in requests.get(f"{base_url}/models", timeout=10).json()["models"]}
    cells = load_and_compare(browser, f"{base_url}/", database, public)
    census = container_of(served_app).parts.celery.control.inspect(timeout=2).active_queues() or {}
    serving = sum(settings.jobs_queue in [q["name"] for q in qs] for qs in census.values())
    assert int(cells[(settings.jobs_queue, "workers")]) == serving >= 1
    assert int(cells[("", "workers-online")]) >= 1
    assert browser.run("document.getElementById('operator')") is None
    assert failed_id not in browser.dom()
    browser.screenshot(tmp_path / "public.png")

    # A tenant's key in the form: refused, said so, still the public view.
    browser.run(f"document.querySelector('input[name=key]').value = "
                f"{tenant.headers['Authorization'].split()[1]!r}")  # fmt: skip
    browser.click_and_load("#sign-in button[type=submit]")
    assert "That is a tenant's key" in browser.run("document.body.innerText")
    assert browser.run("document.getElementById('operator')") is None

    # The operator's key: the operator view, by a cookie no script can read.
    browser.run(f"document.querySelector('input[name=key]').value = {operator_key!r}")
    browser.click_and_load("#sign-in button[type=submit]")
    assert browser.run("location.pathname") == "/"
    assert browser.run("document.getElementById('operator') !== null") is True
    load_and_compare(browser, f"{base_url}/", database, None)
    row = browser.run(f"document.querySelector('[data-letter=\"{letter.id}\"]').innerText")
    assert failed_id in row and letter.error_code in row and "memhog:1" in row
    cookie = next(c for c in browser.cookies(base_url) if c["name"] == "status_session")
    assert cookie["httpOnly"] is True and cookie["sameSite"] == "Strict"
    assert operator_key not in cookie["value"]
    assert browser.run("document.cookie") == ""
    browser.screenshot(tmp_path / "status-page.png")
    if os.environ.get("UPDATE_SCREENSHOTS") == "1":
        shutil.copyfile(tmp_path / "status-page.png", ROOT / "docs" / "status-page.png")

    browser.click_and_load("#operator button[type=submit]")  # sign out
    assert browser.run("document.getElementById('operator')") is None
    assert browser.run("document.querySelector('#sign-in form') !== null") is True


def _wait(base_url: str, headers: dict[str, str], job_id: str) -> dict[str, Any]:
    def finished() -> dict[str, Any] | None:
        job: dict[str, Any] = requests.get(f"{base_url}/jobs/{job_id}", headers=headers,
                                           timeout=10).json()  # fmt: skip
        return None if job["status"] in ("queued", "running") else job

    return wait_until(finished, f"job {job_id} to finish", 60, interval=0.1)
