"""Weight-quantized linear kernels: the C++ paths and the PyTorch fallback against float64 math on dequantize(w)."""
from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from jido.layers import quant_kernels as qk
from jido.utils import cpp_build
from jido.utils.cpu import cpu_info

# (N, K, group_size): groups of 16 and 32 and one per row; K a multiple of the 32-column chunk, with a
# short last group, below one chunk, and odd (the last int4 byte half padding).
SHAPES = [(5, 64, 16), (7, 96, 32), (4, 80, 32), (6, 67, 16), (3, 33, 32), (5, 50, None), (9, 19, 16), (2, 72, 24)]


def random_weight(num_rows: int, num_cols: int, group_size: int | None, bits: int, with_mins: bool,
                  gen: torch.Generator) -> qk.QuantizedWeight:
    """Random q, scales and (optionally) mins, packed: every value the format allows, not just quantize()'s."""
    group_size = group_size or num_cols
    low, high = (-128, 128) if bits == 8 else (0, 16)
    q = torch.randint(low, high, (num_rows, num_cols), generator=gen)
    groups = (num_rows, -(-num_cols // group_size))
    mins = torch.randn(groups, generator=gen) if with_mins else None
    return qk.pack(q, torch.rand(groups, generator=gen) + 0.1, mins, group_size, bits)


def reference(x: torch.Tensor, w: qk.QuantizedWeight, bias: torch.Tensor | None) -> torch.Tensor:
    out = x.double() @ qk.dequantize_reference(w).double().T
    return out if bias is None else out + bias.double()


def assert_matches_reference(y: torch.Tensor, x: torch.Tensor, w: qk.QuantizedWeight,
                             bias: torch.Tensor | None) -> None:
    """fp32 x: float32 sums, within 2^-20 of sum |x w|. bf16 x: the result is rounded to bf16 (2^-8 of it)
    and the bf16-dot kernel rounds w to bf16 as a dense bf16 layer does (2^-8 of sum |x w|)."""
    ref = reference(x, w, bias)
    magnitude = x.double().abs() @ qk.dequantize_reference(w).double().abs().T
    if x.dtype == torch.float32:
        bound = 2.0**-20 * magnitude + 1e-6
    else:
        bound = 2.0**-8 * (ref.abs() + magnitude) + 1e-6
    assert y.dtype == x.dtype and y.shape == ref.shape
    assert ((y.double() - ref).abs() <= bound).all(), (y.double() - ref).abs().max()


@pytest.fixture(params=["cpp", "torch"])
def path(request, monkeypatch) -> str:
    """Each test runs on the C++ kernels and on the PyTorch fallback (as if the build had failed)."""
    if request.param == "torch":
        monkeypatch.setattr(qk, "load_quant_ops", lambda: None)
    return request.param


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_quant_linear_matches_float64_reference(path, bits, dtype) -> None:
    gen = torch.Generator().manual_seed(bits)
    for i, (num_rows, num_cols, group_size) in enumerate(SHAPES):
        w = random_weight(num_rows, num_cols, group_size, bits, with_mins=i % 2 == 0, gen=gen)
        bias = torch.randn(num_rows, generator=gen) if i % 3 else None
        for rows in (1, 3, 17, 64):  # fp32: the fp32 kernel up to 16 rows, tiles above; bf16: bf16 dots from 4
            x = torch.randn(rows, num_cols, generator=gen).to(dtype)
            assert_matches_reference(qk.quant_linear(x, w, bias), x, w, bias)


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("bf16_dots", [False, True])
def test_each_kernel_matches_reference_for_every_row_block(bits, bf16_dots) -> None:
    # quant_linear picks a kernel by the number of rows; here each kernel runs every row block (fp32: 8, 4,
    # 2, 1 rows; bf16 dots: 16, 8, 4, 1) whatever quant_linear would pick.
    if bf16_dots and not qk.has_bf16_dots():
        pytest.skip("this CPU has no AVX512_BF16")
    ops = qk.load_quant_ops()
    gen = torch.Generator().manual_seed(10 + bits)
    for i, (num_rows, num_cols, group_size) in enumerate(SHAPES):
        w = random_weight(num_rows, num_cols, group_size, bits, with_mins=i % 2 == 1, gen=gen)
        for rows in (1, 3, 17, 64):
            x = torch.randn(rows, num_cols, generator=gen).to(torch.bfloat16 if bf16_dots else torch.float32)
            y = ops.linear(x, w.data, w.scales, w.mins, w.group_size, w.bits, num_cols, None, bf16_dots)
            assert_matches_reference(y, x, w, None)


@pytest.mark.parametrize("bits", [8, 4])
def test_dequantize_matches_reference_and_embedding_gathers_its_rows(path, bits) -> None:
    gen = torch.Generator().manual_seed(20 + bits)
    for i, (num_rows, num_cols, group_size) in enumerate(SHAPES):
        w = random_weight(num_rows, num_cols, group_size, bits, with_mins=i % 2 == 0, gen=gen)
        expected = qk.dequantize_reference(w)
        # the kernel fuses scale * q + min into one rounding; the reference rounds twice
        torch.testing.assert_close(qk.dequantize(w), expected, rtol=0, atol=2e-6 * float(expected.abs().max()))
        ids = torch.randint(0, num_rows, (11,), generator=gen)
        torch.testing.assert_close(qk.quant_embedding(ids, w, torch.float32), expected[ids],
                                   rtol=0, atol=2e-6 * float(expected.abs().max()))
        torch.testing.assert_close(qk.quant_embedding(ids, w, torch.bfloat16), expected[ids].bfloat16(),
                                   rtol=2**-8, atol=0)


def test_pack_puts_even_columns_in_low_nibbles_and_pads_odd_k() -> None:
    w = qk.pack(torch.tensor([[1, 2, 3], [15, 0, 7]]), torch.ones(2, 1), None, group_size=4, bits=4)
    assert w.data.dtype == torch.uint8 and w.data.tolist() == [[0x21, 0x03], [0x0F, 0x07]]
    assert w.shape == (2, 3) and w.scales.dtype == torch.float32 and w.mins is None


@pytest.mark.parametrize("args, message", [
    ((torch.zeros(2, 4, dtype=torch.int8), torch.ones(2, 1), None, 4, 3), "bits must be 8 or 4, got 3"),
    ((torch.zeros(2, 4, dtype=torch.int8), torch.ones(2, 1), None, 0, 8), "group_size must be a positive int, got 0"),
    ((torch.zeros(2, 4), torch.ones(2, 1), None, 4, 8), r"q must be a 2-D integer tensor \[N, K\], got torch.float32"),
    ((torch.zeros(8, dtype=torch.int8), torch.ones(2, 1), None, 4, 8), r"q must be a 2-D integer tensor"),
    ((torch.full((2, 4), 16), torch.ones(2, 1), None, 4, 4), r"q values must lie in 0..15 for bits=4, got 16..16"),
    ((torch.full((2, 4), -1), torch.ones(2, 1), None, 4, 4), r"q values must lie in 0..15 for bits=4, got -1..-1"),
    ((torch.full((2, 4), 128), torch.ones(2, 1), None, 4, 8), r"q values must lie in -128..127 for bits=8"),
    ((torch.zeros(2, 5, dtype=torch.int8), torch.ones(2, 1), None, 4, 8),
     r"scales must be a floating tensor of shape \[N, ceil\(K / group_size\)\] = \[2, 2\], got torch.float32 of "
     r"shape \[2, 1\]"),
    ((torch.zeros(2, 4, dtype=torch.int8), torch.ones(2, 1, dtype=torch.int32), None, 4, 8),
     r"scales must be a floating tensor"),
    ((torch.zeros(2, 4, dtype=torch.int8), torch.ones(2, 1), torch.ones(1, 1), 4, 8),
     r"mins must be a floating tensor of shape \[N, ceil\(K / group_size\)\] = \[2, 1\]"),
])
def test_pack_rejects_bad_shapes_and_ranges(args, message) -> None:
    with pytest.raises(ValueError, match=message):
        qk.pack(*args)


@pytest.mark.parametrize("num_cols, group_size", [(64, 32), (67, 16), (50, None)])
def test_quantize_round_trip_error_is_at_most_half_a_step(num_cols, group_size) -> None:
    weight = torch.randn(6, num_cols, generator=torch.Generator().manual_seed(num_cols))
    w8 = qk.quantize(weight, 8, group_size)
    assert w8.mins is None and w8.data.abs().max() <= 127
    assert w8.scales.shape == (6, -(-num_cols // (group_size or num_cols)))
    w4 = qk.quantize(weight, 4, group_size)
    assert w4.mins is not None and int(w4.data.max()) <= 0xFF
    for w in (w8, w4):
        step = w.scales.repeat_interleave(w.group_size, dim=1)[:, :num_cols]
        error = (weight - qk.dequantize_reference(w)).abs()
        assert (error <= step / 2 + 1e-6).all(), (error - step / 2).max()


def test_quantize_keeps_a_constant_group_exact() -> None:
    weight = torch.tensor([[0.0] * 8 + [2.5] * 8])
    for bits in (8, 4):
        torch.testing.assert_close(qk.dequantize_reference(qk.quantize(weight, bits, 8)), weight, rtol=0, atol=0)


def test_compact_scales_holds_float16_values_in_float16_with_the_same_outputs() -> None:
    gen = torch.Generator().manual_seed(5)
    q = torch.randint(0, 16, (6, 64), generator=gen)
    d = (torch.rand(6, 1, generator=gen) * 0.01 + 0.001).half().float()  # a file's float16 d per row
    legacy = qk.pack(q, d.expand(6, 2), -8 * d.expand(6, 2), 32, 4)  # Q4_0: d and -8 d, float16 values
    compact = qk.compact_scales(legacy)
    assert compact.scales.dtype == compact.mins.dtype == torch.float16
    assert torch.equal(compact.float_scales, legacy.scales) and torch.equal(compact.float_mins, legacy.mins)
    assert torch.equal(qk.dequantize(compact), qk.dequantize(legacy))
    x = torch.randn(3, 64, generator=gen)
    assert torch.equal(qk.quant_linear(x, compact), qk.quant_linear(x, legacy))
    assert torch.equal(qk.quant_embedding(torch.tensor([4, 1]), compact, torch.float32),
                       qk.quant_embedding(torch.tensor([4, 1]), legacy, torch.float32))


def test_compact_scales_keeps_float32_where_a_scale_or_min_is_no_float16_value() -> None:
    gen = torch.Generator().manual_seed(6)
    q = torch.randint(0, 16, (6, 64), generator=gen)
    d = (torch.rand(6, 1, generator=gen) * 0.01 + 0.001).half().float()
    sc = torch.randint(1, 64, (6, 2), generator=gen).float()  # Q4_K's 6-bit sub-scales: d * sc needs up to 17 bits
    k_quant = qk.pack(q, d * sc, None, 32, 4)
    assert not torch.equal((d * sc).half().float(), d * sc)
    assert qk.compact_scales(k_quant) is k_quant
    with_mins = qk.pack(q, d.expand(6, 2), -d * sc, 32, 4)  # float16 scales, K-quant mins
    assert qk.compact_scales(with_mins) is with_mins


def test_quant_linear_rejects_x_of_the_wrong_width() -> None:
    w = qk.quantize(torch.randn(3, 8), 8, None)
    with pytest.raises(ValueError, match=r"x must be float32 or bfloat16 \[M, 8\], got torch.float32 \(2, 9\)"):
        qk.quant_linear(torch.randn(2, 9), w)


def test_build_failure_falls_back_to_pytorch_with_a_warning(tmp_path, monkeypatch, caplog) -> None:
    broken = tmp_path / "quant_linear.cpp"
    broken.write_text("#error this source does not compile\n")
    monkeypatch.setattr(cpp_build, "CACHE_ROOT", tmp_path / "build")
    with caplog.at_level(logging.WARNING, logger=cpp_build.__name__):
        assert qk.load_quant_ops.__wrapped__(broken) is None
    assert "C++ quantized linear kernels unavailable" in caplog.text and "dequantize + F.linear" in caplog.text


def test_cpp_kernels_build_on_this_machine() -> None:
    # The fallback keeps results right without a compiler; this says when the fast path silently went missing.
    assert qk.load_quant_ops() is not None


AVX2_CHECK = """
import torch
from jido.layers import quant_kernels as qk
assert qk.load_quant_ops() is not None
assert any(path.endswith("_avx2.so") for path in torch.ops.loaded_libraries), torch.ops.loaded_libraries
gen = torch.Generator().manual_seed(0)
for bits in (8, 4):
    for num_cols, group_size in ((96, 32), (64, 16), (67, 16), (40, None)):
        w = qk.quantize(torch.randn(9, num_cols, generator=gen), bits, group_size)
        for rows in (1, 3, 17):
            x = torch.randn(rows, num_cols, generator=gen)
            ref = (x.double() @ qk.dequantize_reference(w).double().T).float()
            torch.testing.assert_close(qk.quant_linear(x, w), ref, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(qk.dequantize(w), qk.dequantize_reference(w), rtol=1e-6, atol=1e-6)
print("avx2 build ok")
"""


@pytest.mark.skipif("avx2" not in cpu_info().flags, reason="the AVX2 build needs a CPU with AVX2")
def test_avx2_build_matches_reference() -> None:
    # Machines of this project may have AVX2 only: the AVX-512 machines build and check that code too.
    env = {**os.environ, cpp_build.BUILD_ISA_ENV: "avx2", "PYTHONPATH": str(Path(qk.__file__).parents[2])}
    result = subprocess.run([sys.executable, "-c", AVX2_CHECK], env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0 and "avx2 build ok" in result.stdout, result.stderr[-3000:]
