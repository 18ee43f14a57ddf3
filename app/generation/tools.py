"""Function calling in OpenAI's terms: `tools`, `tool_choice`, and `tool_calls` back.

SmolLM2's chat template has no tool syntax (plain ChatML; the 135M model was not
trained to call functions), so the tools are told to the model in a system
message, and an answer that calls one is a JSON object `{"name": ..., "arguments":
{...}}`. With `tool_choice` `"required"` or a named function the answer is
decoded under a schema (app.generation.guides): the named function's
`parameters`, or any one of the functions as such an object, so the arguments
always parse and match the function's schema, and the answer is a tool call
(`finish_reason: "tool_calls"`). With `"auto"` the model writes freely, and only
an answer that is such an object naming one of the tools (bare, in a ```json
fence or in `<tool_call>` tags) is taken as a call; SmolLM2-135M seldom writes
one unasked. Earlier turns go back to the model as text: an assistant's calls as
their JSON, a tool's result as a user turn naming the call.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

from app.generation.fields import BadField

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
MAX_TOOLS = 128  # as OpenAI allows
_EMPTY = {"type": "object", "properties": {}}


@dataclass(frozen=True)
class ToolPlan:
    """How an answer becomes tool calls: `named` (its text is the arguments of
    `names[0]`), `required` (a `{"name", "arguments"}` object) or `auto` (that,
    if the model wrote one)."""

    mode: str
    names: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {"mode": self.mode, "names": list(self.names)}

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> ToolPlan:
        return cls(str(raw["mode"]), tuple(raw["names"]))

    def calls(self, text: str, call_id: str) -> list[dict[str, Any]] | None:
        """The answer's tool calls (OpenAI's `tool_calls`), None when it is text."""
        if self.mode == "named":
            name, arguments = self.names[0], text
        else:
            found = _call_in(text)
            if found is None or found[0] not in self.names:
                return None
            name, arguments = found
        call = {"name": name, "arguments": arguments}
        return [{"id": call_id, "type": "function", "function": call}]


def call_id(job_id: uuid.UUID) -> str:
    return f"call_{job_id.hex[:24]}"


def _call_in(text: str) -> tuple[str, str] | None:
    body = text.strip()
    for opening, closing in (("<tool_call>", "</tool_call>"), ("```json", "```"), ("```", "```")):
        if body.startswith(opening) and body.endswith(closing) and len(body) > len(opening):
            body = body[len(opening) : -len(closing)].strip()
            break
    try:
        value = json.loads(body)
    except ValueError:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    arguments = value.get("arguments", value.get("parameters", {}))
    if not isinstance(arguments, dict):
        return None
    return value["name"], json.dumps(arguments)


def plan(body: dict[str, Any]) -> tuple[ToolPlan | None, dict[str, Any] | None, str | None]:
    """The body's tools as a plan, the response format that enforces it (None for
    auto) and the system message that tells the model of them; (None, None, None)
    without tools or with `tool_choice: "none"`."""
    tools, choice = body.get("tools"), body.get("tool_choice", "auto")
    if tools is None:
        if choice not in (None, "none", "auto"):
            raise BadField("tool_choice", "needs tools")
        return None, None, None
    functions = _functions(tools)
    if choice is None:
        choice = "auto"
    if choice == "none":
        return None, None, None
    if choice == "auto":
        return ToolPlan("auto", tuple(functions)), None, _told(functions)
    if choice == "required":
        options = [{"type": "object", "properties": {"name": {"const": name},
                                                     "arguments": parameters},
                    "required": ["name", "arguments"], "additionalProperties": False}
                   for name, (_, parameters) in functions.items()]  # fmt: skip
        schema = options[0] if len(options) == 1 else {"anyOf": options}
        return (
            ToolPlan("required", tuple(functions)),
            _format("tool_call", schema),
            _told(functions),
        )
    named = choice.get("function", {}).get("name") if isinstance(choice, dict) else None
    if not isinstance(choice, dict) or choice.get("type") != "function" or named is None:
        raise BadField("tool_choice", 'expected "none", "auto", "required" or '
                       '{"type": "function", "function": {"name": ...}}')  # fmt: skip
    if named not in functions:
        raise BadField("tool_choice", f"names {named!r}, which is not among the tools")
    parameters = functions[named][1]
    told = _told({named: functions[named]})
    return ToolPlan("named", (named,)), _format(named, parameters), told


def _format(name: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}


def _functions(tools: Any) -> dict[str, tuple[str, dict[str, Any]]]:
    """Each function's description and parameters' schema, by name."""
    if not isinstance(tools, list) or not 0 < len(tools) <= MAX_TOOLS:
        raise BadField("tools", f"expected a list of 1 to {MAX_TOOLS} tools")
    functions: dict[str, tuple[str, dict[str, Any]]] = {}
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        function = tool.get("function") if isinstance(tool, dict) else None
        if (
            not isinstance(tool, dict)
            or tool.get("type") != "function"
            or not isinstance(function, dict)
        ):
            raise BadField(where, 'expected {"type": "function", "function": {"name", ...}}')
        name = function.get("name")
        if not isinstance(name, str) or not _NAME.match(name):
            raise BadField(f"{where}.function.name", "expected 1 to 64 of a-z, A-Z, 0-9, _ and -")
        if name in functions:
            raise BadField(f"{where}.function.name", f"{name!r} is named twice")
        parameters = function.get("parameters", _EMPTY)
        if not isinstance(parameters, dict):
            raise BadField(f"{where}.function.parameters", "expected a JSON schema object")
        functions[name] = (str(function.get("description") or ""), parameters)
    return functions


def _told(functions: dict[str, tuple[str, dict[str, Any]]]) -> str:
    listed = "\n".join(
        json.dumps({"name": name, "description": description, "parameters": parameters})
        for name, (description, parameters) in functions.items()
    )
    return ("You can call these functions:\n" + listed + '\nTo call one, answer with only a JSON '
            'object: {"name": <function name>, "arguments": <its arguments>}.')  # fmt: skip


def with_tools(messages: Any, told: str | None) -> Any:
    """The chat as the model reads it: the tools told in the system message, the
    assistant's earlier calls as their JSON, the tools' results as user turns."""
    if not isinstance(messages, list):
        return messages
    turns = []
    for message in messages:
        if not isinstance(message, dict):
            turns.append(message)
            continue
        if message.get("role") == "tool":
            content = message.get("content")
            turns.append({"role": "user", "content": f"The result of {message.get('tool_call_id')}"
                          f": {_text(content)}"})  # fmt: skip
        elif message.get("role") == "assistant" and message.get("tool_calls"):
            calls = [json.dumps({"name": c.get("function", {}).get("name"),
                                 "arguments": _arguments(c.get("function", {}))})
                     for c in message["tool_calls"] if isinstance(c, dict)]  # fmt: skip
            turns.append({"role": "assistant", "content": "\n".join(calls)})
        else:
            turn = {k: v for k, v in message.items() if k in ("role", "content", "name")}
            if turn.get("role") == "developer":  # (OpenAI's newer name for system)
                turn["role"] = "system"
            if isinstance(turn.get("content"), list):
                turn["content"] = _text(turn["content"])
            turns.append(turn)
    if told is not None:
        if turns and isinstance(turns[0], dict) and turns[0].get("role") in ("system", "developer"):
            turns[0] = {"role": "system", "content": f"{_text(turns[0].get('content'))}\n\n{told}"}
        else:
            turns.insert(0, {"role": "system", "content": told})
    return turns


def _text(content: Any) -> str:
    if isinstance(content, list):  # OpenAI's content parts
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return "" if content is None else str(content)


def _arguments(function: dict[str, Any]) -> Any:
    try:
        return json.loads(function.get("arguments") or "{}")
    except ValueError:
        return function.get("arguments")
