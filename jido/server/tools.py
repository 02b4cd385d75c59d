"""What a chat request's ``tools`` and ``tool_choice`` ask for: the checks, the grammar that forces a call, the
parser that reads calls from the answer, and the calls in OpenAI's response and stream shapes."""
from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from typing import Any

from jido.server.tool_parsers import NamedCallParser, ToolCallParser, ToolEvent

ToolParserFactory = Callable[[], ToolCallParser | NamedCallParser]
_CHOICES = ("none", "auto", "required")


def check_tool_choice(value: Any, tools: list[dict[str, Any]] | None) -> None:
    """Raises ValueError (its message starts with ``tool_choice``) unless ``value`` is OpenAI's ``"none"``,
    ``"auto"``, ``"required"`` or ``{"type": "function", "function": {"name": <one of tools>}}``."""
    if isinstance(value, str) and value in _CHOICES:
        if value != "none" and not tools:
            raise ValueError(f'tool_choice "{value}" needs tools: without a tools list there are no tool calls '
                             "to make")
        return
    if not isinstance(value, dict):
        raise ValueError('tool_choice must be "none", "auto", "required" or {"type": "function", "function": '
                         f'{{"name": ...}}}}, got {json.dumps(value)}')
    function = value.get("function")
    name = function.get("name") if isinstance(function, dict) else None
    if value.get("type", "function") != "function" or not isinstance(name, str):
        raise ValueError('tool_choice must name a function as {"type": "function", "function": {"name": ...}}')
    names = tool_names(tools)
    if name not in names:
        raise ValueError(f"tool_choice.function.name {name!r} is not one of the tools: "
                         f"{', '.join(sorted(names)) or 'there are none'}")


def tool_names(tools: list[dict[str, Any]] | None) -> list[str]:
    return [tool["function"]["name"] for tool in tools or ()]


def forced_call_schema(tools: list[dict[str, Any]], tool_choice: Any, parallel: bool = True) -> dict | None:
    """The JSON schema a forcing ``tool_choice`` holds the answer to (None for ``auto`` and ``none``): the named
    function's parameters, or for ``required`` an array of ``{"name", "arguments"}`` calls of any of the tools
    (one only when ``parallel`` is false), as vLLM forces them."""
    if isinstance(tool_choice, dict):
        tool = next(t for t in tools if t["function"]["name"] == tool_choice["function"]["name"])
        return _parameters(tool)
    if tool_choice != "required":
        return None
    calls = [{"type": "object", "additionalProperties": False, "required": ["name", "arguments"],
              "properties": {"name": {"type": "string", "enum": [t["function"]["name"]]},
                             "arguments": _parameters(t)}} for t in tools]
    return {"type": "array", "minItems": 1, **({} if parallel else {"maxItems": 1}),
            "items": calls[0] if len(calls) == 1 else {"anyOf": calls}}


def _parameters(tool: dict[str, Any]) -> dict:
    return tool["function"].get("parameters") or {"type": "object"}


def parser_factory(tools: list[dict[str, Any]] | None, tool_choice: Any,
                   auto_parser: str | None) -> ToolParserFactory | None:
    """How to read calls from this request's answers: a forced call's own parser, ``auto_parser``'s (the
    server's ``--tool-call-parser`` under ``--enable-auto-tool-choice``) for ``auto``, else None (text only)."""
    if not tools or tool_choice == "none":
        return None
    if isinstance(tool_choice, dict):
        name = tool_choice["function"]["name"]
        return lambda: NamedCallParser(name)
    names = tool_names(tools)
    if tool_choice == "required":
        return lambda: ToolCallParser(names, forced=True)
    if auto_parser is None:
        return None
    return lambda: ToolCallParser(names, style=auto_parser)


def template_messages_tool_calls(tool_calls: list[Any], index: int) -> list[dict[str, Any]]:
    """An assistant message's ``tool_calls`` for the chat template, arguments as objects (templates such as
    Qwen2.5's write them with ``tojson``, as vLLM passes them); raises ValueError naming a bad call."""
    calls = []
    for j, call in enumerate(tool_calls):
        where = f"messages[{index}].tool_calls[{j}]"
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise ValueError(f'{where} must be {{"id": ..., "type": "function", "function": {{"name": ..., '
                             '"arguments": "{...}"}}')
        arguments = function.get("arguments", "{}")
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{where}.function.arguments is not JSON: {exc}") from exc
        calls.append({**call, "function": {**function, "arguments": arguments}})
    return calls


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def response_tool_calls(calls: list[tuple[str, str]]) -> list[dict]:
    """Parsed calls as a message's ``tool_calls``."""
    return [{"id": new_call_id(), "type": "function", "function": {"name": name, "arguments": arguments}}
            for name, arguments in calls]


def delta_of(events: list[ToolEvent]) -> dict:
    """A stream delta for a run of parser events: ``content`` and ``tool_calls`` (a call's first entry has its
    ``index``, ``id``, ``type`` and name; later ones only ``index`` and argument fragments)."""
    content = "".join(e.text for e in events if e.kind == "content")
    entries: dict[int, dict] = {}
    for event in events:
        if event.kind == "call":
            entries[event.index] = {"index": event.index, "id": new_call_id(), "type": "function",
                                    "function": {"name": event.text, "arguments": ""}}
        elif event.kind == "arguments":
            entry = entries.setdefault(event.index, {"index": event.index, "function": {"arguments": ""}})
            entry["function"]["arguments"] += event.text
    delta: dict[str, Any] = {"content": content} if content else {}
    if entries:
        delta["tool_calls"] = list(entries.values())
    return delta
