"""Tool calls over HTTP on Qwen2.5-Coder-0.5B-Instruct: parsed into tool_calls, streamed alike, forced by tool_choice."""
from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import pytest
from server_harness import running_server

from jido.server.config import ServerConfig

pytestmark = pytest.mark.slow

QWEN = "qwen2.5-coder-0.5b-instruct"
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "required": ["city"], "properties": {
        "city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "Get the current local time in a city",
    "parameters": {"type": "object", "required": ["city"], "properties": {"city": {"type": "string"}}}}}
TOOLS = [WEATHER, TIME]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
WALKTHROUGH = Path(__file__).parents[2] / "docs" / "tool_calling.md"


@pytest.fixture(scope="module")
def server(qwen_folder):
    with running_server(ServerConfig(enable_auto_tool_choice=True, tool_call_parser="hermes"), model=QWEN) as server:
        yield server


def _ask(server, question: str, stream: bool = False, **kwargs):
    return server.client().chat.completions.create(model=QWEN, messages=[{"role": "user", "content": question}],
                                                   tools=TOOLS, temperature=0, max_tokens=80, stream=stream, **kwargs)


def _reassembled(chunks) -> tuple[str | None, list[tuple[str, str]], str, list[str]]:
    """Content, calls (name, arguments), finish reason and call ids of a stream, as a client puts them together."""
    content, calls, ids, finish_reason = "", {}, [], None
    for chunk in chunks:
        assert chunk.choices, chunk
        delta = chunk.choices[0].delta
        content += delta.content or ""
        for entry in delta.tool_calls or ():
            if entry.index not in calls:  # a call's first delta names it
                assert entry.id.startswith("call_") and entry.type == "function" and entry.function.name
                calls[entry.index], ids = [entry.function.name, ""], ids + [entry.id]
            calls[entry.index][1] += entry.function.arguments or ""
        finish_reason = chunk.choices[0].finish_reason or finish_reason
    return content or None, [tuple(c) for c in calls.values()], finish_reason, ids


def _calls(message) -> list[tuple[str, str]]:
    return [(c.function.name, c.function.arguments) for c in message.tool_calls or ()]


def test_a_call_comes_back_in_tool_calls_valid_for_its_schema_and_streams_the_same(server):
    choice = _ask(server, "What's the weather in Paris?").choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    [call] = choice.message.tool_calls
    assert re.fullmatch(r"call_[0-9a-f]{24}", call.id) and call.type == "function"
    assert call.function.name == "get_weather" and json.loads(call.function.arguments)["city"] == "Paris"
    jsonschema.validate(json.loads(call.function.arguments), SCHEMAS["get_weather"])
    content, calls, finish_reason, _ = _reassembled(_ask(server, "What's the weather in Paris?", stream=True))
    assert (content, calls, finish_reason) == (None, _calls(choice.message), "tool_calls")


@pytest.mark.parametrize("tool_choice", ["auto", "none"])
def test_an_answer_without_a_call_is_content(server, tool_choice):
    choice = _ask(server, "Write a haiku about the sea.", tool_choice=tool_choice).choices[0]
    assert choice.finish_reason == "stop" and choice.message.content.startswith("Sea whispers")
    assert not choice.message.tool_calls


def test_required_and_a_named_function_force_a_call_through_the_grammar(server):
    required = _ask(server, "Weather in Paris and Tokyo?", tool_choice="required").choices[0]
    assert required.finish_reason == "tool_calls" and required.message.content is None
    for name, arguments in _calls(required.message):
        jsonschema.validate(json.loads(arguments), SCHEMAS[name])
    named = {"type": "function", "function": {"name": "get_time"}}
    choice = _ask(server, "Is it sunny in Oslo?", tool_choice=named).choices[0]
    [(name, arguments)] = _calls(choice.message)
    assert name == "get_time" and choice.finish_reason == "tool_calls"
    jsonschema.validate(json.loads(arguments), SCHEMAS["get_time"])
    content, calls, _, _ = _reassembled(_ask(server, "Is it sunny in Oslo?", tool_choice=named, stream=True))
    assert (content, calls) == (None, [(name, arguments)])


@pytest.mark.parametrize("body, param, says", [
    ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice", "is not one of the tools"),
    ({"tool_choice": "required", "response_format": {"type": "json_object"}}, "tool_choice", "give one of them"),
    ({"tools": [{"type": "function", "function": {"name": ""}}]}, "tools", "tools[0].function.name"),
])
def test_bad_tools_and_tool_choice_are_400s_naming_the_field(server, body, param, says):
    status, _, raw = server.request("POST", "/v1/chat/completions", {
        "messages": [{"role": "user", "content": "Hi"}], "tools": TOOLS, "max_tokens": 4, **body})
    error = json.loads(raw)["error"]
    assert status == 400 and says in error["message"] and error["param"] == param, error


def test_the_docs_walkthrough_runs(server, capsys):
    source = WALKTHROUGH.read_text(encoding="utf-8").split("```python\n", 1)[1].split("```\n", 1)[0]
    exec(source.replace("http://127.0.0.1:8000/v1", f"{server.base_url}/v1"), namespace := {})
    assert namespace["call"].function.name == "get_weather" and namespace["answer"].choices[0].message.content
    assert json.loads(namespace["forced"].choices[0].message.tool_calls[0].function.arguments)["city"]
    assert "tool_calls get_weather" in capsys.readouterr().out
