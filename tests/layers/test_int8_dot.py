"""Integer dot-product kernels: x rounded to int8 per block, against float64 math on the same rounding and on x itself."""
from __future__ import annotations

import pytest
import torch

from jido.layers import int8_dot, quant_kernels as qk
from jido.utils.cpu import CpuInfo

pytestmark = pytest.mark.skipif(int8_dot.load_int8_dot_ops() is None, reason="no int8 dot kernel for this CPU")

# (N, K, group_size): groups of 16, 32, 64 and one per row; K a multiple of 32, with a partial last block
# (odd, below one block, a group of 16 cut short) and the head's width.
SHAPES = [(5, 64, 16), (7, 96, 32), (4, 80, 32), (6, 67, 16), (3, 33, 32), (5, 50, None), (9, 128, 64),
          (3, 40, 16), (2, 20, 16), (8, 640, 32), (4, 70, None)]


def random_weight(num_rows: int, num_cols: int, group_size: int | None, bits: int, with_mins: bool,
                  gen: torch.Generator) -> qk.QuantizedWeight:
    """Every code the format allows (int8 -128..127, int4 0..15), random positive scales, optional mins."""
    group_size = group_size or num_cols
    low, high = (-128, 128) if bits == 8 else (0, 16)
    q = torch.randint(low, high, (num_rows, num_cols), generator=gen)
    groups = (num_rows, -(-num_cols // group_size))
    mins = torch.randn(groups, generator=gen) if with_mins else None
    return qk.pack(q, torch.rand(groups, generator=gen) + 0.1, mins, group_size, bits)


def random_x(rows: int, num_cols: int, dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    """Gaussian rows with a few large outliers (as LLM activations have) and one all-zero block."""
    x = torch.randn(rows, num_cols, generator=gen)
    x[:, torch.randint(0, num_cols, (2,), generator=gen)] *= 30
    x[0, :min(32, num_cols)] = 0
    return x.to(dtype)


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_int8_dot_linear_equals_float64_math_on_the_rounded_activations(bits, dtype) -> None:
    gen = torch.Generator().manual_seed(bits)
    for i, (num_rows, num_cols, group_size) in enumerate(SHAPES):
        w = random_weight(num_rows, num_cols, group_size, bits, with_mins=i % 2 == 0, gen=gen)
        bias = torch.randn(num_rows, generator=gen) if i % 3 else None
        for rows in (1, 2, 3, 4, 7, 16):  # every row block of the kernel: 4, 2, 1
            x = random_x(rows, num_cols, dtype, gen)
            y = int8_dot.int8_dot_linear(x, w, bias)
            ref = int8_dot.int8_dot_linear_reference(x, w, bias)
            # float32 sums of exact integer products: within 2^-20 of the sum of the terms' magnitudes
            magnitude = int8_dot.int8_dot_linear_reference(x.abs(), _magnitudes(w), None)
            bound = 2.0**-20 * magnitude if dtype == torch.float32 else 2.0**-8 * (ref.abs() + magnitude)
            assert y.dtype == dtype and y.shape == (rows, num_rows)
            assert ((y.double() - ref).abs() <= bound + 1e-5).all(), (i, rows, (y.double() - ref).abs().max())


def _magnitudes(w: qk.QuantizedWeight) -> qk.QuantizedWeight:
    """|codes|, |scales| and |mins| of int8 ``w`` as a weight (int4 codes and scales are already >= 0)."""
    data = w.data.abs().clamp(max=127) if w.bits == 8 else w.data
    mins = None if w.mins is None else w.mins.abs()
    return qk.QuantizedWeight(data, w.scales.abs(), mins, w.group_size, w.bits, w.shape)


@pytest.mark.parametrize("bits", [8, 4])
def test_int8_dot_linear_is_within_the_activation_rounding_of_the_exact_product(bits) -> None:
    # Each rounded x is off by at most half its block's step, so the result is off by at most
    # sum over blocks of step / 2 * sum |w| there (plus float32 sums).
    gen = torch.Generator().manual_seed(30 + bits)
    for num_rows, num_cols, group_size in SHAPES:
        w = random_weight(num_rows, num_cols, group_size, bits, with_mins=True, gen=gen)
        x = random_x(5, num_cols, torch.float32, gen)
        dense = qk.dequantize_reference(w).double()
        exact = x.double() @ dense.T
        _, scales = int8_dot.quantize_activations(x)
        step = scales.double().repeat_interleave(int8_dot.BLOCK, dim=1)[:, :num_cols]
        scaled_codes = qk.dequantize_reference(qk.QuantizedWeight(w.data, w.scales, None, w.group_size, w.bits,
                                                                   w.shape)).double()
        bound = (step / 2) @ scaled_codes.abs().T + 1e-5 * (x.double().abs() @ dense.abs().T) + 1e-5
        assert ((int8_dot.int8_dot_linear(x, w).double() - exact).abs() <= bound).all()


def test_quantize_activations_rounds_each_block_to_127_steps_of_its_max() -> None:
    x = torch.cat([torch.zeros(1, 32), torch.linspace(-2, 1, 32)[None], torch.full((1, 32), 0.5)], dim=1)
    x = torch.cat([x, torch.tensor([[0.25, -0.5, 1.0]])], dim=1)  # a partial last block of 3 columns
    codes, scales = int8_dot.quantize_activations(x)
    assert codes.dtype == torch.int8 and codes.shape == (1, 99) and scales.shape == (1, 4)
    assert scales[0].tolist() == pytest.approx([0.0, 2 / 127, 0.5 / 127, 1 / 127])
    assert codes[0, :32].eq(0).all() and codes[0, 32] == -127 and codes[0, 64:96].eq(127).all()
    assert codes[0, 96:].tolist() == [32, -64, 127]  # 0.25 * 127 = 31.75 rounds to 32
    step = scales.repeat_interleave(32, dim=1)[:, :99]
    assert ((codes * step - x).abs() <= step / 2 + 1e-7).all()


def test_dot_isa_picks_vnni_where_the_cpu_has_it_and_avx2_otherwise() -> None:
    def cpu(*flags: str) -> CpuInfo:
        return CpuInfo("x", 2, frozenset(flags))

    assert int8_dot.dot_isa(cpu("avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni")) == "avx512_vnni"
    assert int8_dot.dot_isa(cpu("avx2", "fma", "avx512f", "avx512bw", "avx512vl")) == "avx2"  # Skylake-X
    assert int8_dot.dot_isa(cpu("avx2", "fma")) == "avx2"
    assert int8_dot.dot_isa(cpu("avx", "sse4_2")) is None


def test_kernel_refuses_an_isa_this_cpu_lacks() -> None:
    ops = int8_dot.load_int8_dot_ops()
    vnni = int8_dot.ISAS.index("avx512_vnni")
    if ops.supported(vnni):
        pytest.skip("this CPU runs the VNNI kernel")
    w = qk.quantize(torch.randn(4, 64), 8, 32)
    with pytest.raises(RuntimeError, match="this CPU does not run the int8 dot kernel for isa 1"):
        ops.linear(torch.randn(1, 64), w.data, w.scales, w.mins, 32, 8, 64, None, vnni)


def test_groups_the_kernels_do_not_take_are_refused_by_supports_and_by_the_kernel() -> None:
    w = qk.quantize(torch.randn(4, 72), 8, 24)
    assert not int8_dot.supports(w) and int8_dot.supports(qk.quantize(torch.randn(4, 72), 8, 16))
    with pytest.raises(RuntimeError, match="int8 dot products need groups of 16, of a multiple of 32 or of a "
                                           "whole row; got 24"):
        int8_dot.int8_dot_linear(torch.randn(1, 72), w)
