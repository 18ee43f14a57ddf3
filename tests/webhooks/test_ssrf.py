"""Webhook URLs must be http(s) to public addresses; tricks that reach inside fail."""

from __future__ import annotations

import pytest
from flask.testing import FlaskClient

from app.webhooks.ssrf import UnsafeUrl, check_url

BODY = {"model": "digits", "inputs": {"pixels": [[0.0] * 64]}}

REFUSED = [
    "ftp://example.com/hook",
    "file:///etc/passwd",
    "http://user:pw@93.184.216.34/hook",
    "http://127.0.0.1/hook",
    "http://localhost:8000/hook",
    "http://127.1/hook",
    "http://2130706433/hook",
    "http://0x7f000001/hook",
    "http://017700000001/hook",
    "http://[::1]/hook",
    "http://[::ffff:127.0.0.1]/hook",
    "http://[::ffff:7f00:1]/hook",
    "http://0.0.0.0/hook",
    "http://10.1.2.3/hook",
    "http://172.16.0.1/hook",
    "http://192.168.1.1/hook",
    "http://100.64.0.1/hook",
    "http://169.254.169.254/latest/meta-data",
    "http://[fe80::1]/hook",
    "http://[fd00::1]/hook",
    "http://224.0.0.1/hook",
    "http://no-such-host.invalid/hook",
    "http://[64:ff9b::7f00:1]/hook",  # NAT64 of 127.0.0.1
    "http://[64:ff9b::a9fe:a9fe]/hook",  # NAT64 of 169.254.169.254
    "http://[2002:7f00:1::]/hook",  # 6to4 of 127.0.0.1
    "http://[2002:a00:1::1]/hook",  # 6to4 of 10.0.0.1
]


@pytest.mark.parametrize("url", REFUSED)
def test_unsafe_urls_are_refused(url: str) -> None:
    with pytest.raises(UnsafeUrl):
        check_url(url)


@pytest.mark.parametrize(
    "url",
    [
        "http://93.184.216.34/hook",
        "https://[2606:4700:4700::1111]/x",
        "http://[64:ff9b::5db8:d822]/hook",  # NAT64 of a public address
    ],
)
def test_public_addresses_pass(url: str) -> None:
    check_url(url)


def test_private_networks_can_be_allowed_for_development() -> None:
    check_url("http://127.0.0.1:9000/hook", allow_private=True)
    with pytest.raises(UnsafeUrl):
        check_url("ftp://127.0.0.1/hook", allow_private=True)


@pytest.mark.parametrize(
    "url", ["http://127.1/hook", "http://[::ffff:127.0.0.1]/hook", "http://169.254.169.254/"]
)
def test_submit_refuses_an_unsafe_webhook_with_422(
    client: FlaskClient, auth: dict[str, str], url: str
) -> None:
    response = client.post("/jobs", json={**BODY, "webhook": {"url": url}}, headers=auth)
    assert response.status_code == 422 and response.content_type == "application/problem+json"
    assert "not a public address" in response.json["errors"]["webhook"]["url"][0]


def test_submit_refuses_unknown_events(client: FlaskClient, auth: dict[str, str]) -> None:
    hook = {"url": "http://93.184.216.34/hook", "events": ["job.exploded"]}
    response = client.post("/jobs", json={**BODY, "webhook": hook}, headers=auth)
    assert response.status_code == 422 and "events" in response.json["errors"]["webhook"]


@pytest.mark.parametrize("host", ["localhost", "127.1", "2130706433"])
def test_the_422_does_not_say_what_a_name_resolves_to(
    client: FlaskClient, auth: dict[str, str], host: str
) -> None:
    hook = {"url": f"http://{host}:9/hook"}
    response = client.post("/jobs", json={**BODY, "webhook": hook}, headers=auth)
    assert response.status_code == 422
    message = response.json["errors"]["webhook"]["url"][0]
    assert "not a public address" in message
    assert "127.0.0.1" not in message and "::1" not in message
