"""Each kind of bad request gets its status and an OpenAI-style error body, and the server keeps serving."""
from __future__ import annotations

import http.client
import json

import pytest
from server_harness import GEMMA_CHAT_TEMPLATE, running_server

from jido.server.config import ServerConfig

pytestmark = pytest.mark.slow

BODY_LIMIT = 64 * 1024
COMPLETIONS, CHAT = "/v1/completions", "/v1/chat/completions"
MAX_MODEL_LEN = 4544
GOOD = {"prompt": "Hello", "max_tokens": 1, "temperature": 0}
USER = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def server():
    config = ServerConfig(max_request_body_bytes=BODY_LIMIT, chat_template=GEMMA_CHAT_TEMPLATE)
    with running_server(config, max_model_len=MAX_MODEL_LEN) as server:
        yield server


# (path, body, status, param, words the message must contain)
CASES = {
    "malformed_json": (COMPLETIONS, b'{"prompt": "Hello",', 400, None, "not valid JSON"),
    "json_not_an_object": (COMPLETIONS, b'["Hello"]', 400, None, "must be a JSON object"),
    "missing_prompt": (COMPLETIONS, {"max_tokens": 3}, 400, "prompt", "Field required"),
    "max_tokens_wrong_type": (COMPLETIONS, {**GOOD, "max_tokens": "ten"}, 400, "max_tokens", "valid integer"),
    "stream_wrong_type": (COMPLETIONS, {**GOOD, "stream": "yes"}, 400, "stream", "valid boolean"),
    "prompt_wrong_type": (COMPLETIONS, {**GOOD, "prompt": {"text": 1}}, 400, "prompt",
                          "must be a string, an array of token ids, or an array of one of those, got object"),
    "prompt_ids_with_a_boolean": (COMPLETIONS, {**GOOD, "prompt": [2, True]}, 400, "prompt",
                                  "got an array holding boolean, integer"),
    "stop_integer": (COMPLETIONS, {**GOOD, "stop": 5}, 400, "stop",
                     "must be a string or an array of strings, got integer"),
    "stop_boolean": (COMPLETIONS, {**GOOD, "stop": True}, 400, "stop", "got boolean"),
    "stop_object": (COMPLETIONS, {**GOOD, "stop": {"a": 1}}, 400, "stop", "got object"),
    "stop_list_with_integer": (COMPLETIONS, {**GOOD, "stop": ["a", 1]}, 400, "stop",
                               "got an array holding integer, string"),
    "stop_token_ids_boolean": (COMPLETIONS, {**GOOD, "stop_token_ids": [True]}, 400, "stop_token_ids.0",
                               "valid integer"),
    "top_k_float": (COMPLETIONS, {**GOOD, "top_k": 1.5}, 400, "top_k", "valid integer"),
    "lone_surrogate_prompt": (COMPLETIONS, {**GOOD, "prompt": "\ud800x"}, 400, "prompt",
                              "prompt is not valid Unicode: character 0 is a lone surrogate"),
    "lone_surrogate_content": (CHAT, {"messages": [{"role": "user", "content": "Hi \ud800"}]}, 400, "messages",
                               "messages[0].content is not valid Unicode: character 3 is a lone surrogate"),
    "content_wrong_type": (CHAT, {"messages": [{"role": "user", "content": 5}]}, 400, "messages.0.content",
                           "must be a string or an array of content parts, got integer"),
    "deeply_nested_json": (COMPLETIONS, b'{"prompt": "Hi", "x": ' + b"[" * 5000 + b"]" * 5000 + b"}", 400, None,
                           "nested too deeply"),
    "integer_of_5000_digits": (COMPLETIONS, b'{"prompt": "Hi", "seed": ' + b"9" * 5000 + b"}", 400, None,
                               "an integer has 5000 digits; at most 4300 are read"),
    "seed_past_int64": (COMPLETIONS, {**GOOD, "seed": 2**63}, 400, "seed",
                        "seed must be an integer that fits in an int64"),
    "temperature_infinity": (COMPLETIONS, b'{"prompt": "Hi", "temperature": Infinity}', 400, "temperature",
                             "finite number"),
    "temperature_1e999": (COMPLETIONS, b'{"prompt": "Hi", "temperature": 1e999}', 400, "temperature", "finite number"),
    "top_p_nan": (COMPLETIONS, b'{"prompt": "Hi", "top_p": NaN}', 400, "top_p", "finite number"),
    "temperature_past_float32": (COMPLETIONS, {**GOOD, "temperature": 1e39}, 400, "temperature",
                                 "the largest float32"),
    "presence_penalty_out_of_range": (COMPLETIONS, {**GOOD, "presence_penalty": 3}, 400, "presence_penalty",
                                      "presence_penalty must be in [-2, 2], got 3"),
    "empty_prompt": (COMPLETIONS, {**GOOD, "prompt": ""}, 400, "prompt", "prompt is empty"),
    "token_outside_vocabulary": (COMPLETIONS, {**GOOD, "prompt": [2, 10**9]}, 400, "prompt",
                                 "outside the vocabulary"),
    "unknown_model": (COMPLETIONS, {**GOOD, "model": "gpt-4"}, 404, "model", "'gpt-4' does not exist"),
    "prompt_too_long": (COMPLETIONS, {**GOOD, "prompt": [2] * 5000}, 400, "prompt",
                        f"max_model_len is {MAX_MODEL_LEN}"),
    "max_tokens_too_large": (COMPLETIONS, {**GOOD, "max_tokens": 10**6}, 400, "max_tokens",
                             "max_tokens=1000000 is too large"),
    "n_too_large": (COMPLETIONS, {**GOOD, "n": 1000}, 400, "n", "n=1000 is too large"),
    "negative_temperature": (COMPLETIONS, {**GOOD, "temperature": -0.5}, 400, "temperature",
                             "temperature must be >= 0"),
    "top_p_zero": (COMPLETIONS, {**GOOD, "top_p": 0.0}, 400, "top_p", "top_p must be in (0, 1]"),
    "empty_stop_string": (COMPLETIONS, {**GOOD, "stop": [""]}, 400, "stop", "stop must be non-empty strings"),
    "chat_echo": (CHAT, {"messages": USER, "echo": True}, 400, "echo", "echo is not supported"),
    "echo_wrong_type": (COMPLETIONS, {**GOOD, "echo": "yes"}, 400, "echo", "valid boolean"),
    "max_tokens_zero_without_echo": (COMPLETIONS, {**GOOD, "max_tokens": 0}, 400, "max_tokens", "0 only with"),
    "best_of_above_n": (COMPLETIONS, {**GOOD, "best_of": 2}, 400, "best_of", "best_of is not supported"),
    "suffix": (COMPLETIONS, {**GOOD, "suffix": "end"}, 400, "suffix", "suffix is not supported"),
    "logit_bias": (COMPLETIONS, {**GOOD, "logit_bias": {"2": 5}}, 400, "logit_bias", "logit_bias is not supported"),
    "chat_logit_bias": (CHAT, {"messages": USER, "logit_bias": {"2": 5}}, 400, "logit_bias", "logit biases"),
    "tool_choice_naming_no_tool": (CHAT, {"messages": USER, "tools": [{"type": "function", "function": {"name": "f"}}],
                                          "tool_choice": {"type": "function", "function": {"name": "g"}}}, 400,
                                   "tool_choice", "tool_choice.function.name 'g' is not one of the tools: f"),
    "tool_choice_without_tools": (CHAT, {"messages": USER, "tool_choice": "auto"}, 400, "tool_choice", "tool calls"),
    "completions_tool_choice": (COMPLETIONS, {**GOOD, "tool_choice": "auto"}, 400, "tool_choice",
                                "tool_choice is not supported"),
    "functions": (CHAT, {"messages": USER, "functions": [{"name": "f"}]}, 400, "functions", "function calling"),
    "function_call": (CHAT, {"messages": USER, "function_call": "auto"}, 400, "function_call", "function calling"),
    "response_format": (CHAT, {"messages": USER, "response_format": {"type": "xml"}}, 400,
                        "response_format", 'response_format.type must be "text", "json_object" or "json_schema"'),
    "batch_with_an_empty_prompt": (COMPLETIONS, {**GOOD, "prompt": ["a", ""]}, 400, "prompt",
                                   "prompt[1]: prompt is empty"),
    "batch_with_a_prompt_too_long_for_max_tokens": (COMPLETIONS, {**GOOD, "prompt": [[2, 3], [5] * 4500],
                                                                  "max_tokens": 100}, 400, "max_tokens",
                                                    "prompt[1]: max_tokens=100 is too large"),
    "empty_messages": (CHAT, {"messages": []}, 400, "messages", "messages is empty"),
    "messages_wrong_type": (CHAT, {"messages": "Hi"}, 400, "messages", "valid list"),
    "image_content": (CHAT, {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, 400,
                      "messages", "text-only"),
    "roles_do_not_alternate": (CHAT, {"messages": USER + USER}, 400, "messages", "roles must alternate"),
    "chat_max_tokens_too_large": (CHAT, {"messages": USER, "max_tokens": 10**6}, 400, "max_tokens",
                                  "max_tokens=1000000 is too large"),
    "chat_max_completion_tokens_too_large": (CHAT, {"messages": USER, "max_completion_tokens": 10**6}, 400,
                                             "max_completion_tokens", "max_completion_tokens=1000000 is too large"),
    "chat_max_completion_tokens_zero": (CHAT, {"messages": USER, "max_completion_tokens": 0}, 400,
                                        "max_completion_tokens", "max_completion_tokens must be an integer >= 1"),
    "chat_top_logprobs_past_20": (CHAT, {"messages": USER, "logprobs": True, "top_logprobs": 21}, 400,
                                  "top_logprobs", "top_logprobs must be an integer in [0, 20], got 21"),
    "chat_top_logprobs_negative_without_logprobs": (CHAT, {"messages": USER, "top_logprobs": -1}, 400, "top_logprobs",
                                                    "top_logprobs must be an integer in [0, 20], got -1"),
    "chat_top_logprobs_2_to_the_64": (CHAT, {"messages": USER, "top_logprobs": 2**64}, 400, "top_logprobs",
                                      "top_logprobs must be an integer in [0, 20], got 18446744073709551616"),
    "chat_top_logprobs_without_logprobs": (CHAT, {"messages": USER, "top_logprobs": 3}, 400, "top_logprobs",
                                           "top_logprobs needs logprobs: true"),
    "tool_without_function": (CHAT, {"messages": USER, "tools": [{}]}, 400, "tools",
                              "tools[0].function must be an object with the function's name, got nothing"),
    "tool_function_without_name": (CHAT, {"messages": USER, "tools": [{"type": "function", "function": {}}]}, 400,
                                   "tools", "tools[0].function.name must be a non-empty string"),
    "tool_of_another_type": (CHAT, {"messages": USER, "tools": [{"type": "retrieval"}]}, 400, "tools",
                             'tools[0].type must be "function", got "retrieval"'),
    "tool_parameters_not_an_object": (CHAT, {"messages": USER, "tools": [
        {"type": "function", "function": {"name": "f", "parameters": "none"}}]}, 400, "tools",
        "tools[0].function.parameters must be a JSON object, got string"),
    "tool_not_an_object": (CHAT, {"messages": USER, "tools": [5]}, 400, "tools.0", "valid dictionary"),
    "chat_template_kwargs_not_an_object": (CHAT, {"messages": USER, "chat_template_kwargs": "yes"}, 400,
                                           "chat_template_kwargs", "valid dictionary"),
    "chat_template_kwargs_replacing_messages": (CHAT, {"messages": USER, "chat_template_kwargs": {"messages": []}},
                                                400, "chat_template_kwargs",
                                                "chat_template_kwargs cannot set messages: jido sets those"),
    "body_over_limit": (COMPLETIONS, {**GOOD, "prompt": "x" * BODY_LIMIT}, 413, None, f"limit of {BODY_LIMIT}"),
    "unknown_route": ("/v1/embeddings", GOOD, 404, None, "Not Found"),
}


@pytest.mark.parametrize("name", CASES)
def test_bad_request_gets_an_openai_error_then_the_server_still_serves(server, name):
    path, body, status, param, words = CASES[name]
    got_status, headers, raw = server.request("POST", path, body)
    assert got_status == status, raw
    assert headers["content-type"] == "application/json"
    error = json.loads(raw)["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert words in error["message"]
    assert error["param"] == param
    assert server.request("POST", COMPLETIONS, GOOD)[0] == 200


# Values of unsupported fields that ask for nothing, and unknown fields, are accepted (as vLLM accepts them).
NO_OPS = {"best_of": 1, "echo": False, "suffix": None, "logit_bias": {}, "tools": [], "tool_choice": "none",
          "functions": [], "function_call": "none", "response_format": {"type": "text"}, "user": "someone"}


@pytest.mark.parametrize("path, body", [(COMPLETIONS, GOOD), (COMPLETIONS, {**GOOD, "n": 2, "best_of": 2}),
                                        (COMPLETIONS, {**GOOD, "best_of": None}),
                                        (CHAT, {"messages": USER, "max_tokens": 1})])
def test_unsupported_fields_with_values_that_ask_for_nothing_are_accepted(server, path, body):
    status, _, raw = server.request("POST", path, {**NO_OPS, **body})
    assert status == 200, raw


def _completion_tokens(server, path: str, body: dict) -> tuple[int, int]:
    status, _, raw = server.request("POST", path, {"temperature": 0, "ignore_eos": True, **body})
    assert status == 200, raw
    usage = json.loads(raw)["usage"]
    return usage["prompt_tokens"], usage["completion_tokens"]


def test_completions_max_tokens_defaults_to_16_and_null_means_the_rest_of_the_context(server):
    assert _completion_tokens(server, COMPLETIONS, {"prompt": "Hello"})[1] == 16
    near_the_end = [2] * (MAX_MODEL_LEN - 5)
    assert _completion_tokens(server, COMPLETIONS, {"prompt": near_the_end, "max_tokens": None}) == (
        MAX_MODEL_LEN - 5, 5)


@pytest.mark.parametrize("limit", [{}, {"max_tokens": None}, {"max_completion_tokens": None}])
def test_chat_max_tokens_omitted_or_null_means_the_rest_of_the_context(server, limit):
    content = " ".join(["cat"] * (MAX_MODEL_LEN - 20))
    prompt_tokens, completion_tokens = _completion_tokens(
        server, CHAT, {"messages": [{"role": "user", "content": content}], **limit})
    assert prompt_tokens > MAX_MODEL_LEN - 40  # so generating to the end takes seconds, not minutes
    assert completion_tokens == MAX_MODEL_LEN - prompt_tokens


@pytest.mark.parametrize("extreme", [{"top_p": 1e-300}, {"top_p": 1e-300, "seed": 3}, {"top_k": 1, "top_p": 1e-300}])
def test_a_top_p_that_underflows_samples_the_most_likely_token_not_padding(server, extreme):
    prompt = {"prompt": "The capital of France is", "max_tokens": 4, "ignore_eos": True}
    _, _, greedy = server.request("POST", COMPLETIONS, {**prompt, "temperature": 0})
    status, _, raw = server.request("POST", COMPLETIONS, {**prompt, "temperature": 1, **extreme})
    assert status == 200, raw
    assert json.loads(raw)["choices"][0]["text"] == json.loads(greedy)["choices"][0]["text"]


def test_chunked_body_over_limit_is_refused_while_it_streams_in(server):
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    chunks = iter([b'{"prompt": "', b"x" * BODY_LIMIT, b'"}'])
    connection.request("POST", COMPLETIONS, body=chunks, encode_chunked=True,
                       headers={"Content-Type": "application/json"})
    response = connection.getresponse()
    assert response.status == 413
    assert f"limit of {BODY_LIMIT}" in json.loads(response.read())["error"]["message"]
    connection.close()
    assert server.request("POST", COMPLETIONS, GOOD)[0] == 200


def test_wrong_method_gets_405_with_an_openai_error(server):
    status, _, raw = server.request("GET", COMPLETIONS)
    assert status == 405
    assert "Method Not Allowed" in json.loads(raw)["error"]["message"]
