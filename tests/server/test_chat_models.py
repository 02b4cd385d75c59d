"""Chat on real weights: Qwen2.5-Coder-0.5B-Instruct answers with its own template; a model without one gets a 400."""
from __future__ import annotations

import json

import pytest
from server_harness import running_server

from jido.server.config import ServerConfig

pytestmark = pytest.mark.slow

QWEN = "qwen2.5-coder-0.5b-instruct"


@pytest.fixture(scope="module")
def qwen_server(qwen_folder):
    with running_server(ServerConfig(), model=QWEN) as server:
        yield server


def test_qwen_answers_a_coding_question_with_code_and_stops_at_its_end_of_turn(qwen_server):
    response = qwen_server.client().chat.completions.create(
        model=QWEN, temperature=0, max_tokens=160,
        messages=[{"role": "user", "content": "Write a Python function that returns the square of a number."}])
    choice = response.choices[0]
    assert "def " in choice.message.content
    # <|im_end|> (the GGUF's EOS) ends the turn, and is not shown.
    assert choice.finish_reason == "stop" and "<|im_end|>" not in choice.message.content


def test_tools_are_rendered_by_the_template_and_the_model_can_call_one(qwen_server, qwen_reference):
    case = next(c for c in qwen_reference["chat_cases"] if c["name"] == "tools")
    expected = next(g for g in qwen_reference["generations"] if g["name"] == "chat_tools")
    status, _, raw = qwen_server.request("POST", "/v1/chat/completions", {
        "model": QWEN, "messages": case["messages"], "tools": case["tools"], "tool_choice": "auto",
        "temperature": 0, "max_tokens": 24})
    body = json.loads(raw)
    assert status == 200, body
    # The prompt is the template's (transformers' render): prompt_tokens counts exactly its ids.
    assert body["usage"]["prompt_tokens"] == len(case["ids"])
    assert "get_weather" in body["choices"][0]["message"]["content"] and "get_weather" in expected["text"]


def test_the_served_name_is_the_model_name(qwen_server):
    assert [m.id for m in qwen_server.client().models.list().data] == [QWEN]


def test_a_model_without_a_chat_template_refuses_chat_naming_the_flag(tiny_model_folder):
    with running_server(ServerConfig(), model=str(tiny_model_folder)) as server:
        status, _, raw = server.request("POST", "/v1/chat/completions",
                                        {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1})
        assert status == 400
        error = json.loads(raw)["error"]
        assert "has no chat template" in error["message"] and "--chat-template FILE" in error["message"]
        assert error["type"] == "invalid_request_error"
        status, _, _ = server.request("POST", "/v1/completions", {"prompt": "Hi", "max_tokens": 1})
        assert status == 200
