"""Under batch_invariant a linear layer gives a row the same bits in a step of any number of rows: quantized layers on
the int8 panels (one row included), dense ones on oneDNN's packed matmul (one row as two)."""
from __future__ import annotations

import pytest
import torch

from jido.layers import int8_dot, quant_kernels
from jido.layers.linear import Linear
from jido.layers.parameter import default_device_and_dtype
from jido.layers.quantization import get_quantization_config
from jido.layers.quantized_linear import QuantizedCodes
from jido.layers.weight_plan import (BF16_COPY, CODES, EXTRAS, FIVE_BITS, PANELS, LayoutCosts, WeightPlan, choose_extras,
                                     format_table)

needs_int8_dot = pytest.mark.skipif(int8_dot.load_int8_dot_ops() is None, reason="no int8 dot kernel for this CPU")
STEP_SIZES = [1, 2, 3, 5, 8, 9, 16, 17, 31, 40, 64, 100]


def assert_rows_invariant(layer: torch.nn.Module, num_cols: int, seed: int) -> None:
    """Every row of every step size gets what it gets in a step of all 100 rows, at offsets 0 and 7."""
    x = torch.randn(107, num_cols, generator=torch.Generator().manual_seed(seed))
    whole = layer(x)
    for rows in STEP_SIZES:
        for first in (0, 7):
            step = x[first:first + rows].contiguous()
            assert torch.equal(layer(step), whole[first:first + rows]), (rows, first)


def q5_layer(batch_invariant: bool, weights_memory_extras: frozenset[str] | None = None) -> Linear:
    """A Linear on Q5_0 codes (the codes five-bit rows serve at one row) under ``gguf``."""
    gen = torch.Generator().manual_seed(5)
    codes = QuantizedCodes(torch.randint(-16, 16, (72, 96), generator=gen, dtype=torch.int8),
                           torch.rand(72, 3, generator=gen), None, 32, "Q5_0")
    config = get_quantization_config("gguf", batch_invariant=batch_invariant)
    if weights_memory_extras is not None:
        config.plan.settle(weights_memory_extras, "test")
    with default_device_and_dtype(torch.device("cpu"), torch.float32):
        layer = Linear(96, 72, quant_config=config)
    layer.weight.weight_loader(layer.weight, codes, None)
    layer.linear_method.process_weights_after_loading(layer)
    return layer


@needs_int8_dot
@pytest.mark.parametrize("bits, with_mins, per_token", [(8, False, False), (8, True, False), (4, True, False),
                                                         (8, False, True)])
def test_panels_give_each_row_the_bits_of_any_step_one_row_included(bits, with_mins, per_token) -> None:
    # The panels keep each output's sums in one order at every number of rows; the rows kernel (one-row decode) sums
    # in another, which is why a batch-invariant plan runs one row on the panels too.
    gen = torch.Generator().manual_seed(bits)
    low, high = (-128, 128) if bits == 8 else (0, 16)
    q = torch.randint(low, high, (40, 640), generator=gen, dtype=torch.int8)
    groups = 1 if per_token else 20
    mins = torch.rand(40, groups, generator=gen) if with_mins else None
    w = quant_kernels.pack(q, torch.rand(40, groups, generator=gen) + 0.1, mins, 640 if per_token else 32, bits)
    packed = int8_dot.pack_panels(w, per_token)
    x = torch.randn(107, 640, generator=gen)
    whole = int8_dot.panel_linear(x, packed)
    for rows in STEP_SIZES:
        for first in (0, 7):
            step = x[first:first + rows].contiguous()
            assert torch.equal(int8_dot.panel_linear(step, packed), whole[first:first + rows]), (rows, first)
            called = int8_dot.int8_dot_linear(step, w, per_token=per_token, panels=True)
            assert torch.equal(called, whole[first:first + rows]), (rows, first)


