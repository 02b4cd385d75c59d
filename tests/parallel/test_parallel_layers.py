"""Sharding by the weight loaders, micro-batch splits and the rendezvous, without starting any worker."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from jido.core.outputs import SchedulerOutput
from jido.layers.parallel_linear import QKVParallelLinear, RowParallelLinear, VocabParallelEmbedding, narrow
from jido.layers.quantized_linear import QuantizedCodes
from jido.parallel.group import ParallelGroup
from jido.parallel.state import ModelParallel, RendezvousError, building_for, init_model_parallel, layer_range
from jido.runner.pipeline_runner import split_micro_batches


def rank_of_two(rank: int) -> ModelParallel:
    """Rank ``rank`` of a TP group of two, as layers see it while built (loading needs no collective)."""
    tp = ParallelGroup([0, 1], rank, None)
    return ModelParallel(rank, 2, tp, ParallelGroup([rank], rank, None), ParallelGroup([rank], rank, None))


@pytest.mark.parametrize("rank", [0, 1])
def test_qkv_keeps_its_query_heads_and_replicates_a_single_kv_head(rank):
    head_dim, hidden = 2, 3
    q, k, v = torch.randn(4 * head_dim, hidden), torch.randn(head_dim, hidden), torch.randn(head_dim, hidden)
    with building_for(rank_of_two(rank)):
        layer = QKVParallelLinear(hidden, head_dim, num_heads=4, num_kv_heads=1)
    for name, tensor in {"q_proj": q, "k_proj": k, "v_proj": v}.items():
        layer.weight.weight_loader(layer.weight, tensor, name)
    mine = q[rank * 2 * head_dim:(rank + 1) * 2 * head_dim]
    torch.testing.assert_close(layer.weight.data, torch.cat([mine, k, v]), atol=0, rtol=0)
    assert (layer.num_heads, layer.num_kv_heads) == (2, 1)


def test_qkv_splits_kv_heads_when_there_are_enough():
    with building_for(rank_of_two(1)):
        layer = QKVParallelLinear(3, 2, num_heads=4, num_kv_heads=2)
    k = torch.arange(12.0).view(4, 3)  # two KV heads of two rows
    layer.weight.weight_loader(layer.weight, k, "k_proj")
    torch.testing.assert_close(layer.weight.data[4:6], k[2:4], atol=0, rtol=0)


def test_row_parallel_takes_its_input_columns_and_keeps_the_whole_bias():
    with building_for(rank_of_two(1)):
        layer = RowParallelLinear(4, 2, bias=True)
    weight, bias = torch.arange(8.0).view(2, 4), torch.tensor([1.0, 2.0])
    layer.weight.weight_loader(layer.weight, weight)
    layer.bias.weight_loader(layer.bias, bias)
    torch.testing.assert_close(layer.weight.data, weight[:, 2:], atol=0, rtol=0)
    torch.testing.assert_close(layer.bias.data, bias, atol=0, rtol=0)


def test_a_checkpoint_tensor_of_the_wrong_shape_names_the_unsharded_one():
    with building_for(rank_of_two(0)):
        layer = QKVParallelLinear(3, 2, num_heads=4, num_kv_heads=2)
    with pytest.raises(ValueError, match=r"expected shape \(4, 3\), got \(3, 3\)"):
        layer.weight.weight_loader(layer.weight, torch.zeros(3, 3), "k_proj")


class _Alone(ParallelGroup):
    """Rank 1 of two whose sum leaves its own part as it is: what this rank contributes, seen alone."""

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        return x


def test_vocab_rows_outside_the_rank_embed_to_zero():
    with building_for(rank_of_two(1)):
        table = VocabParallelEmbedding(4, 2)
    table.weight_loader(table.weight, torch.arange(8.0).view(4, 2))
    table.tp = _Alone([0, 1], 1, None)
    out = table(torch.tensor([0, 3]))
    torch.testing.assert_close(out, torch.tensor([[0.0, 0.0], [6.0, 7.0]]), atol=0, rtol=0)


def test_gguf_codes_split_by_whole_groups_and_refuse_a_cut_group():
    codes = QuantizedCodes(torch.arange(32, dtype=torch.int8).view(2, 16), torch.arange(4.0).view(2, 2), None, 8,
                           "Q8_0")
    half = narrow(codes, 1, 8, 8)
    assert torch.equal(half.q, codes.q[:, 8:]) and torch.equal(half.scales, codes.scales[:, 1:])
    with pytest.raises(ValueError, match=r"input columns \[4, 8\) cut through Q8_0's groups of 8"):
        narrow(codes, 1, 4, 4)


def test_layers_split_evenly_with_the_remainder_on_the_first_stages():
    stages = [layer_range(11, ParallelGroup([0, 1, 2], rank, None)) for rank in range(3)]
    assert stages == [(0, 4), (4, 8), (8, 11)]
    with pytest.raises(ValueError, match="pipeline_parallel_size=3 needs at least as many layers; the model has 2"):
        layer_range(2, ParallelGroup([0, 1, 2], 0, None))


def test_micro_batches_balance_tokens_without_splitting_a_request():
    sched = SchedulerOutput([], [], {"a": 1, "b": 1, "c": 1, "d": 1}, 4)
    assert [list(m.num_scheduled_tokens) for m in split_micro_batches(sched, 2)] == [["a", "b"], ["c", "d"]]
    sched = dataclasses.replace(sched, num_scheduled_tokens={"long": 30, "a": 1, "b": 1}, total_num_scheduled_tokens=32)
    parts = split_micro_batches(sched, 3)
    assert [m.num_scheduled_tokens for m in parts] == [{"long": 30}, {"a": 1}, {"b": 1}]
    assert [m.total_num_scheduled_tokens for m in parts] == [30, 1, 1]
    assert len(split_micro_batches(dataclasses.replace(sched, num_scheduled_tokens={"x": 5},
                                                       total_num_scheduled_tokens=5), 4)) == 1


def test_a_rendezvous_nobody_answers_fails_naming_the_rank_and_address():
    # Rank 1 waits for rank 0's store at a port where nothing listens.
    with pytest.raises(RendezvousError, match=r"rank 1 of 2 could not join the process group at "
                                              r"tcp://127\.0\.0\.1:9 \(gloo\) within 1 s"):
        init_model_parallel(1, 2, 1, False, "tcp://127.0.0.1:9", 1.0, torch.device("cpu"))
