"""Two jido servers sharing one Redis: the second serves a prompt only the first has seen from the first's KV."""
from __future__ import annotations

import json

import pytest
import torch
from redis_server import redis_server
from server_harness import metric, running_server
from tiny_model_folder import BOS_ID, VOCAB_SIZE

SMALL_POOL = dict(dtype="float32", kv_cache_memory="24KiB", block_size=4, max_num_seqs=1)


def _complete(server, prompt: list[int]) -> tuple[list[str], int]:
    status, _, body = server.request("POST", "/v1/completions", {"prompt": prompt, "max_tokens": 6,
                                                                  "temperature": 0, "ignore_eos": True})
    assert status == 200, body
    data = json.loads(body)
    return data["choices"][0]["text"], data["usage"]["prompt_tokens_details"]["cached_tokens"]


def test_second_server_reports_cached_tokens_for_a_prompt_only_the_first_has_seen(tiny_model_folder, tmp_path):
    gen = torch.Generator().manual_seed(1)
    prompts = [[BOS_ID, *torch.randint(3, VOCAB_SIZE, (n,), generator=gen).tolist()] for n in (40, 45, 50)]
    with redis_server(tmp_path) as redis:
        offload = {"remote": redis.url}
        with running_server(model=str(tiny_model_folder), kv_offload=offload, **SMALL_POOL) as first:
            answers = [_complete(first, p) for p in prompts]  # the later prompts evict the first one's blocks
            assert [cached for _, cached in answers] == [0, 0, 0]
            assert metric(first.metrics(), "jido:kv_offload_stored_blocks_total", tier="remote") > 0
        first.serving.llm.shutdown()  # as `jido serve` does on exit: waits for the background writes
        with running_server(model=str(tiny_model_folder), kv_offload=offload, **SMALL_POOL) as second:
            text, cached = _complete(second, prompts[0])
            assert (text, cached) == (answers[0][0], 40)
            metrics = second.metrics()
            assert metric(metrics, "jido:kv_offload_hits_total", tier="remote") == 10
            assert metric(metrics, "jido:kv_offload_loaded_blocks_total", tier="remote") > 0
            assert metric(metrics, "jido:kv_offload_errors_total", tier="remote") == 0


@pytest.mark.slow
def test_a_second_default_model_server_takes_a_long_prompt_from_redis(tmp_path):
    # The default model is hybrid (five sliding-window groups, one full group): the blocks its request releases
    # as it finishes, the whole full group among them, must reach Redis although no request follows.
    prompt = " ".join(f"Item {i} weighs {i * 7 % 13} kilograms." for i in range(110))
    body = {"prompt": prompt, "max_tokens": 4, "temperature": 0}
    small = dict(kv_cache_memory="64MiB", max_num_seqs=1)
    with redis_server(tmp_path) as redis:
        with running_server(kv_offload={"remote": redis.url}, **small) as first:
            status, _, raw = first.request("POST", "/v1/completions", body)
            assert status == 200, raw
        first.serving.llm.shutdown()  # as `jido serve` does on exit: waits for the background writes
        with running_server(kv_offload={"remote": redis.url}, **small) as second:
            status, _, raw = second.request("POST", "/v1/completions", body)
            assert status == 200, raw
            usage = json.loads(raw)["usage"]
            assert usage["prompt_tokens"] > 1000
            assert usage["prompt_tokens_details"]["cached_tokens"] >= 0.95 * usage["prompt_tokens"]
            assert metric(second.metrics(), "jido:kv_offload_errors_total", tier="remote") == 0
