"""Tool-call parsers on exact model outputs: calls, content and malformed JSON, streamed and not alike."""
from __future__ import annotations

import json

import pytest

from jido.engine.chat_template import load_chat_template
from jido.models.tokenizer import Tokenizer
from jido.server.protocol import ChatCompletionRequest
from jido.server.tool_parsers import NamedCallParser, ToolCallParser, parse_tool_calls
from jido.server.tools import check_tool_choice, delta_of, forced_call_schema

NAMES = ("get_weather", "get_time")
PARIS = '{"city": "Paris", "unit": "celsius"}'

# (what the model wrote, content, calls): the first two are Qwen2.5-Coder-0.5B-Instruct's own greedy answers.
CASES = {
    "qwen_coder_json_fence": ('```json\n{\n  "name": "get_weather",\n  "arguments": {\n    "city": "Paris",\n    '
                              '"unit": "celsius"\n  }\n}\n```', None, [("get_weather", PARIS)]),
    "qwen_coder_bare_json": ('{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}', None,
                             [("get_weather", PARIS)]),
    "hermes_two_calls_after_text": (
        'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n'
        '</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {"city": "Tokyo"}}\n</tool_call>',
        "Let me check.", [("get_weather", PARIS), ("get_time", '{"city": "Tokyo"}')]),
    "bare_calls_one_per_line": ('{"name": "get_time", "arguments": {"city": "Lima"}}\n'
                                '{"name": "get_time", "arguments": {"city": "Oslo"}}',
                                None, [("get_time", '{"city": "Lima"}'), ("get_time", '{"city": "Oslo"}')]),
    "array_of_calls": ('[{"name":"get_weather","arguments":{"city":"A"}},{"name":"get_time","arguments":{}}]', None,
                       [("get_weather", '{"city": "A"}'), ("get_time", "{}")]),
    "escaped_string_kept_as_written": ('<tool_call>{"name": "get_time", "arguments": {"city": "Sa\\u00f5 \\"P\\""}}'
                                       '</tool_call>', None, [("get_time", '{"city": "Sa\\u00f5 \\"P\\""}')]),
    "text_around_a_fence": ('Here it is:\n```json\n{"name": "get_time", "arguments": {"city": "Rome"}}\n```\nDone.',
                            "Here it is:\nDone.", [("get_time", '{"city": "Rome"}')]),
    "no_call": ("Sea whispers,\nwhispers of the sea.", "Sea whispers,\nwhispers of the sea.", []),
    "json_answer_not_a_call": ('{"answer": 4}', '{"answer": 4}', []),
    "unknown_name_unmarked": ('{"name": "rm_rf", "arguments": {}}', '{"name": "rm_rf", "arguments": {}}', []),
    "python_fence": ('```python\nprint({"name": 1})\n```', '```python\nprint({"name": 1})\n```', []),
    "malformed_arguments": ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par}\n</tool_call>',
                            '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par}\n</tool_call>', []),
    "unclosed_call": ('{"name": "get_weather", "arguments": {"city": "Paris"', '{"name": "get_weather", "arguments": '
                      '{"city": "Paris"', []),
    "arguments_not_an_object": ('<tool_call>{"name": "get_time", "arguments": "Paris"}</tool_call>',
                                '<tool_call>{"name": "get_time", "arguments": "Paris"}</tool_call>', []),
}


def _streamed(parser, text: str, piece: int) -> tuple[str | None, list[tuple[str, str]]]:
    events = [e for i in range(0, len(text), piece) for e in parser.feed(text[i:i + piece])] + parser.finish()
    delta = delta_of(events)
    calls = {}
    for entry in delta.get("tool_calls", []):
        calls.setdefault(entry["index"], [entry["function"].get("name"), ""])[1] += entry["function"]["arguments"]
    return delta.get("content") or None, [tuple(c) for c in calls.values()]


@pytest.mark.parametrize("name", CASES)
def test_hermes_parses_the_calls_and_leaves_the_rest_as_content(name):
    text, content, calls = CASES[name]
    assert parse_tool_calls(ToolCallParser(NAMES), text) == (content if calls else text, calls)
    for arguments in (a for _, a in calls):
        assert isinstance(json.loads(arguments), dict)


