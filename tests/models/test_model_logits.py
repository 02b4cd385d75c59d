"""Our model families give transformers' logits for the same weights: prefill, chunked prefill, decode, batches."""
from __future__ import annotations

import pytest
import torch
from tiny_hf_models import VOCAB_SIZE, tiny_models
from tiny_paged_batch import TinyPagedRunner

ARCHS = ["llama", "qwen2", "qwen3", "gemma3", "qwen3_moe"]
ATOL = 1e-4
PROMPT_LEN, NUM_DECODE_STEPS = 11, 5  # the prompt is longer than Gemma's window of 4


@pytest.fixture(scope="module", params=ARCHS)
def models(request: pytest.FixtureRequest) -> tuple[torch.nn.Module, torch.nn.Module]:
    return tiny_models(request.param)


def _tokens(seed: int, n: int = PROMPT_LEN + NUM_DECODE_STEPS) -> list[int]:
    return torch.randint(0, VOCAB_SIZE, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@torch.no_grad()
def _hf_logits(hf: torch.nn.Module, tokens: list[int]) -> torch.Tensor:
    return hf(torch.tensor([tokens])).logits[0].float()


def _run_schedule(
    ours: torch.nn.Module, tokens: dict[str, list[int]], schedule: list[dict[str, int]]
) -> dict[str, torch.Tensor]:
    """Run steps that feed each listed request its next ``n`` tokens; return each request's logits in order."""
    runner = TinyPagedRunner(ours)
    fed = {req_id: 0 for req_id in tokens}
    logits: dict[str, list[torch.Tensor]] = {req_id: [] for req_id in tokens}
    for step in schedule:
        batch = {req_id: tokens[req_id][fed[req_id] : fed[req_id] + n] for req_id, n in step.items()}
        for req_id, out in runner.step(batch).items():
            logits[req_id].append(out)
            fed[req_id] += step[req_id]
    return {req_id: torch.cat(outs) for req_id, outs in logits.items()}


def _run_chunks(ours: torch.nn.Module, tokens: list[int], chunk_lens: list[int]) -> torch.Tensor:
    return _run_schedule(ours, {"req": tokens}, [{"req": n} for n in chunk_lens])["req"]


def test_whole_prompt_prefill_matches_transformers(models: tuple[torch.nn.Module, torch.nn.Module]) -> None:
    hf, ours = models
    tokens = _tokens(seed=1, n=PROMPT_LEN)
    torch.testing.assert_close(_run_chunks(ours, tokens, [PROMPT_LEN]), _hf_logits(hf, tokens), atol=ATOL, rtol=0)


def test_chunked_prefill_then_decode_matches_transformers(models: tuple[torch.nn.Module, torch.nn.Module]) -> None:
    hf, ours = models
    tokens = _tokens(seed=2)
    # Chunks that start and end mid-block (block_size 4), then one token per decode step.
    chunk_lens = [3, 6, PROMPT_LEN - 9] + [1] * NUM_DECODE_STEPS
    torch.testing.assert_close(_run_chunks(ours, tokens, chunk_lens), _hf_logits(hf, tokens), atol=ATOL, rtol=0)


def test_two_requests_in_one_batch_equal_each_alone(models: tuple[torch.nn.Module, torch.nn.Module]) -> None:
    _, ours = models
    tokens = {"a": _tokens(seed=3, n=12), "b": _tokens(seed=4, n=11)}
    schedule = [
        {"a": 7, "b": 5},  # two prefills
        {"a": 1, "b": 4},  # a decode next to a prefill chunk
        {"a": 1, "b": 1},  # decode-only: the batched decode path
        {"a": 1, "b": 1},
        {"a": 2},  # a chunk after decodes
    ]
    together = _run_schedule(ours, tokens, schedule)
    for req_id in tokens:
        alone = _run_schedule(ours, {req_id: tokens[req_id]}, [{req_id: s[req_id]} for s in schedule if req_id in s])
        torch.testing.assert_close(together[req_id], alone[req_id], atol=1e-5, rtol=0)
