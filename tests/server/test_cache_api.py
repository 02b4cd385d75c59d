"""POST/GET/DELETE /v1/cache (cache-augmented generation) on a tiny model: a pinned document survives other
traffic and later prompts hit it; too large a pin, or one past max_pinned_prefixes, is a 413; a prompt shorter
than a block is a 400; /metrics has the pins' totals, never a series per pin id."""
from __future__ import annotations

import json

import pytest
import torch
from server_harness import metric, running_server
from tiny_model_folder import BOS_ID, VOCAB_SIZE

# 96 blocks of 4 tokens in 3 one-layer groups; a 64-token request peaks at 48, so pins may hold 48.
SMALL_POOL = dict(dtype="float32", kv_cache_memory="48KiB", block_size=4, max_num_seqs=1, max_model_len=64)


def _random(n: int, seed: int) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(3, VOCAB_SIZE, (n,), generator=gen).tolist()


def _post(server, path: str, body: dict) -> tuple[int, dict]:
    status, _, raw = server.request("POST", path, body)
    return status, json.loads(raw)


@pytest.fixture(scope="module")
def server(tiny_model_folder):
    with running_server(model=str(tiny_model_folder), **SMALL_POOL) as running:
        yield running


def test_a_pinned_document_is_reused_after_traffic_that_evicts_everything_else(server):
    document = [BOS_ID, *_random(29, 0)]
    status, pin = _post(server, "/v1/cache", {"prompt": document})
    assert status == 200 and pin == {"id": pin["id"], "object": "cache", "num_tokens": 30, "num_cached_tokens": 28}
    for seed in range(1, 9):  # other prompts that together need the whole pool
        assert _post(server, "/v1/completions", {"prompt": [BOS_ID, *_random(40, seed)], "max_tokens": 2})[0] == 200
    status, answer = _post(server, "/v1/completions", {"prompt": document + _random(6, 99), "max_tokens": 2})
    assert status == 200 and answer["usage"]["prompt_tokens_details"]["cached_tokens"] == 28
    status, _, raw = server.request("GET", "/v1/cache")
    listed = json.loads(raw)["data"]
    assert status == 200 and listed == [{"id": pin["id"], "object": "cache", "num_cached_tokens": 28,
                                         "num_blocks": 9, "num_bytes": 9 * 512, "hits": 1}]
    metrics = server.metrics()
    assert metric(metrics, "jido:kv_pinned_prefixes") == 1 and metric(metrics, "jido:kv_pinned_bytes") == 9 * 512
    assert metric(metrics, "jido:kv_pinned_tokens") == 28
    assert not [name for name in metrics.samples if "id" in {k for labels, _ in metrics.samples[name] for k in labels}]
    assert metric(metrics, "jido:kv_pinned_hits_total") == 1
    status, _, raw = server.request("DELETE", f"/v1/cache/{pin['id']}")
    assert status == 200 and json.loads(raw) == {"id": pin["id"], "object": "cache", "deleted": True}
    status, _, raw = server.request("DELETE", f"/v1/cache/{pin['id']}")
    assert status == 404 and json.loads(raw)["error"]["code"] == "cache_not_found"


def test_pinning_more_than_fits_is_a_413_and_the_server_keeps_serving(server):
    pins = [_post(server, "/v1/cache", {"prompt": [BOS_ID, *_random(59, seed)]}) for seed in range(10, 13)]
    # Each holds 17 blocks (15 full, 1 per sliding group); a new one is counted at 20 (blocks_per_request of its
    # length plus the token after it), which the third no longer finds room for.
    assert [status for status, _ in pins] == [200, 200, 413]
    error = pins[2][1]["error"]
    assert error["code"] == "cache_full" and error["message"].startswith(
        "pinning 60 tokens holds 20 KV blocks, but only 14 of the pool's 96 can be pinned while a 64-token request "
        "still fits beside the pins (34 blocks are pinned)")
    status, _, raw = server.request("GET", "/v1/cache")
    assert [p["id"] for p in json.loads(raw)["data"]] == [pins[0][1]["id"], pins[1][1]["id"]]
    assert _post(server, "/v1/completions", {"prompt": [BOS_ID, *_random(60, 4)], "max_tokens": 3})[0] == 200
    for _, pin in pins[:2]:
        assert server.request("DELETE", f"/v1/cache/{pin['id']}")[0] == 200


@pytest.mark.parametrize("body, message", [({"prompt": []}, "prompt is empty"),
                                           ({"prompt": 5}, "must be a string or an array of token ids"),
                                           ({"prompt": [BOS_ID, 5, 6]}, "the prompt has 3 tokens, less than one KV "
                                                                        "block (4 tokens)")])
def test_a_bad_prompt_to_pin_is_a_400(server, body, message):
    status, answer = _post(server, "/v1/cache", body)
    assert status == 400 and message in answer["error"]["message"]
    assert answer["error"]["param"] == "prompt"


def test_a_pin_past_max_pinned_prefixes_is_a_413_until_one_is_deleted(tiny_model_folder):
    with running_server(model=str(tiny_model_folder), **SMALL_POOL, max_pinned_prefixes=1) as server:
        status, pin = _post(server, "/v1/cache", {"prompt": [BOS_ID, *_random(7, 20)]})
        assert status == 200
        status, answer = _post(server, "/v1/cache", {"prompt": [BOS_ID, *_random(7, 21)]})
        assert (status, answer["error"]["code"]) == (413, "too_many_pins")
        assert answer["error"]["message"] == ("max_pinned_prefixes=1 prefixes are pinned or being pinned already: "
                                              "unpin one (DELETE /v1/cache/{id}) or raise max_pinned_prefixes")
        assert server.request("DELETE", f"/v1/cache/{pin['id']}")[0] == 200
        assert _post(server, "/v1/cache", {"prompt": [BOS_ID, *_random(7, 21)]})[0] == 200