@needs_int8_dot
@pytest.mark.parametrize("held", [None, frozenset(), frozenset({PANELS})], ids=["unsettled", "lean", "panels"])
def test_a_batch_invariant_quantized_layer_runs_every_step_size_on_the_panels(held) -> None:
    layer = q5_layer(batch_invariant=True, weights_memory_extras=held)
    assert layer.layouts.five_bits is None  # five-bit rows serve one-row steps only, in the rows kernel's order
    assert (layer.layouts.panels is not None) == (held is None or PANELS in held)
    assert_rows_invariant(layer, 96, seed=1)


@needs_int8_dot
def test_without_batch_invariance_one_row_runs_the_five_bit_rows(monkeypatch) -> None:
    layer = q5_layer(batch_invariant=False)
    calls = []
    five_bit_linear = int8_dot.five_bit_linear
    monkeypatch.setattr(int8_dot, "five_bit_linear", lambda *a, **k: calls.append(1) or five_bit_linear(*a, **k))
    layer(torch.randn(1, 96))
    assert calls == [1]


def test_a_batch_invariant_quantized_layer_needs_the_int8_kernels(monkeypatch) -> None:
    monkeypatch.setattr(int8_dot, "runs", lambda w: False)
    with pytest.raises(RuntimeError, match="batch_invariant runs quantized layers on jido's int8 panel kernels"):
        q5_layer(batch_invariant=True)


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="no oneDNN")
@pytest.mark.parametrize("out_features, in_features", [(96, 64), (640, 2048), (4096, 640)])
def test_a_batch_invariant_dense_layer_gives_each_row_the_bits_of_any_step(out_features, in_features) -> None:
    # NOTE: this checks oneDNN's float32 matmul on the CPU at hand: steps of 2+ rows must sum each row alike. One row
    # runs as two (a one-row step sums in another order).
    config = get_quantization_config("none", batch_invariant=True)
    with default_device_and_dtype(torch.device("cpu"), torch.float32):
        layer = Linear(in_features, out_features, quant_config=config)
    layer.weight.weight_loader(layer.weight, torch.randn(out_features, in_features,
                                                         generator=torch.Generator().manual_seed(in_features)), None)
    layer.linear_method.process_weights_after_loading(layer)
    assert layer.weight.is_mkldnn
    assert_rows_invariant(layer, in_features, seed=out_features)


def test_a_batch_invariant_dense_layer_refuses_a_weight_onednn_does_not_pack(monkeypatch) -> None:
    from jido.layers import quantization

    monkeypatch.setattr(quantization, "packable", lambda weight: False)
    with default_device_and_dtype(torch.device("cpu"), torch.float32):
        layer = Linear(64, 32, quant_config=get_quantization_config("none", batch_invariant=True))
    layer.weight.weight_loader(layer.weight, torch.randn(32, 64), None)
    with pytest.raises(ValueError, match="batch_invariant multiplies dense weights on oneDNN's packed matmul"):
        layer.linear_method.process_weights_after_loading(layer)


def test_a_batch_invariant_plan_holds_and_admits_the_panels_alone() -> None:
    plan = WeightPlan(batch_invariant=True)
    assert plan.extras == plan.allowed == frozenset({PANELS})
    costs = LayoutCosts(100, {FIVE_BITS: 10, PANELS: 50, BF16_COPY: 20})
    extras, _ = choose_extras("auto", costs.only(plan.allowed), None)
    assert extras == frozenset({PANELS})
    with pytest.raises(ValueError, match=r"a batch-invariant plan holds \['panels'\] only, not \['bf16_copy'\]"):
        plan.settle(frozenset({PANELS, BF16_COPY}), "test")
    plan.settle(extras, "weights_memory=auto")
    assert plan.reason == "weights_memory=auto; batch_invariant: every step on the panels"
    assert WeightPlan().extras == frozenset(EXTRAS)
    table = format_table({CODES: (2**20, 3), PANELS: (2**21, 3)}, batch_invariant=True).splitlines()
    assert table[1:3] == ["codes               1.0       3  every step not served below (panels packed per call)",
                          "panels              2.0       3  steps of every size"]
