"""CacheBlend, runner side: a prompt's cached chunks moved into place (keys re-rotated), then a prefill that
recomputes, past an early layer, only the tokens whose KV deviates most (Yao et al., EuroSys 2025)."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from jido.attention.backend import AttentionBackend, StepAttentionMetadata, build_common_metadata, build_step_metadata
from jido.attention.kv_quant import cache_rows, read_rows
from jido.core.kv_blend import NOT_CACHED, BlendPlan
from jido.layers.rotary import apply_rotary


def recompute_positions(num_computed: int, num_tokens: int, reused: np.ndarray, deviation: np.ndarray,
                        ratio: float) -> np.ndarray:
    """The positions computed past the check layer, in order: every position in ``[num_computed, num_tokens)``
    whose KV was not reused, the ``round(ratio * len(reused))`` reused ones whose KV deviates most (ties: the
    earlier first), and the last position, whose hidden state gives the next token.

    ``reused`` holds the positions whose KV came from a cached chunk, ``deviation`` each one's deviation.
    """
    num_select = int(ratio * len(reused) + 0.5)
    order = np.argsort(-deviation, kind="stable")
    selected = reused[order[:num_select]]
    computed = np.setdiff1d(np.arange(num_computed, num_tokens), reused)
    return np.union1d(np.union1d(computed, selected), [num_tokens - 1]).astype(np.int64)


def position_runs(positions: np.ndarray) -> list[tuple[int, int]]:
    """Maximal runs of consecutive positions, as ``(start, end)``: each runs as one query block of the request."""
    breaks = np.nonzero(np.diff(positions) != 1)[0] + 1
    return [(int(run[0]), int(run[-1]) + 1) for run in np.split(positions, breaks)]


@dataclass
class _Placed:
    """Positions whose KV was moved in from cached chunks, and the check layer's K/V as moved (float32)."""

    positions: np.ndarray  # [m] prompt positions, ascending
    slots: np.ndarray  # [m] their cache slots in the check layer's group
    keys: torch.Tensor  # [m, kv_heads, head_dim]
    values: torch.Tensor


