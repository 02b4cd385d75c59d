"""Decode steps replayed from CUDA graphs: one graph per padded batch size, captured once (vLLM's cudagraphs).

On a GPU an eager decode step of a small model is bound by the CPU launching its kernels: a step of a Gemma 3
270M-shaped model launched hundreds of kernels, and the host's time launching them far exceeded the GPU's running
them (benchmarks/results/gpu_session-2026-12-04-h200.md). A graph replays all of a step's kernels with one launch.

A graph replays the kernels it recorded on the tensors it recorded, so every input lives in a buffer owned
here: token ids, positions, the rows sampled, and per KV cache group the context lengths, block tables and slots.
A step, prepared on the host, writes its values into the first ``n`` rows of pinned host copies of those buffers,
sends them in two asynchronous copies and replays the graph of the smallest captured size ``>= n``; the rows
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
from jido.layers.rms_norm import for_cuda_graphs
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


class StagedBuffer:
    """A device buffer (``target``) fed from a host buffer of its shape (``host``, pinned on CUDA), by one asynchronous
    copy of a prefix.

    Each pageable copy to a GPU makes the host wait for it, and a step's inputs were ~20 copies; a graph's inputs
    live here instead, written on the host and sent in one copy a buffer. ``host`` may be written again once the
    last copy out of it has run (``wait``): a step reads its tokens back before the next one writes, so it has.
    """

    def __init__(self, dtype: torch.dtype, numel: int, device: torch.device) -> None:
        self.target = torch.zeros(numel, dtype=dtype, device=device)
        self.host = torch.zeros(numel, dtype=dtype, device="cpu", pin_memory=device.type == "cuda")
        self.copied: torch.cuda.Event | None = None

    def wait(self) -> None:
        if self.copied is not None:
            self.copied.synchronize()

    def send(self, count: int) -> None:
        """Copy the first ``count`` elements of ``host`` to ``target``."""
        self.target[:count].copy_(self.host[:count], non_blocking=True)
        if self.target.is_cuda:
            self.copied = torch.cuda.Event()
            self.copied.record()


class DecodeGraphs:
    """Decode steps of up to ``max_batch`` requests (one token each) run by graph replay."""

    def __init__(self, model: torch.nn.Module, backend: AttentionBackend, kv_caches: list[torch.Tensor],
                 layer_groups: list[int], num_groups: int, max_batch: int, max_model_len: int, block_size: int,
                 device: torch.device) -> None:
        self.model, self.backend, self.kv_caches, self.layer_groups = model, backend, kv_caches, layer_groups
        self.max_model_len, self.block_size = max_model_len, block_size
        self.sizes = capture_sizes(max_batch)
        self.max_batch, self.num_groups, self.max_blocks = max_batch, num_groups, -(-max_model_len // block_size)
        # int64: token ids, positions, the rows sampled, then each group's slots; int32: context lengths, then the
        # block tables as [request][group][block], so that a step's rows of every group are one prefix to send.
        self.words = StagedBuffer(torch.int64, (3 + num_groups) * max_batch, device)
        self.ints = StagedBuffer(torch.int32, max_batch * (1 + num_groups * self.max_blocks), device)
        self.query_start_loc = torch.arange(max_batch + 1, dtype=torch.int32, device=device)  # one query a request
        self.replays: dict[int, Forward] = {}
        self.forwards: dict[int, Forward] = {}

    def _views(self, words: torch.Tensor, ints: torch.Tensor) -> dict[str, torch.Tensor]:
        """The named inputs inside a pair of buffers (the device's or the host's)."""
        b = self.max_batch
        return {"input_ids": words[:b], "positions": words[b:2 * b], "logits_indices": words[2 * b:3 * b],
                "slot_mapping": words[3 * b:].view(self.num_groups, b), "seq_lens": ints[:b],
                "block_tables": ints[b:].view(b, self.num_groups, self.max_blocks)}

    def capture(self, capture: Capture | None = None) -> None:
        """Record one graph per size, after an eager run of it (kernels compiled, per-metadata tables built)."""
        capture = capture or CudaGraphCapture()
        start = time.perf_counter()
        on_device = self._views(self.words.target, self.ints.target)
        on_device["seq_lens"].fill_(1)
        on_device["slot_mapping"].fill_(-1)
        for size in reversed(self.sizes):
            metadata = self._metadata(size, on_device)
            ids, positions = on_device["input_ids"][:size], on_device["positions"][:size]

            def forward(ids=ids, positions=positions, metadata=metadata) -> torch.Tensor:
                return self.model(ids, positions, self.kv_caches, metadata)

            with for_cuda_graphs():  # the layers' one-kernel ops, compiled by the eager run
                forward()
                self.replays[size] = capture(forward)
            # A graph keeps the addresses of the tensors it read, not the objects: the metadata's tensors (the
            # triton backend's query tiles, built in the eager run) must live as long as the graph, with forward.
            self.forwards[size] = forward
        logger.info("captured %d CUDA graphs for decode batches of %s requests in %.1f s", len(self.sizes),
                    ", ".join(map(str, self.sizes)), time.perf_counter() - start)

    def takes(self, query_lens: list[int]) -> bool:
        """Whether a graph runs a step of these query lengths: every request decodes one token, no more than the
        largest size (contexts never outgrow ``max_model_len``, which the buffers are sized for)."""
        return 0 < len(query_lens) <= self.sizes[-1] and all(n == 1 for n in query_lens)

    def run(self, inputs: ModelInputs) -> tuple[torch.Tensor, torch.Tensor]:
        """The step's hidden states ``[n, hidden]`` and its ``logits_indices`` on the device, from ``inputs`` prepared
        on the host (``takes`` their query lengths): their values sent in two copies, then a replay."""
        n, sampled = inputs.input_ids.shape[0], inputs.logits_indices.shape[0]
        size = next(s for s in self.sizes if s >= n)
        self.words.wait()
        self.ints.wait()
        host = self._views(self.words.host, self.ints.host)
        host["input_ids"][:n] = inputs.input_ids
        host["positions"][:n] = inputs.positions
        host["logits_indices"][:sampled] = inputs.logits_indices
        host["seq_lens"][:n] = inputs.group_metadata[0].seq_lens
        host["seq_lens"][n:size] = 1  # padding: a context of one token, its own
        for group, common in enumerate(inputs.group_metadata):
            host["block_tables"][:n, group, :common.block_tables.shape[1]] = common.block_tables
            host["slot_mapping"][group, :n] = common.slot_mapping
            host["slot_mapping"][group, n:size] = -1  # padding writes no KV
        self.words.send(self.words.host.numel())
        self.ints.send(self.max_batch + size * self.num_groups * self.max_blocks)
        on_device = self._views(self.words.target, self.ints.target)
        return self.replays[size]()[:n], on_device["logits_indices"][:sampled]

    def _metadata(self, size: int, buffers: dict[str, torch.Tensor]) -> StepAttentionMetadata:
        """The step metadata every replay of ``size`` reads: views of the buffers, contexts as long as they may be."""
        groups = [AttentionMetadata(query_start_loc=self.query_start_loc[:size + 1], seq_lens=buffers["seq_lens"][:size],
                                    block_tables=buffers["block_tables"][:size, group],
                                    slot_mapping=buffers["slot_mapping"][group, :size], block_size=self.block_size,
                                    query_lens_list=[1] * size, seq_lens_list=[self.max_model_len] * size)
                  for group in range(self.num_groups)]
        return build_step_metadata(self.backend, groups, self.layer_groups)
