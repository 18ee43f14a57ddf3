"""flask-smorest's Blueprint with a JSON body parser that answers every body the
json module cannot read with 400, not only those it calls malformed, and loads
the usual bodies of the hot routes without marshmallow (a schema's `fast_load`),
and with OpenAPI links on a response (what a client does next with what it got)."""

from __future__ import annotations

import json
import re
from typing import Any

import flask
from flask_smorest import Blueprint as SmorestBlueprint
from webargs import core
from webargs.flaskparser import FlaskParser


class JsonParser(FlaskParser):
    """JSON nested deeper than Python's recursion limit raises RecursionError, and
    an integer of more than 4,300 digits a plain ValueError; webargs handles only
    JSONDecodeError, so both were 500s. A KServe v2 route's body is read as JSON
    without a JSON Content-Type (`_kserve_body`)."""

    def _raw_load_json(self, req: flask.Request) -> Any:
        try:
            if _kserve_body(req):
                return core.parse_json(req.get_data(cache=True))
            return super()._raw_load_json(req)
        except json.JSONDecodeError:
            raise
        except (RecursionError, ValueError) as exc:
            reason = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)[:200]
            raise json.JSONDecodeError(reason, doc="body", pos=0) from None

    def _process_location_data(
        self,
        location_data: Any,
        schema: Any,
        req: flask.Request,
        location: str,
        unknown: str | None,
        validators: Any,
    ) -> Any:
        """A schema's `fast_load` first: it answers the usual request exactly as
        `load` would, or None, and then `load` takes it (and words its errors)."""
        fast = getattr(schema, "fast_load", None)
        if fast is not None and not validators:
            loaded = fast(location_data)
            if loaded is not None:
                return loaded
        return super()._process_location_data(
            location_data, schema, req, location, unknown, validators
        )


def _kserve_body(req: flask.Request) -> bool:
    """A KServe v2 route's body is JSON whatever its Content-Type says, as Triton
    reads it: tritonclient sends none (`load_model`'s config, `unload_model`'s
    parameters), curl's `-d` says form data."""
    if not req.path.startswith("/v2/") or req.is_json or not req.content_length:
        return False
    return req.mimetype in ("", "application/x-www-form-urlencoded", "text/plain")


def link(method: str, path: str, *, body: Any = None, **parameters: str) -> dict[str, Any]:
    """An OpenAPI link to the operation `method path`: each parameter, and any string
    in `body` (its request body), a runtime expression on this response
    (`$response.body#/id`)."""
    pointer = path.replace("~", "~0").replace("/", "~1")
    found: dict[str, Any] = {"operationRef": f"#/paths/{pointer}/{method}"}
    if parameters:
        found["parameters"] = parameters
    if body is not None:
        found["requestBody"] = body
    return found


def links_by_id(pointer: str, **operations: str) -> dict[str, Any]:
    """Links to operations on the resource whose id is at `pointer` in the answer
    (`/id`, `/items/0/id`): {name: "method /path/{its_id}"}, the one parameter in
    braces set to that id."""
    found = {}
    for name, operation in operations.items():
        method, path = operation.split(" ", 1)
        (param,) = re.findall(r"\{(\w+)\}", path)
        found[name] = link(method, path, **{param: f"$response.body#{pointer}"})
    return found


class Blueprint(SmorestBlueprint):
    ARGUMENTS_PARSER = JsonParser()

    def response(
        self, status_code: Any, schema: Any = None, *, links: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> Any:  # fmt: skip
        """flask-smorest's, with `links`: the links of the documented response, so a
        reader (and a stateful fuzzer) can follow a created resource to its operations."""
        return _linked(super().response(status_code, schema, **kwargs), status_code, links)

    def alt_response(
        self, status_code: Any, response: Any = None, *, links: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> Any:  # fmt: skip
        return _linked(super().alt_response(status_code, response, **kwargs), status_code, links)


def _linked(decorator: Any, status_code: Any, links: dict[str, Any] | None) -> Any:
    if not links:
        return decorator

    def with_links(func: Any) -> Any:
        wrapper = decorator(func)
        wrapper._apidoc["response"]["responses"][status_code][-1]["links"] = links
        return wrapper

    return with_links