class CacheBlender:
    """Prefills one blend request: places its chunks' cached KV, computes layers ``0..check_layer`` for every new
    token, compares their K/V there with the placed ones, and computes the later layers for the tokens that
    deviate most, the tokens with no cached KV and the question; the rest keep the placed KV.

    Placement: token ``j`` of a chunk cached at position ``s`` goes to position ``t``; its key is rotated by
    ``t - s`` with its own layer's RoPE (RoPE rotations compose, so this is the key a prefill at ``t`` would
    compute from the same input), its value is copied. Later layers' queries attend over the placed and the
    recomputed K/V together: each run of consecutive recomputed positions is one query block of the request
    (the backend writes a step's K/V before it attends, so every query sees every recomputed key before it).
    NOTE: positions before ``num_computed`` (the prefix hit, shared blocks) are never written.
    """

    def __init__(self, model: torch.nn.Module, backend: AttentionBackend, kv_caches: list[torch.Tensor],
                 layer_groups: list[int], block_size: int, block_token_dim: int, check_layer: int,
                 begin_layers: Callable[[int], None] | None = None) -> None:
        self.model = model
        self.backend = backend
        self.kv_caches = kv_caches
        self.layer_groups = layer_groups
        self.block_size = block_size
        # [2, num_blocks, block_size, kv_heads, width] views of every layout: slots index as (block, offset).
        self.slot_views = [cache.movedim(block_token_dim + 1, 2) for cache in kv_caches]
        self.check_layer = min(check_layer, len(kv_caches) - 1)
        self.begin_layers = begin_layers  # the connector's per-layer hooks, told which layer comes next

    @torch.inference_mode()
    def prefill(self, plan: BlendPlan, token_ids: np.ndarray, num_computed: int,
                block_tables: list[np.ndarray]) -> torch.Tensor:
        """Blend and prefill positions ``num_computed..len(token_ids) - 1``; returns the last one's final hidden
        state ``[1, hidden]``. ``block_tables`` holds the request's blocks per group."""
        num_tokens, device = len(token_ids), self.kv_caches[0].device
        placed = self.place_chunks(plan, num_computed, block_tables)
        positions = np.arange(num_computed, num_tokens)
        x = self.model.embed(torch.from_numpy(token_ids[num_computed:]).to(device))
        x = self._layers(x, positions, block_tables, range(self.check_layer + 1))
        deviation = self._deviation(placed)
        keep = recompute_positions(num_computed, num_tokens, placed.positions, deviation, plan.recompute_ratio)
        x = x[torch.from_numpy(keep - num_computed).to(device)]
        x = self._layers(x, keep, block_tables, range(self.check_layer + 1, len(self.kv_caches)))
        return self.model.final_norm(x[-1:])

    def _layers(self, x: torch.Tensor, positions: np.ndarray, block_tables: list[np.ndarray],
                layer_ids: range) -> torch.Tensor:
        if not layer_ids:
            return x
        if self.begin_layers is not None:
            self.begin_layers(layer_ids.start)
        metadata = self._metadata(position_runs(positions), block_tables)
        return self.model.forward_layers(x, torch.from_numpy(positions).to(x.device), self.kv_caches, metadata,
                                         layer_ids)

    def _metadata(self, runs: list[tuple[int, int]], block_tables: list[np.ndarray]) -> StepAttentionMetadata:
        """Each run as one request over the same block table: its queries are the last of a context ending there."""
        query_lens = [end - start for start, end in runs]
        seq_lens = [end for _, end in runs]
        num_blocks = -(-max(seq_lens) // self.block_size)
        device = self.kv_caches[0].device
        common = [build_common_metadata(query_lens, seq_lens, np.repeat(table[None, :num_blocks], len(runs), axis=0),
                                        self.block_size, device) for table in block_tables]
        return build_step_metadata(self.backend, common, self.layer_groups)

    # -- placement ---------------------------------------------------------------------------------
    def place_chunks(self, plan: BlendPlan, num_computed: int, block_tables: list[np.ndarray]) -> _Placed:
        """Copy each chunk's cached K/V to its positions in every layer, keys rotated by the shift."""
        targets, sources, shifts = self._reused(plan, num_computed)
        shifts_t = torch.from_numpy(shifts).to(self.kv_caches[0].device)
        placed = None
        for layer, group in enumerate(self.layer_groups):
            dst = self._table_slots(targets, block_tables[group])
            keys, values = self._move(layer, sources[group], dst, shifts_t)
            if layer == self.check_layer:
                placed = _Placed(targets, dst, keys, values)
        return placed

    def _reused(self, plan: BlendPlan, num_computed: int) -> tuple[np.ndarray, list[np.ndarray], np.ndarray]:
        """Positions to reuse (past the hit, cached in every group): targets, per-group source slots, shifts."""
        targets, source_positions, chunk_index = [], [], []
        for c, chunk in enumerate(plan.chunks):
            offsets = np.arange(chunk.num_tokens)
            keep = chunk.start + offsets >= num_computed
            targets.append(chunk.start + offsets[keep])
            source_positions.append(chunk.source_start + offsets[keep])
            chunk_index.append(np.full(int(keep.sum()), c))
        target, source, index = (np.concatenate(a) for a in (targets, source_positions, chunk_index))
        blocks = [self._source_blocks(plan, g, source, index) for g in range(len(plan.chunks[0].source_block_ids))]
        cached = np.logical_and.reduce([b != NOT_CACHED for b in blocks])
        offset = source[cached] % self.block_size
        slots = [b[cached] * self.block_size + offset for b in blocks]
        return target[cached], slots, (target - source)[cached]

    def _source_blocks(self, plan: BlendPlan, group: int, source: np.ndarray, index: np.ndarray) -> np.ndarray:
        """The cached block of each source position in ``group`` (NOT_CACHED past a chunk's cached blocks)."""
        out = np.full(len(source), NOT_CACHED, dtype=np.int64)
        for c, chunk in enumerate(plan.chunks):
            ids = np.asarray(chunk.source_block_ids[group] + [NOT_CACHED], dtype=np.int64)
            mine = index == c
            out[mine] = ids[np.minimum(source[mine] // self.block_size, len(ids) - 1)]
        return out

    def _table_slots(self, positions: np.ndarray, table: np.ndarray) -> np.ndarray:
        return table[positions // self.block_size].astype(np.int64) * self.block_size + positions % self.block_size

    def _move(self, layer: int, src: np.ndarray, dst: np.ndarray,
              shifts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Copy slots ``src`` to ``dst`` in one layer, keys rotated by ``shifts``; returns the moved K/V (float32)."""
        view, size = self.slot_views[layer], self.block_size
        src_t, dst_t = torch.from_numpy(src).to(view.device), torch.from_numpy(dst).to(view.device)
        rows = view[:, src_t // size, src_t % size]  # [2, m, kv_heads, width]
        head_dim = self.model.config.head_dim
        keys = read_rows(rows[0], head_dim).float()
        if len(src):
            cos, sin = self.model.rotary(layer)(shifts, int(shifts.max()) + 1)
            keys = apply_rotary(keys, cos.float(), sin.float())
        view[0, dst_t // size, dst_t % size] = cache_rows(keys, view.dtype)
        view[1, dst_t // size, dst_t % size] = rows[1]
        return keys, read_rows(rows[1], head_dim).float()

    def _deviation(self, placed: _Placed) -> np.ndarray:
        """How far the check layer's computed K/V are from the placed ones, per position (squared L2)."""
        view, size = self.slot_views[self.check_layer], self.block_size
        slots = torch.from_numpy(placed.slots).to(view.device)
        rows = view[:, slots // size, slots % size]
        head_dim = self.model.config.head_dim
        keys, values = read_rows(rows[0], head_dim).float(), read_rows(rows[1], head_dim).float()
        deviation = (keys - placed.keys).square().sum(dim=(1, 2)) + (values - placed.values).square().sum(dim=(1, 2))
        return deviation.double().cpu().numpy()
