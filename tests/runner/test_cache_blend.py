"""CacheBlend's runner side: chunks placed at new positions equal a fresh prefill there (float64, both of Gemma 3's
RoPE bases, llama3 scaling, both cache layouts); the recompute selection exactly; recomputing everything is a
full prefill, and recomputing the most deviating tokens brings naive reuse closer to it."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from models.tiny_hf_models import tiny_models

from jido.attention.backend import build_common_metadata, build_step_metadata
from jido.attention.registry import get_attention_backend
from jido.core.kv_blend import NOT_CACHED, BlendChunk, BlendPlan
from jido.runner.cache_blend import CacheBlender, position_runs, recompute_positions

BLOCK_SIZE = 4


def test_recompute_positions_keeps_the_uncached_the_most_deviating_and_the_last():
    reused = np.array([3, 4, 5, 6, 7, 9, 10, 11])
    deviation = np.array([0.5, 9.0, 0.1, 9.0, 3.0, 0.0, 7.0, 0.2])
    # 25% of 8 reused: 2, the highest deviations (a tie at 9.0: both); 2, 8, 12, 13 have no cached KV.
    assert recompute_positions(2, 14, reused, deviation, 0.25).tolist() == [2, 4, 6, 8, 12, 13]
    # 0.35 of 8 rounds to 3: 9.0, 9.0, then 7.0; a ratio of 0 keeps only what has no cached KV.
    assert recompute_positions(2, 14, reused, deviation, 0.35).tolist() == [2, 4, 6, 8, 10, 12, 13]
    assert recompute_positions(2, 14, reused, deviation, 0.0).tolist() == [2, 8, 12, 13]
    # The last position always: its hidden state gives the next token.
    assert recompute_positions(3, 12, reused, deviation, 0.0).tolist() == [8, 11]
    assert recompute_positions(2, 14, reused, deviation, 1.0).tolist() == list(range(2, 14))


def test_equal_deviations_are_taken_in_position_order():
    reused = np.arange(10, 20)
    assert recompute_positions(10, 21, reused, np.ones(10), 0.3).tolist() == [10, 11, 12, 20]


def test_position_runs_split_at_gaps():
    assert position_runs(np.array([2, 3, 4, 8, 10, 11])) == [(2, 5), (8, 9), (10, 12)]
    assert position_runs(np.array([7])) == [(7, 8)]


class Harness:
    """A float64 model over paged caches, one tensor per layer, a block table per layer group (full, sliding)."""

    def __init__(self, arch: str, backend: str, num_blocks: int = 256) -> None:
        _, model = tiny_models(arch, seed=3)
        self.model = model.double()
        self.backend = get_attention_backend(backend)
        for layer in self.model.model.layers:
            layer.self_attn.backend = self.backend
        config = self.model.config
        self.layer_groups = [0 if window is None else 1 for window in config.sliding_windows]
        shape = self.backend.get_kv_cache_shape(num_blocks, BLOCK_SIZE, config.num_kv_heads, config.head_dim)
        self.kv_caches = [torch.zeros(shape, dtype=torch.float64) for _ in range(config.num_layers)]
        # Shuffled, so no request's blocks are contiguous and the groups' tables differ.
        self.free = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(1)).tolist()

    def tables(self, num_tokens: int) -> list[np.ndarray]:
        num = -(-num_tokens // BLOCK_SIZE)
        return [np.array([self.free.pop() for _ in range(num)], dtype=np.int32) for _ in range(2)]

    def prefill(self, token_ids: list[int], tables: list[np.ndarray], first_position: int = 0) -> None:
        """One request's prompt into its blocks; RoPE at ``first_position + i`` (the cache slots start at 0)."""
        n = len(token_ids)
        common = [build_common_metadata([n], [n], table[None], BLOCK_SIZE) for table in tables]
        metadata = build_step_metadata(self.backend, common, self.layer_groups)
        with torch.no_grad():
            self.model(torch.tensor(token_ids), torch.arange(first_position, first_position + n), self.kv_caches,
                       metadata)

    def kv(self, layer: int, tables: list[np.ndarray], positions: range) -> torch.Tensor:
        """K and V of ``positions`` in one layer: ``[2, len, kv_heads, head_dim]``."""
        blender = self.blender()
        table = tables[self.layer_groups[layer]]
        slots = torch.tensor([int(table[p // BLOCK_SIZE]) * BLOCK_SIZE + p % BLOCK_SIZE for p in positions])
        return blender.slot_views[layer][:, slots // BLOCK_SIZE, slots % BLOCK_SIZE]

    def blender(self, check_layer: int = 1) -> CacheBlender:
        return CacheBlender(self.model, self.backend, self.kv_caches, self.layer_groups, BLOCK_SIZE,
                            self.backend.block_token_dim, check_layer)


def chunk(start: int, source_start: int, num_tokens: int, tables: list[np.ndarray]) -> BlendChunk:
    return BlendChunk(start, source_start, num_tokens, [t.tolist() for t in tables])


@pytest.mark.parametrize("backend", ["torch", "tiled"])
@pytest.mark.parametrize("arch", ["gemma3", "llama"])
def test_a_placed_chunk_equals_a_fresh_prefill_of_it_at_its_new_positions(arch: str, backend: str):
    h = Harness(arch, backend)
    head_and_chunk = [2] + list(range(10, 24))  # 15 tokens: 3 whole blocks cached, 3 tokens not
    source = h.tables(len(head_and_chunk))
    h.prefill(head_and_chunk, source)
    start, num_tokens = 21, 40  # the chunk lands at positions 21.. of a 40-token prompt
    target = h.tables(num_tokens)
    plan = BlendPlan([chunk(start, 1, 14, [t[:3] for t in source])], 0.15)
    placed = h.blender().place_chunks(plan, 0, target)
    assert placed.positions.tolist() == list(range(start, start + 11))  # positions 1..11 of the chunk's blocks
    # The reference: the chunk prefilled alone with every position shifted by the same 20, which RoPE's relative
    # scores leave unchanged except for the rotation, in every layer (Gemma 3: local and global bases).
    reference = h.tables(len(head_and_chunk))
    h.prefill(head_and_chunk, reference, first_position=start - 1)
    for layer in range(h.model.config.num_layers):
        ours, fresh = h.kv(layer, target, range(start, start + 11)), h.kv(layer, reference, range(1, 12))
        # RoPE's cos/sin tables are float32 (as in transformers): that rounding is all that separates them.
        torch.testing.assert_close(ours, fresh, atol=2e-6, rtol=0)
        assert (ours[0] - h.kv(layer, source, range(1, 12))[0]).abs().max() > 1e-2  # the keys did move


def test_nothing_before_the_prefix_hit_is_written():
    h = Harness("gemma3", "torch")
    source = h.tables(9)
    h.prefill([2] + list(range(30, 38)), source)
    target = h.tables(24)
    before = [h.kv(layer, target, range(0, 24)).clone() for layer in range(3)]
    # Two whole blocks cached (the scheduler never offers a partial one): the chunk's tokens 1..7 at 6..12.
    placed = h.blender().place_chunks(BlendPlan([chunk(6, 1, 8, [t[:2] for t in source])], 0.0), 8, target)
    assert placed.positions.tolist() == [8, 9, 10, 11, 12]  # of which 8.. are past the prefix hit
    for layer in range(3):
        after = h.kv(layer, target, range(0, 24))
        assert torch.equal(after[:, :8], before[layer][:, :8]) and not torch.equal(after[:, 8:13], before[layer][:, 8:13])


def blended_hidden(h: Harness, prompt: list[int], chunks: list[tuple[int, int]], ratio: float,
                   check_layer: int) -> torch.Tensor:
    """Cache each chunk after the head [2], then blend the prompt; the last position's final hidden state."""
    plan_chunks = []
    for start, end in chunks:
        tables = h.tables(1 + end - start)
        h.prefill([2] + prompt[start:end], tables)
        plan_chunks.append(chunk(start, 1, end - start, tables))
    target = h.tables(len(prompt))
    return h.blender(check_layer).prefill(BlendPlan(plan_chunks, ratio), np.array(prompt), 0, target)


def full_hidden(h: Harness, prompt: list[int]) -> torch.Tensor:
    tables = h.tables(len(prompt))
    n = len(prompt)
    common = [build_common_metadata([n], [n], t[None], BLOCK_SIZE) for t in tables]
    with torch.no_grad():
        return h.model(torch.tensor(prompt), torch.arange(n), h.kv_caches,
                       build_step_metadata(h.backend, common, h.layer_groups))[-1:]


PROMPT = [2] + [10 + i % 50 for i in range(40)] + [90 + i for i in range(20)] + [7, 8, 9]  # head, 2 chunks, question
CHUNKS = [(1, 41), (41, 61)]


@pytest.mark.parametrize("backend", ["torch", "tiled"])
def test_recomputing_every_token_is_a_full_prefill(backend: str):
    h = Harness("gemma3", backend)
    torch.testing.assert_close(blended_hidden(h, PROMPT, CHUNKS, 1.0, check_layer=1), full_hidden(h, PROMPT),
                               atol=1e-10, rtol=0)


def test_naive_reuse_differs_from_a_full_prefill_and_recomputing_the_deviating_tokens_comes_closer():
    # Layer 0's K/V never depend on the context; layer 1 (full attention) is where chunk 2 first differs.
    h = Harness("gemma3", "torch")
    full = full_hidden(h, PROMPT)
    naive = (blended_hidden(h, PROMPT, CHUNKS, 0.0, check_layer=1) - full).abs().max()
    blended = (blended_hidden(h, PROMPT, CHUNKS, 0.15, check_layer=1) - full).abs().max()
    assert naive > 1e-3 and blended < 0.5 * naive


def test_a_chunk_with_no_cached_blocks_is_computed_in_full():
    h = Harness("gemma3", "torch")
    n = len(PROMPT)
    target = h.tables(n)
    uncached = [[NOT_CACHED] * 11, [NOT_CACHED] * 11]
    plan = BlendPlan([BlendChunk(1, 1, 40, uncached), BlendChunk(41, 1, 20, [[NOT_CACHED] * 6] * 2)], 0.0)
    hidden = h.blender().prefill(plan, np.array(PROMPT), 0, target)
    torch.testing.assert_close(hidden, full_hidden(h, PROMPT), atol=1e-10, rtol=0)
