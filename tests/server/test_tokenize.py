"""vLLM's /tokenize and /detokenize, the KV peak gauge, and `jido bench` sizing prompts with them."""
from __future__ import annotations

import json

import pytest
from server_harness import metric, running_server

from jido.bench.cli import bench_main
from jido.bench.tokens import ServerTokenizer

pytestmark = pytest.mark.slow

TEXT = "The capital of France is Paris."
PEAK = "jido:kv_cache_usage_perc_max"


@pytest.fixture(scope="module")
def server():
    with running_server() as server:
        yield server


def _post(server, path: str, body: dict) -> tuple[int, dict]:
    status, _, data = server.request("POST", path, body)
    return status, json.loads(data)


def test_tokenize_returns_the_engine_tokenizers_ids_count_and_max_model_len(server):
    tokenizer, llm = server.serving.llm.tokenizer, server.serving.llm
    status, body = _post(server, "/tokenize", {"model": "gemma-3-270m", "prompt": TEXT})
    assert status == 200
    assert body == {"tokens": tokenizer.encode(TEXT), "count": len(tokenizer.encode(TEXT)),
                    "max_model_len": llm.max_model_len, "token_strs": None}
    status, plain = _post(server, "/tokenize", {"prompt": TEXT, "add_special_tokens": False,
                                                "return_token_strs": True})
    assert status == 200 and plain["tokens"] == body["tokens"][1:]  # without the BOS
    assert plain["token_strs"] == tokenizer.convert_ids_to_tokens(plain["tokens"])


def test_detokenize_gives_back_the_text_with_special_tokens(server):
    ids = server.serving.llm.tokenizer.encode(TEXT)
    status, body = _post(server, "/detokenize", {"model": "gemma-3-270m", "tokens": ids})
    assert (status, body) == (200, {"prompt": "<bos>" + TEXT})


def test_tokenize_and_detokenize_refuse_bad_input_with_openai_errors(server):
    vocab_size = server.serving.llm.tokenizer.vocab_size
    status, body = _post(server, "/detokenize", {"tokens": [2, vocab_size]})
    assert status == 400 and body["error"]["param"] == "tokens"
    assert body["error"]["message"] == (f"tokens[1] = {vocab_size} is outside the vocabulary: ids must be in "
                                        f"[0, {vocab_size})")
    status, body = _post(server, "/tokenize", {"model": "other", "prompt": TEXT})
    assert status == 404 and body["error"]["code"] == "model_not_found"
    status, body = _post(server, "/tokenize", {"prompt": 5})
    assert status == 400 and body["error"]["param"] == "prompt"


def test_kv_peak_gauge_sees_a_request_freed_within_its_step_and_resets_on_scrape(server):
    server.metrics()  # start a fresh peak
    status, _ = _post(server, "/v1/completions", {"prompt": TEXT * 40, "max_tokens": 1})
    assert status == 200
    after = server.metrics()
    # Allocated, computed and freed in one step: the gauge after the step reads 0, the peak does not.
    assert metric(after, "vllm:kv_cache_usage_perc") == 0.0
    assert metric(after, PEAK) > 0.0
    assert metric(server.metrics(), PEAK) == 0.0


def test_bench_sizes_prompts_in_model_tokens_through_tokenize(server, tmp_path):
    out = tmp_path / "result.json"
    argv = ["--base-url", server.base_url, "--num-prompts", "3", "--random-input-len", "60",
            "--random-output-len", "1", "--disable-tqdm", "--no-plots", "--result-filename", str(out)]
    assert bench_main(argv) == 0
    result = json.loads(out.read_text())
    assert result["prompt_len_unit"] == ServerTokenizer.name and result["completed"] == 3
    # The server's usage counts BOS too; a detokenized window may merge one token at each edge.
    assert all(abs(n - 61) <= 2 for n in result["input_lens"]), result["input_lens"]
    assert result["mean_tpot_ms"] is None and result["p99_itl_ms"] is None
    assert result["server_max_kv_cache_usage"] > 0.0
    assert result["server_max_kv_cache_usage_source"] == PEAK
