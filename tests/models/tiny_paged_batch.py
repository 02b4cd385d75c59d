"""A minimal stand-in for the runner: owns KV caches and block tables and builds each step's metadata.

It documents how the model must be called: every step is a flat batch of the new tokens of several
requests, their positions, one KV cache tensor per layer, and :class:`AttentionMetadata` saying where each
request's context lives in the paged cache.
"""
from __future__ import annotations

import numpy as np
import torch

from jido.attention.backend import StepAttentionMetadata, build_common_metadata, build_step_metadata


class TinyPagedRunner:
    """Runs steps of a model over a paged KV cache, handing out blocks in a shuffled order."""

    def __init__(self, model: torch.nn.Module, num_blocks: int = 64, block_size: int = 4, seed: int = 0) -> None:
        self.model = model
        self.block_size = block_size
        self.backend = model.model.layers[0].self_attn.backend
        config = model.config
        shape = self.backend.get_kv_cache_shape(num_blocks, block_size, config.num_kv_heads, config.head_dim)
        dtype = model.model.norm.weight.dtype  # a quantized embedding keeps no float table
        self.kv_caches = [torch.zeros(shape, dtype=dtype) for _ in range(model.num_layers)]
        # Shuffled so that a request's blocks are not contiguous, as after a while in a real server.
        self.free_blocks = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(seed), device="cpu").tolist()
        self.block_tables: dict[str, list[int]] = {}
        self.num_computed: dict[str, int] = {}

    def step(self, new_tokens: dict[str, list[int]]) -> dict[str, torch.Tensor]:
        """Feed each request its next tokens in one flat batch; return float32 logits per request."""
        input_ids, positions, query_lens, seq_lens = [], [], [], []
        for req_id, tokens in new_tokens.items():
            start = self.num_computed.get(req_id, 0)
            end = start + len(tokens)
            self._grow_table(req_id, end)
            input_ids += tokens
            positions += range(start, end)
            query_lens.append(len(tokens))
            seq_lens.append(end)
            self.num_computed[req_id] = end
        metadata = self._metadata(list(new_tokens), query_lens, seq_lens)
        with torch.no_grad():
            hidden = self.model(torch.tensor(input_ids), torch.tensor(positions), self.kv_caches, metadata)
            logits = self.model.compute_logits(hidden)
        return dict(zip(new_tokens, logits.split(query_lens)))

    def _grow_table(self, req_id: str, num_tokens: int) -> list[int]:
        table = self.block_tables.setdefault(req_id, [])
        while len(table) * self.block_size < num_tokens:
            table.append(self.free_blocks.pop())
        return table

    def _metadata(
        self, req_ids: list[str], query_lens: list[int], seq_lens: list[int]
    ) -> StepAttentionMetadata:
        max_blocks = max(len(self.block_tables[r]) for r in req_ids)
        table = np.array([self.block_tables[r] + [0] * (max_blocks - len(self.block_tables[r])) for r in req_ids],
                         dtype=np.int32)
        common = build_common_metadata(query_lens, seq_lens, table, self.block_size, self.kv_caches[0].device)
        # Every layer in one KV cache group: the tiny models are tested without hybrid caching.
        return build_step_metadata(self.backend, [common], [0] * self.model.num_layers)
