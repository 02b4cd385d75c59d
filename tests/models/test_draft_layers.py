"""The layers trained drafts propose on: what they compute while proposing (jido's kernels, no autograd) is what they
compute while training (plain autograd ops), and an int8 draft's one-row steps take the AMX panels."""
from __future__ import annotations

import pytest
import torch

from jido.layers import int8_dot
from jido.layers.quantized_linear import QuantizedLinearMethod
from jido.models.draft_layers import DraftLinear, DraftNorm
from jido.models.eagle import EagleDraft, EagleDraftConfig


@pytest.mark.parametrize("dtype, atol", [(torch.float32, 1e-6), (torch.bfloat16, 2e-2)])
def test_a_draft_norm_proposing_gives_what_it_gives_training(dtype, atol):
    norm = DraftNorm(640, 1e-6)
    with torch.no_grad():
        norm.weight.copy_(torch.rand(640) + 0.5)
    norm = norm.to(dtype)
    x = (torch.randn(3, 640) * 20).to(dtype)
    training = norm(x)
    with torch.inference_mode():
        proposing = norm(x)
    assert proposing.dtype == dtype
    # bf16: the kernel rounds once, F.rms_norm twice (after normalizing, after the weight): at most an ulp apart.
    assert torch.allclose(proposing.float(), training.float(), rtol=1e-2 if dtype == torch.bfloat16 else 0, atol=atol)


def test_an_eagle_drafts_projection_proposing_gives_what_it_gives_training():
    config = EagleDraftConfig(hidden_size=64, intermediate_size=96, num_heads=4, num_kv_heads=2, head_dim=16,
                              draft_vocab_size=50, target_vocab_size=200)
    torch.manual_seed(3)
    draft = EagleDraft(config)
    embeds, hidden = torch.randn(5, 64) * 10, torch.randn(5, 64)
    positions = torch.tensor([0, 3, 7, 8, 300])
    training = draft.project(embeds, hidden, positions)
    with torch.inference_mode():
        proposing = draft.project(embeds, hidden, positions)  # q and k rotated in place by the fused kernel
    for name, ours, theirs in zip("xqkv", proposing, training):
        assert torch.allclose(ours, theirs, rtol=1e-5, atol=1e-5), name


@pytest.mark.skipif(not int8_dot.amx_runs(), reason="needs AMX-INT8 tiles (and the kernels built)")
def test_an_int8_drafts_one_row_steps_take_the_amx_panels_where_a_models_take_the_rows_kernel():
    gen = torch.Generator().manual_seed(5)
    weight = torch.randn(4099, 96, generator=gen)
    layer = DraftLinear(96, 4099, bias=False)
    with torch.no_grad():
        layer.weight.copy_(weight)
    layer.prepare(8)
    x = torch.randn(1, 96, generator=gen)
    with torch.inference_mode():
        out = layer(x)
        assert torch.equal(out, int8_dot.panel_linear(x, layer.layouts.panels))
        assert torch.equal(layer.argmax_columns(x), out.argmax(dim=-1))
        bf16 = x.to(torch.bfloat16)  # the argmax reads float32 sums where the layer's outputs round to bf16
        panels = layer.layouts.panels
        assert torch.equal(layer.argmax_columns(bf16), int8_dot.panel_linear(bf16.float(), panels).argmax(-1))
    # A model's layer keeps one row on the rows kernel; its argmax (a greedy head's) comes from the panels alike.
    model_layer = DraftLinear(96, 4099, bias=False)
    with torch.no_grad():
        model_layer.weight.copy_(weight)
    model_layer.linear_method = QuantizedLinearMethod(bits=8, group_size=32)
    model_layer.linear_method.process_weights_after_loading(model_layer)
    with torch.inference_mode():
        assert torch.equal(model_layer(x), int8_dot.int8_dot_linear(x, model_layer.qweight, None, False))
        panels = model_layer.layouts.panels
        assert torch.equal(model_layer.argmax_columns(x), int8_dot.panel_linear(x, panels).argmax(-1))
