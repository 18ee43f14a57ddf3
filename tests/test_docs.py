"""The README and the documentation site name only what exists.

Every code block and inline code span of README.md and docs/ is read for the
settings (environment variables), routes, commands and their options it names;
each must exist in the code: a setting of `Settings`, a route of the HTTP door,
a command of the CLI (and an option of that command), a target of the Makefile.
So a renamed setting or route, or a removed command, fails here instead of
leaving a newcomer a recipe that cannot work.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import click
import grpc
import pytest

from app.cli.main import LAZY, cli
from app.platform.settings import ROOT, Settings
from tools import docs_reference

PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])

# Upper-case names in code that are not settings of the service, each for a reason.
NOT_SETTINGS = {
    # the examples' and clients' own variables (one naming: docs/index.md)
    "INFERENCE_URL", "INFERENCE_API_KEY", "INFERENCE_GRPC_ADDRESS", "INFERENCE_REDIS_URL",
    "INFERENCE_WEBHOOK_SECRET",
    # read by `manage.py up` (the launcher), not by the service's processes
    "FLOWER_PORT", "WORKER_CONCURRENCY",
    # the test suite's servers, the image's build argument and environment
    "JOB_ID",  # a shell variable of the examples
    "TEST_DATABASE_URL", "TEST_REDIS_URL", "CUDA_LIBS", "PROMETHEUS_MULTIPROC_DIR",
    "NVIDIA_DRIVER_CAPABILITIES", "NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES",
    "GPU_CHECK_PYTHON", "TEST_PROCESSES", "FAULT_PROCESSES",  # the Makefile's
    # read by libraries the service uses (s3fs, requests; OpenTelemetry's, as its standard)
    "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    # (docker-compose.yml's own variables, such as PUBLIC_HOST, are read from it)
    "POSTGRES_PASSWORD", "POSTGRES_USER", "POSTGRES_DB",
    # protocol words: SQL, Redis, HTTP headers, ONNX and KServe datatypes, problem codes
    "ON_CONFLICT", "SKIP_LOCKED", "FOR_UPDATE", "TYPE_BYTES", "CONTENT_TYPE",
}  # fmt: skip
GRPC_CODES = {code.name for code in grpc.StatusCode}
SETTING = re.compile(r"(?<![\w.$-])[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+\b")
ROUTE = re.compile(
    r"\b(?:GET|POST|PUT|PATCH|DELETE)\s+(/[^\s`'\"),;]*)"
    r"|\$\{?INFERENCE_URL\}?(/[^\s`'\"),;]*)"
)
# `python manage.py X`, or a code span that starts with `manage.py X`; `inference X` on a
# line of its own (the console script)
COMMAND = re.compile(
    r"(?:\A|python3? |\.venv/bin/python |\$ )manage\.py ([^\n#|&;`,]*)"
    r"|(?m:^\$? ?inference ([^\n#|&;`,]*))"
)
MAKE = re.compile(r"(?<![\w-])make ([a-z][\w-]*)")


def code_of(page: Path) -> Iterator[str]:
    """The page's fenced code blocks and inline code spans."""
    text = page.read_text()
    blocks = re.findall(r"^```[^\n]*\n(.*?)^```", text, re.S | re.M)
    prose = re.sub(r"^```[^\n]*\n.*?^```", "", text, flags=re.S | re.M)
    yield from blocks
    yield from re.findall(r"`([^`\n]+)`", prose)


def named(pattern: re.Pattern[str]) -> list[tuple[str, str]]:
    """(page, what) for every match of `pattern` in every page's code."""
    found = []
    for page in PAGES:
        for code in code_of(page):
            for match in pattern.finditer(code):
                what = next((g for g in match.groups() if g is not None), match.group(0))
                found.append((str(page.relative_to(ROOT)), what.strip()))
    return found


@cache
def routes() -> list[re.Pattern[str]]:
    """Each route of the HTTP door as a pattern, any path segment for a parameter."""
    rules = docs_reference._app().url_map.iter_rules()
    return [re.compile(re.sub(r"<[^>]+>", "[^/]+", rule.rule) + "$") for rule in rules]


