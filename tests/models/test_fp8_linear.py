"""fp8: e4m3 codes per output channel, activations per token, multiplied by torch._scaled_mm.

On CPU, torch 2.13's ``_scaled_mm`` is a reference implementation, so these tests run the method itself on CPU
tensors (the engine refuses fp8 there); benchmarks/cuda_engine.py runs it on a GPU.
"""
from __future__ import annotations

import pytest
import torch
from tiny_hf_models import tiny_models
from tiny_paged_batch import TinyPagedRunner
from torch import nn

from jido.layers import fp8_linear as fp8_linear_module
from jido.layers.fp8_linear import FP8_DTYPE, FP8_MAX, Fp8LinearMethod, fp8_linear, quantize_rows
from jido.layers.quantization import get_quantization_config, process_weights_after_loading
from jido.runner.model_loading import resolve_quantization, weight_bytes

TOKENS = {"a": [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8], "b": [2, 7, 1, 8, 2, 8, 1, 8]}


def _bound(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Half an e4m3 step at each value: 2^-4 of it for normal codes (3 mantissa bits), 2^-10 of the scale below
    e4m3's smallest normal (2^-6 of the scale, where the steps are 2^-9 of it)."""
    return torch.maximum(x.abs() * 2.0**-4, scale * 2.0**-10) * (1 + 1e-6)


def test_fp8_codes_hold_every_weight_within_half_an_e4m3_step():
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(48, 96, generator=gen, dtype=torch.float64)
    w[3] *= 1000  # an outlier row coarsens only its own scale
    w[5] = 0  # a row of zeros keeps finite codes
    codes, scale = quantize_rows(w)
    assert codes.dtype == FP8_DTYPE and scale.shape == (48, 1)
    assert torch.equal(codes[5].float(), torch.zeros(96)) and torch.isfinite(scale).all()
    back = codes.double() * scale.double()
    assert (back - w).abs().le(_bound(w, scale.double())).all()
    # Each row's largest magnitude lands on e4m3's largest code.
    assert torch.equal(codes.float().abs().amax(dim=1)[scale.squeeze(1) > 1e-30], torch.full((47,), FP8_MAX))


def test_fp8_linear_equals_the_float64_product_of_its_codes_and_scales():
    gen = torch.Generator().manual_seed(1)
    x, w, bias = (torch.randn(5, 64, generator=gen), torch.randn(32, 64, generator=gen),
                  torch.randn(32, generator=gen))
    codes, scale = quantize_rows(w)
    out = fp8_linear(x, codes, scale.reshape(1, -1), bias)
    x_codes, x_scale = quantize_rows(x)
    exact = (x_codes.double() * x_scale.double()) @ (codes.double() * scale.double()).t()
    # The product leaves _scaled_mm in bf16 (8 significant bits), then the bias is added in x's dtype.
    assert out.dtype == torch.float32
    assert ((out.double() - bias.double()) - exact).abs().le(exact.abs() * 2.0**-8 + 1e-6).all()
    # Against the float64 product of x and w themselves: within fp8's rounding of both (loose, but a wrong
    # scale or transpose is off by far more).
    reference = x.double() @ w.double().t() + bias.double()
    assert (out.double() - reference).norm() <= 0.1 * reference.norm()


def test_a_layer_whose_shape_cublas_cannot_take_stays_dense():
    layer = nn.Module()
    method = Fp8LinearMethod()
    method.create_weights(layer, 40, 32, weight_loader=lambda *a: None)
    with torch.no_grad():
        layer.weight.copy_(torch.randn(32, 40))
    method.process_weights_after_loading(layer)
    x = torch.randn(3, 40)
    assert layer.weight.dtype == torch.float32 and not hasattr(layer, "weight_scale")
    torch.testing.assert_close(method.apply(layer, x), x @ layer.weight.t(), atol=0, rtol=0)


def _fp8_model(arch: str):
    """(our model under fp8, our dense model, both loaded from the same tiny transformers checkpoint)."""
    hf, dense = tiny_models(arch)
    fp8 = type(dense)(dense.config, dense.model.layers[0].self_attn.backend,
                      quant_config=get_quantization_config("fp8")).eval()
    fp8.load_weights(hf.state_dict().items())
    process_weights_after_loading(fp8)
    return fp8, dense


def _float64_linear(x: torch.Tensor, codes: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    out = (x.double() @ (codes.double() * scale.double().reshape(-1, 1)).t()).to(x.dtype)
    return out if bias is None else out + bias


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_an_fp8_model_on_exact_x_equals_the_dense_model_on_its_dequantized_weights(arch, monkeypatch):
    # Where each shard's rows, scales and biases land: with x left unrounded, the fp8 model must be the dense
    # model holding codes * scales (untied heads here, so the reference can hold the head's own codes).
    fp8, dense = _fp8_model(arch)
    monkeypatch.setattr(fp8_linear_module, "fp8_linear", _float64_linear)
    quantized = dict(fp8.named_modules())
    for name, module in dense.named_modules():
        scale = getattr(quantized[name], "weight_scale", None)
        if scale is not None:
            module.weight.data = (quantized[name].weight.double() * scale.double().reshape(-1, 1)).float()
    ours, expected = TinyPagedRunner(fp8).step(TOKENS), TinyPagedRunner(dense).step(TOKENS)
    for request in TOKENS:
        torch.testing.assert_close(ours[request], expected[request], atol=2e-4, rtol=1e-4)


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_an_fp8_model_holds_e4m3_layers_and_head_and_stays_near_the_dense_model(arch):
    fp8, dense = _fp8_model(arch)
    layer = fp8.model.layers[0]
    for module in (layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj):
        assert module.weight.dtype == FP8_DTYPE and module.weight_scale.shape == (1, module.weight.shape[0])
    head = fp8.lm_head
    if arch == "gemma3":  # tied: the embedding gathers from its float table, the head multiplies an e4m3 copy
        assert head is fp8.model.embed_tokens and head.weight.dtype == torch.float32
        assert head.logits_codes.dtype == FP8_DTYPE and head.logits_scale.shape == (1, head.weight.shape[0])
        # The bytes held count the copy: a byte a weight and a float32 scale a row, as for the layers.
        layers = [m for m in fp8.modules() if getattr(m, "weight_scale", None) is not None]
        saved = sum(3 * m.weight.numel() - 4 * m.weight_scale.numel() for m in layers)
        added = head.logits_codes.numel() + 4 * head.logits_scale.numel()
        assert weight_bytes(fp8) == weight_bytes(dense) - saved + added
    else:
        assert head.weight.dtype == FP8_DTYPE and head.weight_scale.shape == (1, head.weight.shape[0])
    ours, expected = TinyPagedRunner(fp8).step(TOKENS), TinyPagedRunner(dense).step(TOKENS)
    for request in TOKENS:
        # Measured: 9.5-13% of the logits' norm. e4m3 keeps 3 mantissa bits (~2% rms per value, 3x int8 per
        # channel's on Gaussian weights), compounded over 13 matmuls of a random model with large weights;
        # a wrong scale or a transposed weight gives ~140%.
        error = (ours[request] - expected[request]).norm()
        assert error <= 0.2 * expected[request].norm(), error


def test_fp8_is_refused_where_no_fp8_tensor_cores_multiply_it(monkeypatch):
    with pytest.raises(ValueError, match="'fp8' needs a GPU with FP8 tensor cores .* use w8a8"):
        resolve_quantization("fp8", torch.device("cpu"), from_gguf=False)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA A100-SXM4-80GB")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    with pytest.raises(ValueError, match=r"compute capability 8.9 or newer .* NVIDIA A100-SXM4-80GB is 8.0"):
        resolve_quantization("fp8", torch.device("cuda"), from_gguf=False)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    assert resolve_quantization("fp8", torch.device("cuda"), from_gguf=True) == "fp8"
    with pytest.raises(ValueError, match="fp8 scales weights per output channel"):
        get_quantization_config("fp8", 32)
