"""The HTTP door's JSON encoder: orjson for every answer."""

from __future__ import annotations

from flask.testing import FlaskClient


def test_jsonify_answers_are_written_by_orjson(client: FlaskClient) -> None:
    """jsonify asks for compact separators; that must not send every answer to the
    standard library's encoder (which also writes NaN, not JSON)."""
    with client.application.app_context():
        body = client.application.json.response({"b": float("nan"), "a": 1}).get_data()
    assert body == b'{"a":1,"b":null}\n'
