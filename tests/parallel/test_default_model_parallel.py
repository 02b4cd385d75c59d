"""The default model (Gemma 3 270M, GGUF codes sharded) under TP=2 and PP=2 gives the single-process greedy
tokens, through the offline API and through the server."""
from __future__ import annotations

import json

import pytest

from jido import LLM, SamplingParams
from server_harness import running_server

pytestmark = pytest.mark.slow
PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time"]
GREEDY = SamplingParams(temperature=0, max_tokens=12)


@pytest.fixture(scope="module", params=[{"tensor_parallel_size": 2}, {"pipeline_parallel_size": 2}],
                ids=["tp2", "pp2"])
def parallel_llm(request):
    llm = LLM(kv_cache_memory="64MiB", dtype="float32", quantization="none", **request.param)  # as the llm fixture
    yield llm
    llm.shutdown()


def test_offline_and_served_tokens_equal_the_single_process_engines(parallel_llm, llm):
    expected = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    got = parallel_llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in expected]
    with running_server(engine=parallel_llm.llm_engine) as server:
        for prompt, reference in zip(PROMPTS, expected):
            status, _, body = server.request("POST", "/v1/completions", {
                "prompt": prompt, "max_tokens": 12, "temperature": 0, "logprobs": 0})
            assert status == 200
            choice = json.loads(body)["choices"][0]
            assert choice["text"] == reference.outputs[0].text