@pytest.mark.parametrize("name", [n for n in CASES if CASES[n][2]])
@pytest.mark.parametrize("piece", [1, 3, 1000])
def test_streamed_pieces_reassemble_to_the_whole_answer(name, piece):
    text, content, calls = CASES[name]
    assert _streamed(ToolCallParser(NAMES), text, piece) == (content, calls)


def test_a_call_is_announced_with_its_name_before_its_arguments_stream():
    parser = ToolCallParser(NAMES)
    assert [e.kind for e in parser.feed('Sure <tool_call>{"name": "get_time", ')] == ["content", "call"]
    assert parser.feed('"arguments": {"city": "Li')[0].text == '{"city": "Li'
    assert [e.text for e in parser.feed('ma"}}</tool_call>') + parser.finish()] == ['ma"}']


def test_llama3_json_takes_python_tag_parameters_and_semicolons():
    text = '<|python_tag|>{"name": "get_time", "parameters": {"city": "Oslo"}}; {"name": "get_weather", ' \
           '"parameters": {"city": "Rome"}}'
    assert parse_tool_calls(ToolCallParser(NAMES, style="llama3_json"), text) == (
        None, [("get_time", '{"city": "Oslo"}'), ("get_weather", '{"city": "Rome"}')])


def test_forced_calls_read_the_grammars_array_and_a_named_call_its_arguments():
    assert parse_tool_calls(ToolCallParser(NAMES, forced=True), '[{"name":"get_time","arguments":{"city":"B"}}]') \
        == (None, [("get_time", '{"city": "B"}')])
    assert parse_tool_calls(NamedCallParser("get_time"), '{"city":"B","n":[1,2]}') == (
        None, [("get_time", '{"city": "B", "n": [1, 2]}')])
    assert parse_tool_calls(NamedCallParser("get_time"), '{"city":"B"') == ('{"city":"B"', [])


TOOLS = [{"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
         {"type": "function", "function": {"name": "ping"}}]


def test_required_and_named_tool_choice_become_json_schemas():
    assert forced_call_schema(TOOLS, {"type": "function", "function": {"name": "get_time"}}) == \
        TOOLS[0]["function"]["parameters"]
    schema = forced_call_schema(TOOLS, "required", parallel=False)
    assert schema["minItems"] == 1 and schema["maxItems"] == 1
    assert [c["properties"]["name"]["enum"] for c in schema["items"]["anyOf"]] == [["get_time"], ["ping"]]
    assert schema["items"]["anyOf"][1]["properties"]["arguments"] == {"type": "object"}
    assert forced_call_schema(TOOLS, "auto") is None


@pytest.mark.parametrize("choice, says", [
    ("required", None), ("sometimes", 'tool_choice must be "none", "auto", "required" or'),
    ({"type": "function", "function": {"name": "nope"}}, "tool_choice.function.name 'nope' is not one of the tools"),
    ({"type": "function"}, "tool_choice must name a function"),
])
def test_tool_choice_is_checked_against_the_tools(choice, says):
    if says is None:
        check_tool_choice(choice, TOOLS)
        return
    with pytest.raises(ValueError, match=says.replace("(", r"\(")):
        check_tool_choice(choice, TOOLS)


def test_a_second_turn_renders_calls_and_tool_results_through_qwens_template(qwen_folder):
    template = load_chat_template(Tokenizer.from_folder(qwen_folder))
    body = ChatCompletionRequest.model_validate({"tools": TOOLS, "messages": [
        {"role": "user", "content": "Time in Oslo?"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
            "name": "get_time", "arguments": '{"city": "Oslo"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "14:05"}]})
    prompt = template.render(body.template_messages(), True, body.tools)
    assert prompt.endswith('<|im_start|>user\nTime in Oslo?<|im_end|>\n<|im_start|>assistant\n<tool_call>\n'
                           '{"name": "get_time", "arguments": {"city": "Oslo"}}\n</tool_call><|im_end|>\n'
                           '<|im_start|>user\n<tool_response>\n14:05\n</tool_response><|im_end|>\n'
                           '<|im_start|>assistant\n')


def test_a_tool_call_whose_arguments_are_not_json_names_the_message():
    body = ChatCompletionRequest.model_validate({"messages": [{"role": "assistant", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{oops"}}]}]})
    with pytest.raises(ValueError, match=r"messages\[0\].tool_calls\[0\].function.arguments is not JSON"):
        body.template_messages()
