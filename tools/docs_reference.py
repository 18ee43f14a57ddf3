"""mkdocs hook: the reference pages' tables, made from the code at build time.

A page holds a marker such as `<!-- reference: settings -->`; the build puts the
table there, made from what the service itself reads or serves: the settings'
descriptions, the HTTP API's OpenAPI document, the gRPC service's descriptors,
the problem types, the metrics. Nothing generated is committed, so the site
cannot drift from the code; `mkdocs build --strict` (in `make test`) fails on a
marker this hook does not know.
"""

from __future__ import annotations

import ast
import json
import logging
import re
import sys
from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
MARKER = re.compile(r"<!-- reference: ([a-z-]+) -->")
METHODS = ("get", "post", "put", "patch", "delete")


def on_config(config: Any, **_: Any) -> Any:
    """The project importable by this hook and by mkdocs-click (mkdocs loads a hook by
    its path, and puts sys.path back as it was after loading it)."""
    if str(ROOT) not in sys.path:
        sys.path.append(str(ROOT))
    return config


def on_page_markdown(markdown: str, **_: Any) -> str:
    """Replace each marker by its table; an unknown marker fails the build."""

    def table(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in TABLES:
            raise ValueError(f"unknown reference marker {name!r}; known: {sorted(TABLES)}")
        return TABLES[name]()

    return MARKER.sub(table, markdown)


def on_files(files: Any, config: Any, **_: Any) -> Any:
    """The OpenAPI document as a page's neighbour, for download and for other tools;
    the benchmark's latest chart (bench/results/latest.png, which `make bench` writes)
    beside the performance page, so the site shows the run the report is of."""
    from mkdocs.structure.files import File

    files.append(
        File.generated(config, "reference/openapi.json", content=json.dumps(openapi(), indent=2))
    )
    chart = (ROOT / "bench" / "results" / "latest.png").read_bytes()
    files.append(File.generated(config, "explanation/benchmark-latest.png", content=chart))
    return files


def settings() -> str:
    from app.cli.settings_reference import markdown

    return markdown()


@cache
def _app() -> Any:
    """The HTTP door as `make run` builds it, over addresses nothing listens on:
    the OpenAPI document and the routes need no database."""
    logging.getLogger("app").setLevel(logging.ERROR)
    from app import create_app
    from app.platform.settings import Settings

    nowhere = Settings.from_env().with_overrides(
        database_url="postgresql+psycopg2://docs@127.0.0.1:1/docs",
        redis_url="redis://127.0.0.1:1/0",
    )
    return create_app(nowhere)


@cache
def openapi() -> dict[str, Any]:
    spec: dict[str, Any] = _app().test_client().get("/openapi.json").json
    return spec


def http_api() -> str:
    """Every operation of /openapi.json by tag: its summary, parameters, body and answers."""
    spec = openapi()
    by_tag: dict[str, list[tuple[str, str, dict[str, Any]]]] = {}
    for path, item in spec["paths"].items():
        for method in METHODS:
            if method in item:
                operation = item[method]
                for tag in operation.get("tags", ["other"]):
                    by_tag.setdefault(tag, []).append((method.upper(), path, operation))
    out: list[str] = []
    for tag in spec.get("tags", []):
        operations = by_tag.pop(tag["name"], [])
        if operations:
            title = tag["name"].replace("_", " ").capitalize()
            out += [f"## {title}", "", tag.get("description", ""), ""]
            out += [line for op in operations for line in _operation(spec, *op)]
    for name, operations in by_tag.items():
        out += [f"## {name}", ""] + [line for op in operations for line in _operation(spec, *op)]
    out += _other_routes(spec)
    return "\n".join(out)


def _operation(spec: dict[str, Any], method: str, path: str, op: dict[str, Any]) -> Iterator[str]:
    yield f"### `{method} {path}`"
    yield ""
    if op.get("summary"):
        yield f"**{_cell(op['summary'])}**"
        yield ""
    if op.get("description"):
        yield _indent_safe(op["description"])
        yield ""
    params = op.get("parameters", [])
    if params:
        yield "| parameter | in | type | required | description |"
        yield "|---|---|---|---|---|"
        for p in params:
            p = _deref(spec, p)
            kind = _type(spec, p.get("schema", {}))
            yield (f"| `{p['name']}` | {p['in']} | {kind} | {'yes' if p.get('required') else 'no'} "
                   f"| {_cell(p.get('description', ''))} |")  # fmt: skip
        yield ""
    body = op.get("requestBody")
    if body:
        for media, content in body.get("content", {}).items():
            yield f"Body (`{media}`): {_type(spec, content.get('schema', {}))}"
            yield ""
            yield from _fields(spec, content.get("schema", {}))
    yield "| answer | what |"
    yield "|---|---|"
    answers = op.get("responses", {})
    for status in sorted(answers, key=lambda s: (not s.isdigit(), s)):
        response = answers[status]
        response = _deref(spec, response)
        media = ", ".join(f"`{m}`" for m in response.get("content", {}))
        schemas = [_type(spec, c.get("schema", {})) for c in response.get("content", {}).values()]
        what = _cell(response.get("description", ""))
        if schemas and schemas[0] != "object":
            what += f" ({schemas[0]})"
        yield f"| {status} | {what}{' — ' + media if media else ''} |"
    yield ""


def _fields(spec: dict[str, Any], schema: dict[str, Any]) -> Iterator[str]:
    schema = _deref(spec, schema)
    props = schema.get("properties", {})
    if not props:
        return
    required = set(schema.get("required", []))
    yield "| field | type | required | description |"
    yield "|---|---|---|---|"
    for name, prop in props.items():
        description = _deref(spec, prop).get("description", "")
        yield (f"| `{name}` | {_type(spec, prop)} | {'yes' if name in required else 'no'} "
               f"| {_cell(description)} |")  # fmt: skip
    yield ""


def _other_routes(spec: dict[str, Any]) -> list[str]:
    """Routes outside the OpenAPI document (the OpenAI-compatible door, the pages)."""
    documented = {re.sub(r"\{(\w+)\}", r"<\1>", p) for p in spec["paths"]}
    rows = []
    for rule in sorted(_app().url_map.iter_rules(), key=lambda r: r.rule):
        path = re.sub(r"<(?:\w+:)?(\w+)>", r"<\1>", rule.rule)
        if path in documented or rule.endpoint == "static" or path.startswith("/docs"):
            continue
        methods = sorted(m for m in rule.methods or () if m in {x.upper() for x in METHODS})
        if methods:
            rows.append(f"| `{' '.join(methods)}` | `{path}` |")
    if not rows:
        return []
    return ["## Routes outside the OpenAPI document", "",
            "The OpenAI-compatible door (`/v1`, see [A streaming chat](../tutorials/chat.md)), "
            "whose clients read OpenAI's own reference, and the pages:", "",
            "| method | path |", "|---|---|", *rows, ""]  # fmt: skip


def _deref(spec: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in node:
        parts = node["$ref"].lstrip("#/").split("/")
        found: Any = spec
        for part in parts:
            found = found[part]
        node = found
    return node


def _type(spec: dict[str, Any], schema: dict[str, Any]) -> str:
    if "$ref" in schema:
        return schema["$ref"].rsplit("/", 1)[-1]
    if schema.get("type") == "array":
        return f"array of {_type(spec, schema.get('items', {}))}"
    for key in ("oneOf", "anyOf"):
        if key in schema:
            return " or ".join(_type(spec, s) for s in schema[key])
    kind = str(schema.get("type", "object"))
    if "enum" in schema:
        kind += ": " + ", ".join(f"`{v}`" for v in schema["enum"])
    return kind


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _indent_safe(text: str) -> str:
    """A docstring as Markdown: its lines unindented, so none reads as a code block."""
    return "\n".join(line.strip() for line in text.splitlines())


def grpc() -> str:
    """Each service's methods and each message's fields, from the generated descriptors."""
    from app.grpc.generated import grpc_service_pb2

    file = grpc_service_pb2.DESCRIPTOR
    out: list[str] = []
    for service in file.services_by_name.values():
        out += [f"### `{service.full_name}`", "", "| method | request | answer |", "|---|---|---|"]
        for method in service.methods:
            request = ("stream " if method.client_streaming else "") + method.input_type.name
            answer = ("stream " if method.server_streaming else "") + method.output_type.name
            out.append(f"| `{method.name}` | `{request}` | `{answer}` |")
        out.append("")
    out += ["### Messages", ""]
    for message in _messages(file.message_types_by_name.values()):
        if message.GetOptions().map_entry:
            continue
        out += [f"#### `{_name(message)}`", "", "| field | type |", "|---|---|"]
        out += [f"| `{field.name}` | `{_field_type(field)}` |" for field in message.fields]
        out.append("")
    return "\n".join(out)


def _messages(messages: Any) -> Iterator[Any]:
    for message in messages:
        yield message
        yield from _messages(message.nested_types)


def _name(message: Any) -> str:
    """`ModelInferRequest.InferInputTensor`: the name inside the package."""
    return str(message.full_name).removeprefix(message.file.package + ".")


def _field_type(field: Any) -> str:
    message = field.message_type
    if message is not None and message.GetOptions().map_entry:
        key, value = message.fields_by_name["key"], message.fields_by_name["value"]
        return f"map<{_field_type(key)}, {_field_type(value)}>"
    kind = _name(message) if message is not None else _scalar(field.type)
    return f"repeated {kind}" if field.is_repeated else kind


def _scalar(kind: int) -> str:
    from google.protobuf.descriptor import FieldDescriptor

    names = {v: k[len("TYPE_"):].lower() for k, v in vars(FieldDescriptor).items()
             if k.startswith("TYPE_") and isinstance(v, int)}  # fmt: skip
    return names.get(kind, str(kind))


def problems() -> str:
    """The problem types, with the gRPC status each maps to."""
    from app.grpc.status import CODES
    from app.web.problem_types import PROBLEM_TYPES

    rows = ["| type | HTTP status | gRPC status | title | what to do |", "|---|---|---|---|---|"]
    for code, (status, title, advice) in PROBLEM_TYPES.items():
        grpc_code = CODES.get(code)
        rows.append(f"| `/problems/{code}` | {status} | {grpc_code.name if grpc_code else '—'} "
                    f"| {title} | {_cell(advice)} |")  # fmt: skip
    return "\n".join(rows)


METRIC_CALLS = {"Counter": "counter", "Histogram": "histogram", "Gauge": "gauge",
                "GaugeMetricFamily": "gauge", "CounterMetricFamily": "counter"}  # fmt: skip


def metrics() -> str:
    """Every metric the code declares (module-level or made at scrape time), found by
    reading app/ for the prometheus_client calls that name one."""
    found: dict[str, tuple[str, str, str]] = {}
    for path in sorted((ROOT / "app").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
                continue
            kind = METRIC_CALLS.get(node.func.id)
            strings = [_literal(a) for a in node.args[:2]]
            if kind is None or len(strings) < 2 or not all(strings):
                continue
            labels = [k.value for k in node.keywords if k.arg in ("labels", "labelnames")]
            labels += node.args[2:3]
            names = _literal_list(labels[0]) if labels else []
            name, help_text = strings[0] or "", strings[1] or ""
            found[name] = (kind, ", ".join(f"`{n}`" for n in names), _cell(help_text))
    rows = ["| metric | type | labels | what it counts |", "|---|---|---|---|"]
    for name, (kind, label_names, help_text) in sorted(found.items()):
        suffix = "_total" if kind == "counter" and not name.endswith("_total") else ""
        rows.append(f"| `{name}{suffix}` | {kind} | {label_names or '—'} | {help_text} |")
    return "\n".join(rows)


def _literal(node: ast.expr) -> str | None:
    """A string argument, implicit concatenation included."""
    try:
        value = ast.literal_eval(node)
    except ValueError:
        return None
    return value if isinstance(value, str) else None


def _literal_list(node: ast.expr) -> list[str]:
    try:
        value = ast.literal_eval(node)
    except ValueError:
        return []
    return [str(v) for v in value] if isinstance(value, (list, tuple)) else []


TABLES: dict[str, Callable[[], str]] = {
    "settings": settings,
    "http-api": http_api,
    "grpc": grpc,
    "problems": problems,
    "metrics": metrics,
}
