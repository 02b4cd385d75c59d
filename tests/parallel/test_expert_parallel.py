"""Expert parallelism on a tiny Qwen3-MoE: each rank holds half the experts, tokens travel by all-to-all, the
greedy tokens are the single-process engine's, and /metrics counts the load of each rank's experts."""
from __future__ import annotations

import json

import pytest

from parallel_prompts import PROMPTS, greedy_tokens
from jido import LLM
from jido.layers.moe import FusedMoE
from server_harness import running_server


@pytest.fixture(scope="module")
def ep_llm(family_folder):
    llm = LLM(str(family_folder("qwen3_moe")), dtype="float32", kv_cache_memory="4MiB", tensor_parallel_size=2,
              enable_expert_parallel=True, enable_prefix_caching=False)
    yield llm
    llm.shutdown()


def _experts_held(worker) -> list[tuple[int, int]]:
    moe = [m for m in worker.runner.model.modules() if isinstance(m, FusedMoE)]
    return [(m.first_expert, m.w13_weight.shape[0]) for m in moe]


def test_expert_parallel_gives_the_single_process_tokens_through_all_to_all(ep_llm, single_process_tokens):
    ep_llm.collective_rpc("parallel_stats", kwargs={"reset": True})
    assert greedy_tokens(ep_llm) == single_process_tokens("qwen3_moe")
    assert ep_llm.collective_rpc(_experts_held) == [[(0, 2), (0, 2)], [(2, 2), (2, 2)]]  # 2 sparse layers each
    stats = ep_llm.collective_rpc("parallel_stats")
    steps = stats[0]["num_steps"]
    # Per step and sparse layer: counts, dispatch and combine all-to-alls, and one all-gather of token shares.
    assert stats[0]["ep"]["calls"]["all_to_all"] == 3 * 2 * steps


def test_metrics_count_each_ranks_expert_load(ep_llm):
    prompt, max_tokens = PROMPTS[0], 5
    with running_server(engine=ep_llm.llm_engine) as server:
        status, _, body = server.request("POST", "/v1/completions", {
            "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True})
        assert status == 200 and json.loads(body)["usage"]["completion_tokens"] == max_tokens
        loads = {labels["ep_rank"]: value for labels, value in server.metrics().samples["jido:expert_load_total"]}
    # Every computed token (the prompt and all outputs but the last) visits 2 sparse layers x top-2 experts.
    assert sum(loads.values()) == 2 * 2 * (len(prompt) + max_tokens - 1)
    assert set(loads) == {"0", "1"} and min(loads.values()) > 0
