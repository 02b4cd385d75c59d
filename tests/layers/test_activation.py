"""Gated activations: the C++ act-and-mul kernel and the ATen path against float64 math."""
from __future__ import annotations

import math

import pytest
import torch

from jido.layers import activation as activation_module
from jido.layers.activation import get_gated_activation


def logistic_reference(name: str, gate_up: torch.Tensor) -> torch.Tensor:
    """act(gate) * up in float64, both activations as gate * sigmoid(z): accurate where gate is very negative,
    where 0.5 g (1 + tanh(y)) cancels even in float64."""
    gate, up = gate_up.double().chunk(2, dim=-1)
    z = gate if name == "silu" else 2 * math.sqrt(2 / math.pi) * (gate + 0.044715 * gate**3)
    return gate * torch.sigmoid(z) * up


@pytest.fixture(params=["cpp", "torch"])
def path(request, monkeypatch) -> str:
    if request.param == "torch":
        monkeypatch.setattr(activation_module, "load_activation_ops", lambda: None)
    else:
        assert activation_module.load_activation_ops() is not None, "the C++ activation kernel did not build here"
    return request.param


@pytest.mark.parametrize("name", ["silu", "gelu_pytorch_tanh"])
@pytest.mark.parametrize("shape", [(1, 2048), (37, 4096), (3, 26), (0, 16)])  # 26: a 13-wide half, the scalar tail
def test_gated_activation_matches_float64(path, name, shape) -> None:
    gen = torch.Generator().manual_seed(shape[0] * 7 + len(name))
    gate_up = torch.randn(shape, generator=gen) * 4
    out = get_gated_activation(name)(gate_up)
    assert out.shape == (shape[0], shape[1] // 2) and out.dtype == torch.float32
    expected = logistic_reference(name, gate_up)
    error = (out.double() - expected).abs()
    assert torch.all(error / expected.abs().clamp(min=1) < 2e-6)  # relative, or absolute below 1
    if path == "cpp":  # relative even where tiny: ATen's tanh form cancels there (1 + tanh(y) near -1)
        normal = expected.abs() > 1e-6
        assert torch.all(error[normal] / expected.abs()[normal] < 4e-6)


@pytest.mark.parametrize("name", ["silu", "gelu_pytorch_tanh"])
def test_gradients_flow_through_the_gated_activation_of_a_layer_being_trained(name) -> None:
    # The C++ kernel has no backward: a trained draft's gate/up projection got no gradient through it.
    gen = torch.Generator().manual_seed(5)
    gate_up = (torch.randn(6, 64, generator=gen) * 2).requires_grad_()
    weights = torch.randn(6, 32, generator=gen)
    (get_gated_activation(name)(gate_up) * weights).sum().backward()
    reference = gate_up.detach().double().requires_grad_()
    (logistic_reference(name, reference) * weights.double()).sum().backward()
    torch.testing.assert_close(gate_up.grad.double(), reference.grad, atol=1e-5, rtol=1e-5)


def test_cpp_kernel_gives_each_value_the_same_bits_in_any_column_and_batch() -> None:
    # the vector loop and the scalar tail compute alike; rows are independent of the batch around them
    assert activation_module.load_activation_ops() is not None, "the C++ activation kernel did not build here"
    gate = torch.linspace(-4, 4, 61)  # 61 wide: columns 56..60 are the scalar tail
    gate_up = torch.cat([gate, torch.full_like(gate, 1.5)])[None]
    one = get_gated_activation("gelu_pytorch_tanh")(gate_up)
    shifted = torch.cat([gate.roll(-5), torch.full_like(gate, 1.5)])[None]  # columns 0..4 now in the tail
    out = get_gated_activation("gelu_pytorch_tanh")(shifted)
    assert torch.equal(out[0], one[0].roll(-5))
    batch = get_gated_activation("gelu_pytorch_tanh")(gate_up.repeat(9, 1))
    assert torch.equal(batch, one.repeat(9, 1))


def test_cpp_kernel_in_bf16_gives_each_value_the_same_bits_in_any_column() -> None:
    # 61 wide: columns 0..47 in 16-lane AVX-512 BF16 vectors where the CPU has them, 48..55 in the AVX2 loop, 56..60
    # in the scalar tail; rolled by 5, every value moves to another of them.
    assert activation_module.load_activation_ops() is not None, "the C++ activation kernel did not build here"
    gate = torch.linspace(-4, 4, 61).bfloat16()
    up = torch.linspace(0.5, 2, 61).bfloat16()
    one = get_gated_activation("gelu_pytorch_tanh")(torch.cat([gate, up])[None])
    out = get_gated_activation("gelu_pytorch_tanh")(torch.cat([gate.roll(-5), up.roll(-5)])[None])
    assert torch.equal(out[0], one[0].roll(-5))


@pytest.mark.parametrize("name", ["silu", "gelu_pytorch_tanh"])
def test_cpp_kernel_in_bf16_rounds_the_activation_then_the_product_once_each(name) -> None:
    # As ATen's two bf16 ops round (each computing in float32): act(gate) rounded to bf16, times up, rounded. (ATen's
    # own tanh form cancels where gate is well below 0, so it is the float64 activation that is rounded here.)
    assert activation_module.load_activation_ops() is not None, "the C++ activation kernel did not build here"
    gen = torch.Generator().manual_seed(len(name))
    gate_up = (torch.randn(33, 2 * 211, generator=gen) * 4).bfloat16()  # 211 wide: an 8-wide loop and a tail
    gate_up[0, :3] = torch.tensor([float("nan"), float("inf"), -float("inf")])
    out = get_gated_activation(name)(gate_up)
    gate, up = gate_up.chunk(2, dim=-1)
    act = logistic_reference(name, torch.cat([gate, torch.ones_like(gate)], dim=-1))  # act(gate) in float64
    expected = (act.bfloat16().float() * up.float()).bfloat16()
    assert out.dtype == torch.bfloat16 and out.shape == expected.shape
    assert torch.equal(out[0, :3].isnan(), torch.tensor([True, False, True]))  # inf * 1 stays; -inf / inf is NaN
    finite = expected.isfinite()
    # float32's activation (exp within 2 ulp) rounds to the other bf16 neighbour only near a rounding boundary
    ulp = expected.float().abs().clamp(min=1e-30) * 2**-7
    off = (out.float() - expected.float()).abs()[finite] / ulp[finite]
    assert off.max() <= 1.01 and (off > 0).float().mean() < 0.01, (off.max(), (off > 0).float().mean())


def test_extremes_give_the_limits_not_nan(path) -> None:
    gate = torch.tensor([-1e4, -90.0, -30.0, 0.0, 30.0, 90.0, 1e4, -0.0])
    gate_up = torch.cat([gate, torch.full_like(gate, 2.0)])[None]
    for name in ("silu", "gelu_pytorch_tanh"):
        out = get_gated_activation(name)(gate_up)[0]
        assert torch.isfinite(out).all()
        assert out[:4].abs().max() < 1e-10 and torch.equal(out[4:7], 2 * gate[4:7])


def test_unsupported_activation_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="unsupported hidden_act 'relu2'"):
        get_gated_activation("relu2")
