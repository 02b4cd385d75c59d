"""Long prompts: refused by size before tokenizing, and tokenized off the event loop so /health stays quick."""
from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from server_harness import running_server

from jido.server.serving import PROMPT_BYTES_PER_TOKEN

pytestmark = pytest.mark.slow

SENTENCE = "hello world, this is text. "  # about 4 bytes a token
TOKENIZE_DELAY_S = 3.0


@pytest.fixture(scope="module")
def server():
    with running_server() as server:
        yield server


def _prompt(num_bytes: int) -> str:
    return (SENTENCE * (num_bytes // len(SENTENCE) + 1))[:num_bytes]


@pytest.mark.parametrize("path, param", [("/v1/completions", "prompt"), ("/v1/chat/completions", "messages")])
def test_a_prompt_past_the_byte_limit_gets_400_naming_the_field(server, path, param):
    limit = server.serving.max_prompt_bytes
    assert limit == server.serving.llm.max_model_len * PROMPT_BYTES_PER_TOKEN
    text = _prompt(limit + 1)
    body = {"prompt": text} if param == "prompt" else {"messages": [{"role": "user", "content": text}]}
    status, _, raw = server.request("POST", path, body)
    error = json.loads(raw)["error"]
    assert (status, error["param"]) == (400, param)
    assert error["message"].startswith(f"{param} has {limit + 1} bytes of text; at most {limit} are taken")


def test_health_answers_quickly_while_long_prompts_are_tokenized(server, monkeypatch):
    # Tokenizing is made slow on purpose (a sleep before the real encode): had it run on the event loop,
    # each /health call would wait for it; off the loop, /health answers well within the sleep.
    tokenizer = server.serving.llm.tokenizer
    real_encode = tokenizer.encode

    def slow_encode(*args, **kwargs):
        time.sleep(TOKENIZE_DELAY_S)
        return real_encode(*args, **kwargs)

    monkeypatch.setattr(tokenizer, "encode", slow_encode)
    # Just under the byte limit: several times max_model_len tokens, so each is tokenized, then refused.
    body = {"prompt": _prompt(server.serving.max_prompt_bytes), "max_tokens": 1}
    with ThreadPoolExecutor(3) as pool:
        huge = [pool.submit(server.request, "POST", "/v1/completions", body) for _ in range(3)]
        latencies = []
        while not all(f.done() for f in huge):
            start = time.monotonic()
            assert server.request("GET", "/health")[0] == 200
            latencies.append(time.monotonic() - start)
    assert len(latencies) >= 3, "the long prompts were handled too fast to overlap any /health call"
    assert max(latencies) < TOKENIZE_DELAY_S / 2, latencies
    for future in huge:
        status, _, raw = future.result()
        assert (status, json.loads(raw)["error"]["param"]) == (400, "prompt")
        assert "tokens but max_model_len is" in json.loads(raw)["error"]["message"]