def route_exists(path: str) -> bool:
    """`/jobs/<id>`, `/jobs/$JOB_ID`, `/v2/models[/<name>]/stats` (each variant)."""
    path = path.split("?")[0].split("#")[0]
    if path.endswith("/..."):  # `/v2/repository/models/...`: any route under it
        return any(r.pattern.startswith(path[:-3]) for r in routes())
    path = path.rstrip(".:")
    path = re.sub(r"\$\{?\w+\}?|<[^>]+>|\{[^}]+\}|\.\.\.", "x", path)
    variants = {path.replace("[", "").replace("]", "")}
    while "[" in path:
        path = re.sub(r"\[[^\[\]]*\]", "", path)
    variants.add(path)
    return all(any(route.match(v) for route in routes()) for v in variants)


def test_every_page_is_read() -> None:
    assert len(PAGES) > 20 and all(any(code_of(page)) for page in PAGES[:3])


def test_code_names_only_settings_that_exist() -> None:
    settings = {name.upper() for name in Settings.model_fields}
    settings |= set(re.findall(r"\$\{(\w+)", (ROOT / "docker-compose.yml").read_text()))
    unknown = sorted({(page, name) for page, name in named(SETTING)
                      if name not in settings | NOT_SETTINGS | GRPC_CODES})  # fmt: skip
    assert not unknown, f"names that are no setting (or add them to NOT_SETTINGS): {unknown}"


def test_code_names_only_routes_that_exist() -> None:
    unknown = sorted({(page, path) for page, path in named(ROUTE) if not route_exists(path)})
    assert not unknown, f"routes the HTTP door does not have: {unknown}"


def test_code_names_only_commands_and_options_that_exist() -> None:
    problems = []
    for page, line in named(COMMAND):
        problem = command_problem(line.split())
        if problem:
            problems.append((page, line, problem))
    assert not problems, problems


def command_problem(words: list[str]) -> str | None:
    """What is wrong with `manage.py <words>`, or None."""
    command: click.Command = cli
    ctx = click.Context(cli)
    rest = list(words)
    while rest and isinstance(command, click.Group) and not rest[0].startswith("-"):
        name = rest.pop(0)
        if "|" in name:  # `schedules add|list|pause`: each must exist
            missing = [n for n in name.split("|") if command.get_command(ctx, n) is None]
            return f"no commands {missing}" if missing else None
        sub = command.get_command(ctx, name)
        if sub is None:
            return None if name.startswith(("[", "<", "...")) else f"no command {name!r}"
        command = sub
    if command.name in LAZY or command.context_settings.get("ignore_unknown_options"):
        return None  # its options are another program's (Celery's), or load with it
    options = {opt for param in command.params for opt in [*param.opts, *param.secondary_opts]}
    options |= {"--help", "--version"}
    flags = [w.lstrip("[").split("=")[0].rstrip("]") for w in rest]
    wrong = [flag for flag in flags if flag.startswith("--") and flag not in options]
    return f"{command.name} has no options {wrong}" if wrong else None


def test_make_targets_that_are_named_exist() -> None:
    targets = set(re.findall(r"^([a-z][\w-]*):", (ROOT / "Makefile").read_text(), re.M))
    unknown = sorted({(page, target) for page, target in named(MAKE) if target not in targets})
    assert not unknown, f"make targets the Makefile does not have: {unknown}"


@pytest.mark.parametrize(
    ("words", "wrong"),
    [(["tenants", "sett", "acme"], True), (["submit", "--each-rows"], True),
     (["submit", "--each-row"], False), (["schedules", "add|lists"], True)],
)  # fmt: skip
def test_the_command_check_can_fail(words: list[str], wrong: bool) -> None:
    assert (command_problem(words) is not None) is wrong


def test_the_route_check_can_fail() -> None:
    assert route_exists("/jobs/$JOB_ID/events") and route_exists("/v2/models/<name>/infer")
    assert not route_exists("/jobs/x/eventz") and not route_exists("/v3/models")
