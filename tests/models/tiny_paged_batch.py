"""A minimal stand-in for the runner: owns KV caches and block tables and builds each step's metadata.

It documents how the model must be called: every step is a flat batch of the new tokens of several
requests, their positions, one KV cache tensor per layer, and :class:`AttentionMetadata` saying where each
request's context lives in the paged cache.
"""
from __future__ import annotations

import torch

from jido.attention.backend import AttentionMetadata


class TinyPagedRunner:
    """Runs steps of a model over a paged KV cache, handing out blocks in a shuffled order."""

    def __init__(self, model: torch.nn.Module, num_blocks: int = 64, block_size: int = 4, seed: int = 0) -> None:
        self.model = model
        self.block_size = block_size
        shape = model.kv_cache_shape(num_blocks, block_size)
        dtype = model.model.embed_tokens.weight.dtype
        self.kv_caches = [torch.zeros(shape, dtype=dtype) for _ in range(model.num_layers)]
        # Shuffled so that a request's blocks are not contiguous, as after a while in a real server.
        self.free_blocks = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(seed)).tolist()
        self.block_tables: dict[str, list[int]] = {}
        self.num_computed: dict[str, int] = {}

    def step(self, new_tokens: dict[str, list[int]]) -> dict[str, torch.Tensor]:
        """Feed each request its next tokens in one flat batch; return float32 logits per request."""
        input_ids, positions, slots, query_lens, seq_lens = [], [], [], [], []
        for req_id, tokens in new_tokens.items():
            start = self.num_computed.get(req_id, 0)
            end = start + len(tokens)
            table = self._grow_table(req_id, end)
            input_ids += tokens
            positions += range(start, end)
            slots += [table[p // self.block_size] * self.block_size + p % self.block_size for p in range(start, end)]
            query_lens.append(len(tokens))
            seq_lens.append(end)
            self.num_computed[req_id] = end
        metadata = self._metadata(list(new_tokens), slots, query_lens, seq_lens)
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
        self, req_ids: list[str], slots: list[int], query_lens: list[int], seq_lens: list[int]
    ) -> AttentionMetadata:
        max_blocks = max(len(self.block_tables[r]) for r in req_ids)
        block_tables = [self.block_tables[r] + [0] * (max_blocks - len(self.block_tables[r])) for r in req_ids]
        query_start_loc = torch.tensor([0] + query_lens, dtype=torch.int32).cumsum(0).to(torch.int32)
        return AttentionMetadata(
            query_start_loc=query_start_loc,
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
            block_tables=torch.tensor(block_tables, dtype=torch.int32),
            slot_mapping=torch.tensor(slots, dtype=torch.int64),
            block_size=self.block_size,
            query_lens_list=query_lens,
            seq_lens_list=seq_lens,
        )
