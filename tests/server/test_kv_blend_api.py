"""The completions API's kv_blend field (CacheBlend) on a tiny model: a blended answer, its chunks then cached, is
what the engine gives for the same prompt dict; bad kv_blend input is a 400 naming the field."""
from __future__ import annotations

import json
import re

import pytest
from server_harness import running_server

from jido import LLM, SamplingParams

DOCS = [" ".join(f"w{3 + (d * 41 + 7 * j) % 120}" for j in range(24)) for d in range(2)]
QUESTION = "w7 w8 w9"
POOL = dict(dtype="float32", kv_cache_memory="8MiB", block_size=4)


def _post(server, body: dict) -> tuple[int, dict]:
    status, _, raw = server.request("POST", "/v1/completions", body)
    return status, json.loads(raw)


@pytest.fixture(scope="module")
def server(tiny_model_folder):
    with running_server(model=str(tiny_model_folder), **POOL) as running:
        yield running


def test_a_kv_blend_completion_answers_what_the_engine_does_and_reuses_its_chunks(server, tiny_model_folder):
    body = {"prompt": QUESTION, "kv_blend": {"chunks": DOCS, "recompute_ratio": 0.3}, "max_tokens": 5,
            "temperature": 0}
    status, first = _post(server, body)
    assert status == 200, first
    status, second = _post(server, body)  # the chunks are cached now: the blend itself runs at once
    assert status == 200 and second["choices"][0]["text"] == first["choices"][0]["text"]
    llm = LLM(str(tiny_model_folder), **POOL)
    expected = llm.generate({"prompt": QUESTION, "kv_blend": body["kv_blend"]},
                            SamplingParams(temperature=0, max_tokens=5), use_tqdm=False)[0]
    assert first["choices"][0]["text"] == expected.outputs[0].text
    assert first["usage"]["prompt_tokens"] == len(expected.prompt_token_ids)


@pytest.mark.parametrize("body, message", [
    ({"prompt": QUESTION, "kv_blend": {"chunks": []}}, "non-empty list"),
    ({"prompt": [QUESTION, QUESTION], "kv_blend": {"chunks": DOCS}}, "send one prompt"),
    ({"prompt": QUESTION, "kv_blend": {"chunks": DOCS, "recompute_ratio": -1}}, r"number in \[0, 1\]"),
])
def test_bad_kv_blend_is_a_400_naming_the_field_and_the_server_keeps_serving(server, body: dict, message: str):
    status, error = _post(server, {**body, "max_tokens": 2})
    assert status == 400 and error["error"]["param"] == "kv_blend"
    assert re.search(message, error["error"]["message"])
    assert _post(server, {"prompt": QUESTION, "max_tokens": 2})[0] == 200
