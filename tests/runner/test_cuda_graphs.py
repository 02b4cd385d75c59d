"""Decode graphs: steps copied into the captured buffers and padded to a captured size give the eager steps' results.

On a GPU the graphs are real CUDA graphs. Without one, a "replay" calls the recorded forward again through a weak
reference (a graph keeps tensor addresses, not Python objects, so what it reads must be held by DecodeGraphs),
which still checks what the graphs rely on: every input reaches the model through the buffers, padding rows write
no KV and leave the real rows alone, and the metadata captured for contexts of max_model_len serves shorter ones.
There the triton backend runs under Triton's interpreter (tests/conftest.py sets TRITON_INTERPRET=1).
"""
from __future__ import annotations

import os
import sys
import weakref
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("triton")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("no CUDA, and triton runs CPU tensors only under TRITON_INTERPRET=1", allow_module_level=True)

sys.path.insert(0, str(Path(__file__).parents[1] / "models"))
from tiny_hf_models import tiny_models  # noqa: E402
from tiny_paged_batch import TinyPagedRunner  # noqa: E402

from jido.attention.backend import build_common_metadata  # noqa: E402
from jido.attention.registry import get_attention_backend  # noqa: E402
from jido.runner.cuda_graphs import CudaGraphCapture, DecodeGraphs, capture_sizes  # noqa: E402
from jido.runner.input_batch import ModelInputs  # noqa: E402

MAX_MODEL_LEN = 64


@pytest.fixture(autouse=True)
def _on_the_device():
    with torch.device(DEVICE):
        yield


def _capture_holding_nothing(forward):
    """Record ``forward`` as a graph would: keeping no reference to it or to what it reads."""
    recorded = weakref.ref(forward)
    return lambda: recorded()()


class GraphRunner(TinyPagedRunner):
    """TinyPagedRunner whose one-token steps go through DecodeGraphs (prefills stay eager)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__(model)
        self.graphs = DecodeGraphs(model, self.backend, self.kv_caches, [0] * model.num_layers, num_groups=1,
                                   max_batch=8, max_model_len=MAX_MODEL_LEN, block_size=self.block_size,
                                   device=torch.device(DEVICE))
        with torch.no_grad():
            self.graphs.capture(CudaGraphCapture() if DEVICE == "cuda" else _capture_holding_nothing)

    def step(self, new_tokens: dict[str, list[int]]) -> dict[str, torch.Tensor]:
        if any(len(tokens) != 1 for tokens in new_tokens.values()):
            return super().step(new_tokens)
        req_ids = list(new_tokens)
        positions = [self.num_computed[r] for r in req_ids]
        for req_id, position in zip(req_ids, positions):
            self._grow_table(req_id, position + 1)
            self.num_computed[req_id] = position + 1
        width = max(len(self.block_tables[r]) for r in req_ids)
        table = np.array([self.block_tables[r] + [0] * (width - len(self.block_tables[r])) for r in req_ids],
                         dtype=np.int32)
        # Prepared on the host, as the runner prepares a step for the graphs; the rows sampled reversed, so that
        # the indices returned are the ones given.
        common = build_common_metadata([1] * len(req_ids), [p + 1 for p in positions], table, self.block_size, "cpu")
        rows = torch.arange(len(req_ids) - 1, -1, -1, device="cpu")
        inputs = ModelInputs(torch.tensor([t[0] for t in new_tokens.values()], device="cpu"),
                             torch.tensor(positions, device="cpu"), [common], rows, req_ids,
                             np.arange(len(req_ids)), [[]] * len(req_ids))
        assert self.graphs.takes([1] * len(req_ids))
        with torch.no_grad():
            hidden, logits_indices = self.graphs.run(inputs)
            assert logits_indices.device.type == DEVICE and logits_indices.tolist() == rows.tolist()
            logits = self.model.compute_logits(hidden[logits_indices]).flip(0)
        return dict(zip(req_ids, logits.split(1)))


def test_capture_sizes_are_vllms_up_to_the_largest_batch():
    assert capture_sizes(1) == [1]
    assert capture_sizes(8) == [1, 2, 4, 8]
    assert capture_sizes(20) == [1, 2, 4, 8, 16, 20]


def test_decode_steps_through_the_graph_buffers_equal_eager_steps_at_every_padded_size():
    _, reference = tiny_models("gemma3")  # MQA, sliding window 4, soft-capped logits
    model = type(reference)(reference.config, get_attention_backend("triton")).eval()
    model.load_state_dict(reference.state_dict())
    eager, graphs = TinyPagedRunner(model), GraphRunner(model)
    gen = torch.Generator().manual_seed(0)
    prompts = {f"r{i}": torch.randint(3, 128, (5 + 3 * i,), generator=gen, device="cpu").tolist() for i in range(6)}
    for runner in (eager, graphs):
        runner.step(prompts)
    # Decode steps of 1, 3 (padded to 4), 5 and 6 (padded to 8) requests, with contexts growing past a block.
    for step, count in enumerate([1, 3, 5, 6, 6, 3]):
        tokens = {f"r{i}": [int(torch.randint(3, 128, (1,), generator=gen, device="cpu"))] for i in range(count)}
        expected, ours = eager.step(tokens), graphs.step(tokens)
        for req_id in tokens:
            torch.testing.assert_close(ours[req_id], expected[req_id], atol=1e-5, rtol=1e-5,
                                       msg=lambda m: f"step {step}, {req_id}: {m}")
    # Padding wrote no KV: both caches hold the same blocks (the runners hand out blocks in the same order).
    for ours, expected in zip(graphs.kv_caches, eager.kv_caches):
        torch.testing.assert_close(ours, expected, atol=1e-5, rtol=1e-5)


def test_a_step_with_a_prefill_or_more_requests_than_captured_is_left_to_eager():
    _, reference = tiny_models("gemma3")
    model = type(reference)(reference.config, get_attention_backend("triton")).eval()
    model.load_state_dict(reference.state_dict())
    graphs = GraphRunner(model).graphs
    assert graphs.takes([1] * 8) and graphs.takes([1])
    assert not graphs.takes([1] * 9)
    assert not graphs.takes([1, 2])
    assert not graphs.takes([])
