"""Each kind of bad request gets its status and an OpenAI-style error body, and the server keeps serving."""
from __future__ import annotations

import http.client
import json

import pytest
from server_harness import running_server

from jido.server.config import ServerConfig

pytestmark = pytest.mark.slow

BODY_LIMIT = 64 * 1024
COMPLETIONS, CHAT = "/v1/completions", "/v1/chat/completions"
MAX_MODEL_LEN = 4544
GOOD = {"prompt": "Hello", "max_tokens": 1, "temperature": 0}
USER = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def server():
    with running_server(ServerConfig(max_request_body_bytes=BODY_LIMIT), max_model_len=MAX_MODEL_LEN) as server:
        yield server


# (path, body, status, param, words the message must contain)
CASES = {
    "malformed_json": (COMPLETIONS, b'{"prompt": "Hello",', 400, None, "not valid JSON"),
    "json_not_an_object": (COMPLETIONS, b'["Hello"]', 400, None, "must be a JSON object"),
    "missing_prompt": (COMPLETIONS, {"max_tokens": 3}, 400, "prompt", "Field required"),
    "max_tokens_wrong_type": (COMPLETIONS, {**GOOD, "max_tokens": "ten"}, 400, "max_tokens", "valid integer"),
    "stream_wrong_type": (COMPLETIONS, {**GOOD, "stream": "yes"}, 400, "stream", "valid boolean"),
    "prompt_wrong_type": (COMPLETIONS, {**GOOD, "prompt": {"text": 1}}, 400, "prompt", "a dict prompt needs"),
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
    "echo": (COMPLETIONS, {**GOOD, "echo": True}, 400, "echo", "Input should be False"),
    "batched_prompts": (COMPLETIONS, {**GOOD, "prompt": ["a", "b"]}, 400, "prompt", "batched prompts"),
    "empty_messages": (CHAT, {"messages": []}, 400, "messages", "messages is empty"),
    "messages_wrong_type": (CHAT, {"messages": "Hi"}, 400, "messages", "valid list"),
    "image_content": (CHAT, {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, 400,
                      "messages", "text-only"),
    "roles_do_not_alternate": (CHAT, {"messages": USER + USER}, 400, "messages", "roles must alternate"),
    "chat_max_tokens_too_large": (CHAT, {"messages": USER, "max_completion_tokens": 10**6}, 400, "max_tokens",
                                  "is too large"),
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
