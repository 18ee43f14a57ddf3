"""flask-smorest's Blueprint with a JSON body parser that answers every body the
json module cannot read with 400, not only those it calls malformed, and loads
the usual bodies of the hot routes without marshmallow (a schema's `fast_load`)."""

from __future__ import annotations

import json
from typing import Any

import flask
from flask_smorest import Blueprint as SmorestBlueprint
from webargs.flaskparser import FlaskParser


class JsonParser(FlaskParser):
    """JSON nested deeper than Python's recursion limit raises RecursionError, and
    an integer of more than 4,300 digits a plain ValueError; webargs handles only
    JSONDecodeError, so both were 500s."""

    def _raw_load_json(self, req: flask.Request) -> Any:
        try:
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


class Blueprint(SmorestBlueprint):
    ARGUMENTS_PARSER = JsonParser()
