"""Decode steps replayed from CUDA graphs: one graph per padded batch size, captured once (vLLM's cudagraphs).

On a GPU an eager decode step of a small model is bound by the CPU launching its kernels: a step of a Gemma 3
270M-shaped model launched ~455 kernels, 12.2 ms of host time against 1.3 ms on the GPU (H200, triton backend,
benchmarks/results/cuda-2026-12-04-h200.md). A graph replays all of a step's kernels with one launch.

A graph replays the kernels it recorded on the tensors it recorded, so every input lives in a buffer owned
here: token ids, positions, and per KV cache group the context lengths, block tables and slots. A step copies
its values into the first ``n`` rows and replays the graph of the smallest captured size ``>= n``; the rows
past ``n`` are padding, a one-token context whose KV write is skipped (slot -1), and their outputs are dropped.
The attention backend must take everything it decides on the host from the captured metadata (see
:attr:`~jido.attention.backend.AttentionBackend.supports_cuda_graphs`): the graphs are captured as if every
context were ``max_model_len`` long, so the triton backend's split count covers the longest.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable

import torch

from jido.attention.backend import AttentionBackend, AttentionMetadata, StepAttentionMetadata, build_step_metadata
from jido.runner.input_batch import ModelInputs

logger = logging.getLogger("jido")

Forward = Callable[[], torch.Tensor]
# Records ``forward`` once and returns what replays it (its output tensor, refreshed in place).
Capture = Callable[[Forward], Forward]


def capture_sizes(max_batch: int) -> list[int]:
    """vLLM's batch sizes: 1, 2, 4, then every multiple of 8, up to and including ``max_batch``."""
    sizes = [s for s in (1, 2, 4) if s < max_batch] + list(range(8, max_batch, 8))
    return sizes + [max_batch]


class CudaGraphCapture:
    """Captures with ``torch.cuda.graph``, every graph in one memory pool (captured largest first, so the
    smaller ones fit in what the largest took)."""

    def __init__(self) -> None:
        self.pool = None

    def __call__(self, forward: Forward) -> Forward:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            out = forward()
        self.pool = graph.pool()

        def replay() -> torch.Tensor:
            graph.replay()
            return out

        return replay


class DecodeGraphs:
    """Decode steps of up to ``max_batch`` requests (one token each) run by graph replay."""

    def __init__(self, model: torch.nn.Module, backend: AttentionBackend, kv_caches: list[torch.Tensor],
                 layer_groups: list[int], num_groups: int, max_batch: int, max_model_len: int, block_size: int,
                 device: torch.device) -> None:
        self.model, self.backend, self.kv_caches, self.layer_groups = model, backend, kv_caches, layer_groups
        self.max_model_len, self.block_size = max_model_len, block_size
        self.sizes = capture_sizes(max_batch)
        max_blocks = -(-max_model_len // block_size)
        with torch.device(device):
            self.input_ids = torch.zeros(max_batch, dtype=torch.int64)
            self.positions = torch.zeros(max_batch, dtype=torch.int64)
            self.query_start_loc = torch.arange(max_batch + 1, dtype=torch.int32)  # one query per request
            self.seq_lens = torch.ones(max_batch, dtype=torch.int32)
            self.block_tables = [torch.zeros(max_batch, max_blocks, dtype=torch.int32) for _ in range(num_groups)]
            self.slot_mapping = [torch.full((max_batch,), -1, dtype=torch.int64) for _ in range(num_groups)]
        self.replays: dict[int, Forward] = {}
        self.forwards: dict[int, Forward] = {}

    def capture(self, capture: Capture | None = None) -> None:
        """Record one graph per size, after an eager run of it (kernels compiled, per-metadata tables built)."""
        capture = capture or CudaGraphCapture()
        start = time.perf_counter()
        for size in reversed(self.sizes):
            metadata = self._metadata(size)
            ids, positions = self.input_ids[:size], self.positions[:size]

            def forward(ids=ids, positions=positions, metadata=metadata) -> torch.Tensor:
                return self.model(ids, positions, self.kv_caches, metadata)

            forward()
            self.replays[size] = capture(forward)
            # A graph keeps the addresses of the tensors it read, not the objects: the metadata's tensors (the
            # triton backend's query tiles, built in the eager run) must live as long as the graph, with forward.
            self.forwards[size] = forward
        logger.info("captured %d CUDA graphs for decode batches of %s requests in %.1f s", len(self.sizes),
                    ", ".join(map(str, self.sizes)), time.perf_counter() - start)

    def fits(self, inputs: ModelInputs) -> bool:
        """Whether this step is one a graph runs: every request decodes one token, no more than the largest size."""
        first = inputs.group_metadata[0]
        return (inputs.input_ids.shape[0] <= self.sizes[-1] and first.is_decode_only
                and len(inputs.group_metadata) == len(self.block_tables)
                and all(m.block_tables.shape[1] <= self.block_tables[0].shape[1] for m in inputs.group_metadata))

    def run(self, inputs: ModelInputs) -> torch.Tensor:
        """The step's hidden states ``[n, hidden]``: its values copied into the buffers, then a replay."""
        n = inputs.input_ids.shape[0]
        size = next(s for s in self.sizes if s >= n)
        self.input_ids[:n].copy_(inputs.input_ids)
        self.positions[:n].copy_(inputs.positions)
        self.seq_lens[:n].copy_(inputs.group_metadata[0].seq_lens)
        self.seq_lens[n:size].fill_(1)  # padding: a context of one token, its own
        for group, common in enumerate(inputs.group_metadata):
            self.block_tables[group][:n, :common.block_tables.shape[1]].copy_(common.block_tables)
            self.slot_mapping[group][:n].copy_(common.slot_mapping)
            self.slot_mapping[group][n:size].fill_(-1)  # padding writes no KV
        return self.replays[size]()[:n]

    def _metadata(self, size: int) -> StepAttentionMetadata:
        """The step metadata every replay of ``size`` reads: views of the buffers, contexts as long as they may be."""
        groups = [AttentionMetadata(query_start_loc=self.query_start_loc[:size + 1], seq_lens=self.seq_lens[:size],
                                    block_tables=tables[:size], slot_mapping=slots[:size], block_size=self.block_size,
                                    query_lens_list=[1] * size, seq_lens_list=[self.max_model_len] * size)
                  for tables, slots in zip(self.block_tables, self.slot_mapping)]
        return build_step_metadata(self.backend, groups, self.layer_groups)
