"""Integer dot-product kernels (rows and panels): x rounded to int8 per block or per token, against float64 math on
the same rounding and on x itself."""
from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from jido.layers import int8_dot, quant_kernels as qk
from jido.utils.cpu import CpuInfo

pytestmark = pytest.mark.skipif(int8_dot.load_int8_dot_ops() is None, reason="no int8 dot kernel for this CPU")

# (N, K, group_size): groups of 16, 32, 64 and one per row; K a multiple of 32, with a partial last block
# (odd, below one block, a group of 16 cut short) and the head's width; N below, at and past one panel of 8
# rows, and past a set of 8 panels with a short last panel (70). Odd positions get no mins. At one row of x a
# shape with K a multiple of 32 takes the decode path (rows n and n + N/2 together); the last six give it every
# group size with and without mins, at odd N.
SHAPES = [(5, 64, 16), (7, 96, 32), (4, 80, 32), (6, 67, 16), (3, 33, 32), (5, 50, None), (9, 128, 64),
          (3, 40, 16), (2, 20, 16), (8, 640, 32), (4, 70, None), (70, 96, 32),
          (10, 64, 16), (11, 64, 16), (6, 128, 64), (13, 128, 64), (3, 96, None), (9, 96, None)]
KERNELS = {"rows": False, "panels": True}


def random_weight(num_rows: int, num_cols: int, group_size: int | None, bits: int, with_mins: bool,
                  gen: torch.Generator, codes: tuple[int, int] | None = None) -> qk.QuantizedWeight:
    """Codes drawn from ``codes`` (low, high + 1; default every code the format allows: int8 -128..127, int4
    0..15), random positive scales, optional mins."""
    group_size = group_size or num_cols
    low, high = codes or ((-128, 128) if bits == 8 else (0, 16))
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


def assert_equals_reference(x: torch.Tensor, w: qk.QuantizedWeight, bias: torch.Tensor | None, per_token: bool,
                            panels: bool, context: object) -> None:
    assert_within_reference(int8_dot.int8_dot_linear(x, w, bias, per_token, panels), x, w, bias, per_token, context)


def assert_within_reference(y: torch.Tensor, x: torch.Tensor, w: qk.QuantizedWeight, bias: torch.Tensor | None,
                            per_token: bool, context: object) -> None:
    ref = int8_dot.int8_dot_linear_reference(x, w, bias, per_token)
    # float32 sums of exact integer products: within 2^-18 of the sum of the terms' magnitudes
    magnitude = int8_dot.int8_dot_linear_reference(x.abs(), _magnitudes(w), None, per_token)
    bound = 2.0**-18 * magnitude if x.dtype == torch.float32 else 2.0**-8 * (ref.abs() + magnitude)
    assert y.dtype == x.dtype and y.shape == (x.shape[0], w.shape[0])
    assert ((y.double() - ref).abs() <= bound + 1e-5).all(), (context, (y.double() - ref).abs().max())


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_int8_dot_linear_equals_float64_math_on_the_rounded_activations(kernel, bits, dtype) -> None:
    gen = torch.Generator().manual_seed(bits)
    for i, (num_rows, num_cols, group_size) in enumerate(SHAPES):
        w = random_weight(num_rows, num_cols, group_size, bits, with_mins=i % 2 == 0, gen=gen)
        bias = torch.randn(num_rows, generator=gen) if i % 3 else None
        for rows in (1, 2, 3, 4, 7, 16):  # every row block of the kernels: 4, 2, 1
            x = random_x(rows, num_cols, dtype, gen)
            assert_equals_reference(x, w, bias, i % 4 == 1, KERNELS[kernel], (i, rows))


@pytest.mark.parametrize("codes", [(0, 16), (-16, 16), (-32, 32), (40, 104), (-64, 64), (-128, 128)])
def test_panel_kernel_takes_codes_of_every_span_with_and_without_an_offset(codes) -> None:
    # Spans of 15, 31, 63 and 127 codes run unsigned (minus their lowest code), their int16 pair sums widened
    # every 8, 4, 2 and 1 quads; 255 multiplies by sign. The largest |x| and codes meet in every row.
    gen = torch.Generator().manual_seed(codes[0] + 200)
    for num_rows, num_cols, group_size in ((70, 96, 32), (9, 64, 16), (16, 160, None)):
        for with_mins in (False, True):
            w = random_weight(num_rows, num_cols, group_size, 8, with_mins, gen, codes)
            x = random_x(9, num_cols, torch.float32, gen)
            x[:, :2] = x.abs().amax() * torch.tensor([1.0, -1.0])
            for per_token in (False, True):
                assert_equals_reference(x, w, None, per_token, True, (num_rows, num_cols, with_mins, per_token))


def test_every_row_gets_the_same_result_alone_and_in_any_step() -> None:
    # x is rounded row by row, so a row's output is the same in a step of one row (rows kernel) and of
    # forty (panel kernel) up to float32 sums in another order.
    gen = torch.Generator().manual_seed(5)
    for bits in (8, 4):
        w = random_weight(70, 640, 32, bits, with_mins=True, gen=gen)
        x = random_x(40, 640, torch.float32, gen)
        together = int8_dot.int8_dot_linear(x, w)
        alone = torch.cat([int8_dot.int8_dot_linear(x[i:i + 1], w) for i in range(40)])
        torch.testing.assert_close(together, alone, rtol=1e-5, atol=1e-5 * float(alone.abs().max()))


@pytest.mark.parametrize("codes", [(-128, 128), (0, 16), (-16, 16)], ids=["signed", "int4", "five_bit"])
def test_a_verify_step_of_five_to_eight_rows_gives_each_row_the_bits_of_a_long_step(codes) -> None:
    # Steps of up to 8 rows run in one pass over each panel; signed codes (widened every quad) take 5-7 rows in
    # one block that keeps its outputs in memory. Every row must get exactly what it gets in a step of 20 rows,
    # which runs in blocks of 8 (signed codes under VNNI: the rows' quads interleaved, QuantizedX::qu8) and then 4.
    gen = torch.Generator().manual_seed(13)
    for num_rows, num_cols, group_size in ((70, 96, 32), (9, 640, 32), (16, 160, None)):
        w = random_weight(num_rows, num_cols, group_size, 8, with_mins=num_rows != 9, gen=gen, codes=codes)
        packed = int8_dot.pack_panels(w)
        x = random_x(20, num_cols, torch.float32, gen)
        long_step = int8_dot.panel_linear(x, packed)
        for rows in range(2, 9):
            assert torch.equal(int8_dot.panel_linear(x[:rows].contiguous(), packed), long_step[:rows]), (num_rows, rows)
        for first in (8, 16):  # the second block of 8 and the last 4, each alone
            rows = min(8, 20 - first)
            alone = int8_dot.panel_linear(x[first:first + rows].contiguous(), packed)
            assert torch.equal(alone, long_step[first:first + rows]), (num_rows, first)


@pytest.mark.skipif(not int8_dot.runs(qk.quantize(torch.randn(8, 32), 8, 32))
                    or not int8_dot.load_int8_dot_ops().supported(int8_dot.ISAS.index("avx512_vnni")),
                    reason="needs the kernels built and AVX-512 VNNI")
@pytest.mark.parametrize("codes", [(-128, 128), (0, 16), (-16, 16), (-64, 64), (0, 128)],
                         ids=["signed", "int4", "five_bit", "six_bit", "seven_bit"])
def test_vnni_panel_pairs_give_each_output_the_bits_of_the_avx2_panels(codes) -> None:
    # Under VNNI two panels of signed codes, or two of unsigned ones (any span), run as one 16-wide pair in blocks
    # of 4 or interleaved 8 rows; AVX2 runs each panel alone, unsigned codes with int16 pair sums widened in time.
    ops, vnni, avx2 = int8_dot.load_int8_dot_ops(), int8_dot.ISAS.index("avx512_vnni"), int8_dot.ISAS.index("avx2")
    gen = torch.Generator().manual_seed(17)
    for num_rows, num_cols, group_size, with_mins in ((70, 640, 32, True), (48, 96, 32, False), (40, 160, None, True)):
        w = random_weight(num_rows, num_cols, group_size, 8, with_mins=with_mins, gen=gen, codes=codes)
        packed = {isa: ops.pack_panels(w.data, w.scales, w.mins, w.group_size, 8, num_cols, isa, int8_dot.BLOCK)
                  for isa in (vnni, avx2)}
        for rows in (2, 5, 8, 13, 20, 32):
            x = random_x(rows, num_cols, torch.float32, gen)
            out = {isa: ops.panel_linear(x, *packed[isa], num_rows, num_cols, w.group_size, None, isa, int8_dot.BLOCK)
                   for isa in (vnni, avx2)}
            assert torch.equal(out[vnni], out[avx2]), (codes, num_rows, num_cols, rows)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("bits", [8, 4])
def test_every_isa_this_cpu_runs_gives_the_float64_result_and_the_same_bits(kernel, bits) -> None:
    # The other tests run the CPU's widest ISA; here each ISA the library says this CPU runs (AVX2 on an AVX-512
    # machine too), rows kernel and per-call panels (VNNI's in pairs), at every row block. Their integer sums are exact
    # and their float operations the same, so every ISA gives the same bits.
    ops = int8_dot.load_int8_dot_ops()
    isas = [i for i, _ in enumerate(int8_dot.ISAS) if ops.supported(i)]
    assert [int8_dot.ISAS[i] for i in isas] == sorted(int8_dot.cpu_isas() & set(int8_dot.ISAS), key=int8_dot.ISAS.index)
    gen = torch.Generator().manual_seed(31 + bits)
    for i, (num_rows, num_cols, group_size) in enumerate(SHAPES):
        w = random_weight(num_rows, num_cols, group_size, bits, with_mins=i % 2 == 0, gen=gen)
        bias = torch.randn(num_rows, generator=gen) if i % 3 else None
        per_token = i % 4 == 1
        for rows in (1, 2, 5, 8, 13):
            x = random_x(rows, num_cols, torch.float32, gen)
            out = {isa: ops.linear(x, w.data, w.scales, w.mins, w.group_size, bits, num_cols, bias, isa,
                                   0 if per_token else int8_dot.BLOCK, KERNELS[kernel]) for isa in isas}
            for isa, y in out.items():
                assert_within_reference(y, x, w, bias, per_token, (int8_dot.ISAS[isa], i, rows))
                assert torch.equal(y, out[isas[0]]), (int8_dot.ISAS[isa], i, rows)


def _with_scales_in(w: qk.QuantizedWeight, dtype: torch.dtype) -> qk.QuantizedWeight:
    mins = None if w.mins is None else w.mins.to(dtype)
    return qk.QuantizedWeight(w.data, w.scales.to(dtype), mins, w.group_size, w.bits, w.shape)


@pytest.mark.parametrize("bits", [8, 4])
def test_float16_scales_give_every_kernel_the_bits_of_the_same_scales_in_float32(bits) -> None:
    # compact_scales keeps a file's scales and mins in float16; every kernel widens them exactly as it reads them, so
    # the rows kernel (decode's two-row path and row blocks), the panels packed per call and prepacked, on each ISA,
    # give the bits they give on those values stored in float32.
    ops = int8_dot.load_int8_dot_ops()
    isas = [i for i, _ in enumerate(int8_dot.ISAS) if ops.supported(i)]
    gen = torch.Generator().manual_seed(61 + bits)
    for i, (num_rows, num_cols, group_size) in enumerate(SHAPES):
        half = _with_scales_in(random_weight(num_rows, num_cols, group_size, bits, with_mins=i % 2 == 0, gen=gen),
                               torch.float16)
        wide = _with_scales_in(half, torch.float32)
        per_token = i % 4 == 1
        x_block = 0 if per_token else int8_dot.BLOCK
        for rows in (1, 2, 5):
            x = random_x(rows, num_cols, torch.float32, gen)
            for isa in isas:
                for panels in (False, True):
                    got = ops.linear(x, half.data, half.scales, half.mins, half.group_size, bits, num_cols, None, isa,
                                     x_block, panels)
                    want = ops.linear(x, wide.data, wide.scales, wide.mins, wide.group_size, bits, num_cols, None,
                                      isa, x_block, panels)
                    assert torch.equal(got, want), (i, rows, isa, panels)
            packed = int8_dot.panel_linear(x, int8_dot.pack_panels(half, per_token, amx=False))
            assert torch.equal(packed, int8_dot.panel_linear(x, int8_dot.pack_panels(wide, per_token, amx=False))), i


def k_quant_weight(num_rows: int, num_cols: int, group_size: int, bits: int, with_mins: bool,
                   gen: torch.Generator) -> tuple[qk.QuantizedWeight, qk.QuantizedWeight]:
    """A weight scaled as K-quants are (``d * sc`` and ``-dmin * m`` per group, d and dmin float16 values per 256
    columns), packed with those factors (int8 scales under them) and without (the same values in float32)."""
    supers = (num_rows, num_cols // qk.SUPER_BLOCK)
    per_super = qk.SUPER_BLOCK // group_size
    d = (torch.rand(supers, generator=gen) * 0.01 + 1e-3).half().float()
    dmin = -(torch.rand(supers, generator=gen) * 0.01).half().float()
    sc = torch.randint(-128, 128, (num_rows, num_cols // group_size), generator=gen).float()
    m = torch.randint(0, 64, sc.shape, generator=gen).float()
    scales = d.repeat_interleave(per_super, dim=1) * sc
    mins = dmin.repeat_interleave(per_super, dim=1) * m if with_mins else None
    q = torch.randint(*((0, 16) if bits == 4 else (-32, 32)), (num_rows, num_cols), generator=gen)
    factored = qk.pack(q, scales, mins, group_size, bits, d, dmin if with_mins else None)
    return factored, qk.pack(q, scales, mins, group_size, bits)


@pytest.mark.parametrize("bits", [8, 4])
def test_k_quant_scales_held_as_integers_give_every_kernel_the_bits_of_their_float32_values(bits) -> None:
    # pack holds a K-quant's group scales as int8 integers under a float32 factor per 256 columns (a byte a group, not
    # 4); the kernels widen each to the one float32 product the decoder made, so every route gives the same bits.
    ops = int8_dot.load_int8_dot_ops()
    isas = [i for i, _ in enumerate(int8_dot.ISAS) if ops.supported(i)]
    gen = torch.Generator().manual_seed(71 + bits)
    for i, (num_rows, num_cols, group_size) in enumerate([(5, 256, 32), (7, 512, 16), (70, 768, 32), (3, 256, 16),
                                                          (9, 512, 32), (16, 256, 16)]):
        factored, wide = k_quant_weight(num_rows, num_cols, group_size, bits, with_mins=i % 2 == 0, gen=gen)
        assert factored.scales.dtype == torch.int8 and factored.scale_supers is not None
        assert torch.equal(factored.float_scales, wide.scales)
        assert torch.equal(qk.dequantize(factored), qk.dequantize(wide))
        for rows in (1, 2, 5):
            x = random_x(rows, num_cols, torch.float32, gen)
            for isa in isas:
                for panels in (False, True):
                    got = ops.linear(x, factored.data, factored.scales, factored.mins, group_size, bits, num_cols, None,
                                     isa, 32, panels, factored.scale_supers, factored.min_supers)
                    want = ops.linear(x, wide.data, wide.scales, wide.mins, group_size, bits, num_cols, None, isa, 32,
                                      panels)
                    assert torch.equal(got, want), (i, rows, isa, panels)
            packed = int8_dot.panel_linear(x, int8_dot.pack_panels(factored, amx=False))
            assert torch.equal(packed, int8_dot.panel_linear(x, int8_dot.pack_panels(wide, amx=False))), i


def test_scales_that_are_no_integer_times_their_factor_stay_float32() -> None:
    gen = torch.Generator().manual_seed(9)
    factored, wide = k_quant_weight(4, 256, 32, 4, with_mins=True, gen=gen)
    scales = wide.scales.clone()
    scales[2, 3] = scales[2, 3] * 1.5 + 1e-7
    held = qk.pack(torch.randint(0, 16, (4, 256), generator=gen), scales, wide.mins, 32, 4, factored.scale_supers,
                   factored.min_supers)
    assert held.scales.dtype == torch.float32 and held.scale_supers is None
    five = qk.QuantizedWeight(torch.zeros(4, 256, dtype=torch.int8), factored.scales, None, 32, 8, (4, 256),
                              factored.scale_supers)
    assert not int8_dot.fits_five_bits(five)  # five-bit rows read float scales


def test_mins_in_another_dtype_than_the_scales_are_refused() -> None:
    w = random_weight(4, 64, 32, 4, with_mins=True, gen=torch.Generator().manual_seed(3))
    with pytest.raises(RuntimeError, match="mins must be"):
        int8_dot.int8_dot_linear(torch.randn(1, 64), qk.QuantizedWeight(w.data, w.scales.half(), w.mins, 32, 4, w.shape))


def test_the_decode_path_gives_each_output_bit_for_bit_what_the_one_row_kernel_gives() -> None:
    # At one row of x, rows n and n + N/2 go together (two_rows_dot); in a step of two rows each row runs the
    # row-at-a-time kernel. Both do the same float operations per output in the same order.
    gen = torch.Generator().manual_seed(7)
    for bits, group_size, with_mins in [(8, 32, False), (8, 16, False), (8, 32, True), (4, 32, True), (4, 16, True),
                                        (4, 64, False)]:
        w = random_weight(37, 640, group_size, bits, with_mins=with_mins, gen=gen)
        x = random_x(2, 640, torch.float32, gen)
        alone = int8_dot.int8_dot_linear(x[:1], w, panels=False)
        paired = int8_dot.int8_dot_linear(x, w, panels=False)[:1]
        assert torch.equal(alone, paired), (bits, group_size, with_mins)


def _magnitudes(w: qk.QuantizedWeight) -> qk.QuantizedWeight:
    """|codes| (-128 as 127, within a bound's rounding), |scales| and |mins| of int8 ``w`` as a weight (int4 codes
    and scales are already >= 0)."""
    data = w.data.to(torch.int16).abs().clamp(max=127).to(torch.int8) if w.bits == 8 else w.data
    mins = None if w.mins is None else w.mins.abs()
    return qk.QuantizedWeight(data, w.scales.abs(), mins, w.group_size, w.bits, w.shape)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("bits", [8, 4])
def test_int8_dot_linear_is_within_the_activation_rounding_of_the_exact_product(kernel, bits) -> None:
    # Each rounded x is off by at most half its block's step, so the result is off by at most
    # sum over blocks of step / 2 * sum |w| there (plus float32 sums).
    gen = torch.Generator().manual_seed(30 + bits)
    for num_rows, num_cols, group_size in SHAPES:
        w = random_weight(num_rows, num_cols, group_size, bits, with_mins=True, gen=gen)
        x = random_x(5, num_cols, torch.float32, gen)
        dense = qk.dequantize_reference(w).double()
        exact = x.double() @ dense.T
        for per_token in (False, True):
            _, scales = int8_dot.quantize_activations(x, per_token)
            step = scales.double().repeat_interleave(int8_dot.BLOCK, dim=1)[:, :num_cols]
            bound = (step / 2) @ dense.abs().T + 1e-5 * (x.double().abs() @ dense.abs().T) + 1e-5
            y = int8_dot.int8_dot_linear(x, w, None, per_token, KERNELS[kernel])
            assert ((y.double() - exact).abs() <= bound).all()


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


def test_quantize_activations_per_token_rounds_a_row_to_127_steps_of_its_max() -> None:
    x = torch.cat([torch.linspace(-1, 0.5, 32)[None], torch.full((1, 8), 4.0)], dim=1)
    codes, scales = int8_dot.quantize_activations(x, per_token=True)
    assert scales.shape == (1, 2) and scales[0].tolist() == pytest.approx([4 / 127, 4 / 127])
    assert codes[0, 32:].eq(127).all() and codes[0, 0] == -32  # -1 * 127 / 4 = -31.75


def test_dot_isa_picks_vnni_where_the_cpu_has_it_and_avx2_otherwise() -> None:
    def cpu(*flags: str) -> CpuInfo:
        return CpuInfo("x", 2, frozenset(flags))

    assert int8_dot.dot_isa(cpu("avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni")) == "avx512_vnni"
    assert int8_dot.dot_isa(cpu("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl")) == "avx2"  # Skylake-X
    assert int8_dot.dot_isa(cpu("avx2", "fma", "f16c")) == "avx2"
    assert int8_dot.dot_isa(cpu("avx2", "fma")) is None  # the kernels widen float16 scales by F16C
    assert int8_dot.dot_isa(cpu("avx", "sse4_2")) is None


def test_kernel_refuses_an_isa_this_cpu_lacks() -> None:
    ops = int8_dot.load_int8_dot_ops()
    vnni = int8_dot.ISAS.index("avx512_vnni")
    if ops.supported(vnni):
        pytest.skip("this CPU runs the VNNI kernel")
    w = qk.quantize(torch.randn(4, 64), 8, 32)
    for panels in (False, True):
        with pytest.raises(RuntimeError, match="this CPU does not run the int8 dot kernel for isa 1"):
            ops.linear(torch.randn(1, 64), w.data, w.scales, w.mins, 32, 8, 64, None, vnni, 32, panels)


def test_groups_the_kernels_do_not_take_are_refused_by_supports_and_by_the_kernel() -> None:
    w = qk.quantize(torch.randn(4, 72), 8, 24)
    assert not int8_dot.supports(w) and int8_dot.supports(qk.quantize(torch.randn(4, 72), 8, 16))
    with pytest.raises(RuntimeError, match="int8 dot products need groups of 16, of a multiple of 32 or of a "
                                           "whole row; got 24"):
        int8_dot.int8_dot_linear(torch.randn(1, 72), w)


def panel_weights(bits: int, per_token: bool, gen: torch.Generator) -> Iterator[tuple[int, qk.QuantizedWeight]]:
    """(index, weight) for each of SHAPES that packs for x rounded ``per_token`` or not, with mins on every other."""
    for i, (num_rows, num_cols, group_size) in enumerate(SHAPES):
        if group_size == 16 and per_token:
            continue  # w8a8 weights have groups of 32 or more
        yield i, random_weight(num_rows, num_cols, group_size, bits, with_mins=i % 2 == 0, gen=gen)


@pytest.mark.parametrize("per_token", [False, True])
@pytest.mark.parametrize("bits", [8, 4])
def test_prepacked_panels_give_bit_for_bit_what_the_panel_kernel_packing_per_call_gives(bits, per_token) -> None:
    gen = torch.Generator().manual_seed(11)
    for _, w in panel_weights(bits, per_token, gen):
        (num_rows, num_cols), group_size = w.shape, w.group_size
        packed = int8_dot.pack_panels(w, per_token)
        bias = torch.randn(num_rows, generator=gen)
        for rows in (1, 2, 5, 13):
            x = random_x(rows, num_cols, torch.float32, gen)
            expected = int8_dot.int8_dot_linear(x, w, bias, per_token, panels=True)
            assert torch.equal(int8_dot.panel_linear(x, packed, bias), expected), (num_rows, num_cols, group_size, rows)


@pytest.mark.parametrize("codes", [(-128, 128), (0, 16)], ids=["signed", "unsigned"])
def test_panel_argmax_is_torch_argmax_of_the_float32_logits_panel_linear_gives(codes) -> None:
    # Over many panels (both threads' sets, a last partial panel), ties (duplicated weight rows: the first column must
    # win, wherever the copies fall), columns tied by the bias, and NaN outputs (the first NaN wins). bf16 x too: the
    # argmax of the float32 logits of x.float(), which compute_logits gives the sampler in a bf16 model.
    gen = torch.Generator().manual_seed(23)
    for num_rows, per_token in [(4099, False), (1000, True), (40, False)]:
        w = random_weight(num_rows, 96, 32, 8, with_mins=codes[0] >= 0, gen=gen, codes=codes)
        w.data[num_rows - 1] = w.data[7]  # row 7 and the last: equal outputs in every row of x
        w.scales[num_rows - 1] = w.scales[7]
        if w.mins is not None:
            w.mins[num_rows - 1] = w.mins[7]
        bias = torch.randn(num_rows, generator=gen)
        bias[num_rows - 1] = bias[7]
        ops, x_block = int8_dot.load_int8_dot_ops(), 0 if per_token else int8_dot.BLOCK
        for isa in [i for i in range(len(int8_dot.ISAS)) if ops.supported(i)]:  # AVX2's panels, and VNNI's pairs
            packed = ops.pack_panels(w.data, w.scales, w.mins, w.group_size, 8, 96, isa, x_block)
            for rows in (2, 8, 16, 17, 39):
                for dtype in (torch.float32, torch.bfloat16):
                    for b in (None, bias):
                        x = random_x(rows, 96, dtype, gen)
                        logits = ops.panel_linear(x.float(), *packed, num_rows, 96, w.group_size, b, isa, x_block)
                        ids = ops.panel_argmax(x, *packed, num_rows, 96, w.group_size, b, isa, x_block)
                        assert torch.equal(ids, logits.argmax(dim=-1)), (isa, num_rows, rows, dtype)
        packed = int8_dot.pack_panels(w, per_token, amx=False)
        tied = bias.clone()
        tied[10:20] = bias.max() + 1e6  # outputs dominated by the bias: the first of the tied columns
        x = torch.zeros(3, 96)
        assert int8_dot.panel_argmax(x, packed, tied).tolist() == [10] * 3
        tied[15] = tied[10] * (1 + 2 ** -10)  # larger in float32, the same value in bf16: told apart for either x
        assert torch.equal(tied[15].bfloat16(), tied[10].bfloat16())
        assert int8_dot.panel_argmax(x, packed, tied).tolist() == [15] * 3
        assert int8_dot.panel_argmax(x.bfloat16(), packed, tied).tolist() == [15] * 3
        tied[[25, 35]] = float("nan")  # NaN outputs: argmax takes the first of them
        assert int8_dot.panel_argmax(x, packed, tied).tolist() == [25] * 3


def test_panel_argmax_under_grammar_masks_is_the_samplers_argmax_of_the_masked_logits_on_every_isa() -> None:
    # Masks of every kind: whole words banned or allowed, mixed words, a last partial word, rows left all-allowed,
    # a row allowing one column only, a mask narrower than the vocabulary (the columns past it banned), and banned
    # NaN outputs (ignored: the sampler's -inf covers them) beside an allowed NaN (it wins).
    from jido.sampling.filters import apply_token_bitmask

    gen = torch.Generator().manual_seed(29)
    num_rows, num_cols = 4099, 96
    w = random_weight(num_rows, num_cols, 32, 8, with_mins=False, gen=gen)
    bias = torch.randn(num_rows, generator=gen)
    ops = int8_dot.load_int8_dot_ops()
    isas = [i for i in range(len(int8_dot.ISAS)) if ops.supported(i)]
    assert isas, "no vector ISA runs the panels here"
    for isa in isas:
        packed = ops.pack_panels(w.data, w.scales, w.mins, w.group_size, 8, num_cols, isa, int8_dot.BLOCK)
        for rows in (2, 16, 17):
            for words in ((num_rows + 31) // 32, 100):  # the whole vocabulary, or its first 3,200 columns only
                x = random_x(rows, num_cols, torch.float32, gen)
                masks = torch.randint(-2**31, 2**31 - 1, (rows, words), generator=gen, dtype=torch.int32)
                masks[:, ::3] = 0
                masks[:, 1::5] = -1
                masks[0] = -1
                masks[1] = 0
                masks[1, 50] = 1 << 7  # row 1 allows column 1,607 alone
                for b in (None, bias):
                    logits = ops.panel_linear(x, *packed, num_rows, num_cols, w.group_size, b, isa, int8_dot.BLOCK)
                    if b is not None:
                        nan = torch.full((num_rows,), float("nan"))
                        b = torch.where(torch.arange(num_rows) % 997 == 5, nan, b)  # NaN outputs in some columns
                        logits = ops.panel_linear(x, *packed, num_rows, num_cols, w.group_size, b, isa,
                                                  int8_dot.BLOCK)
                    apply_token_bitmask(logits, torch.arange(rows), masks)
                    ids = ops.panel_argmax(x, *packed, num_rows, num_cols, w.group_size, b, isa, int8_dot.BLOCK,
                                           masks)
                    assert torch.equal(ids, logits.argmax(dim=-1)), (isa, rows, words, b is None)
                    assert ids[1] == 1607
    with pytest.raises(RuntimeError, match="allowed must be a contiguous int32"):
        ops.panel_argmax(x, *packed, num_rows, num_cols, w.group_size, None, isas[0], int8_dot.BLOCK,
                         masks[:1])


@pytest.mark.skipif(not int8_dot.amx_runs(), reason="needs AMX-INT8 tiles (and the kernels built)")
@pytest.mark.parametrize("per_token", [False, True])
@pytest.mark.parametrize("bits", [8, 4])
def test_amx_panels_give_bit_for_bit_what_the_vector_panels_give(bits, per_token) -> None:
    # Steps of 1-16 rows run as one tile block; past 16, in blocks of 16 with the last padded by zero rows.
    gen = torch.Generator().manual_seed(14)
    for i, w in panel_weights(bits, per_token, gen):
        (num_rows, num_cols), group_size = w.shape, w.group_size
        amx, vector = int8_dot.pack_panels(w, per_token, amx=True), int8_dot.pack_panels(w, per_token, amx=False)
        bias = torch.randn(num_rows, generator=gen) if i % 3 else None
        for rows in (1, 2, 15, 16, 17, 40):
            for dtype in (torch.float32, torch.bfloat16):  # bf16 x is rounded as it is, into bf16 outputs
                x = random_x(rows, num_cols, dtype, gen)
                expected = int8_dot.panel_linear(x, vector, bias)
                out = int8_dot.panel_linear(x, amx, bias)
                assert out.dtype == dtype and torch.equal(out, expected), (num_rows, num_cols, group_size, rows, dtype)


@pytest.mark.skipif(not int8_dot.amx_runs(), reason="needs AMX-INT8 tiles (and the kernels built)")
@pytest.mark.parametrize("codes,code_bits", [((-16, 16), 5), ((-32, 32), 6), ((0, 16), 4), ((-32, 33), 8)])
def test_amx_panels_of_narrow_codes_hold_them_in_fewer_bits_and_give_the_same_bits(codes, code_bits) -> None:
    # Codes spanning 31 / 63 values (Q5_0's, Q6_K's) in 5 / 6 bits, int8 codes of 0..15 in 4; a span of 64 stays bytes.
    gen = torch.Generator().manual_seed(16)
    for per_token in (False, True):
        for i, (num_rows, num_cols, group_size) in enumerate(SHAPES):
            if group_size == 16 and per_token:
                continue
            w = random_weight(num_rows, num_cols, group_size, 8, with_mins=i % 2 == 0, gen=gen, codes=codes)
            w.data[0, :2] = torch.tensor([codes[0], codes[1] - 1])  # the widest panel's span is the range's
            amx, vector = int8_dot.pack_panels(w, per_token, amx=True), int8_dot.pack_panels(w, per_token, amx=False)
            assert amx.code_bits == code_bits and vector.code_bits == 8
            padded = -(-num_cols // 32) * 32
            assert amx.codes.shape[1] == 16 * padded * {4: 64, 5: 80, 6: 96, 8: 128}[code_bits] // 128
            bias = torch.randn(num_rows, generator=gen) if i % 3 else None
            for rows in (1, 4, 17):
                x = random_x(rows, num_cols, torch.bfloat16, gen)
                expected = int8_dot.panel_linear(x, vector, bias)
                assert torch.equal(int8_dot.panel_linear(x, amx, bias), expected), (w.shape, group_size, rows)
                expected_ids = int8_dot.panel_linear(x.float(), amx, bias).argmax(dim=-1)
                assert torch.equal(int8_dot.amx_panel_argmax(x, amx, bias), expected_ids)


@pytest.mark.skipif(not int8_dot.amx_runs(), reason="needs AMX-INT8 tiles (and the kernels built)")
def test_amx_panels_of_one_wide_panel_stay_bytes() -> None:
    # The format is the weight's: one panel of full-range int8 codes keeps every panel in bytes.
    gen = torch.Generator().manual_seed(17)
    w = random_weight(48, 64, 32, 8, with_mins=False, gen=gen, codes=(-8, 8))
    assert int8_dot.pack_panels(w, amx=True).code_bits == 4
    w.data[40, :2] = torch.tensor([-128, 127], dtype=torch.int8)
    packed = int8_dot.pack_panels(w, amx=True)
    assert packed.code_bits == 8
    x = random_x(3, 64, torch.float32, gen)
    assert torch.equal(int8_dot.panel_linear(x, packed), int8_dot.panel_linear(x, int8_dot.pack_panels(w, amx=False)))


@pytest.mark.skipif(not int8_dot.amx_runs(), reason="needs AMX-INT8 tiles (and the kernels built)")
def test_amx_panel_argmax_is_torch_argmax_of_the_panels_float32_outputs() -> None:
    # Over many panels (both threads' ranges, a last partial panel), ties (duplicated weight rows: the first column
    # must win, wherever the copies fall), columns tied by the bias, and NaN outputs (the first NaN wins).
    gen = torch.Generator().manual_seed(21)
    for num_rows, per_token in [(4099, False), (1000, True), (40, False)]:
        w = random_weight(num_rows, 96, 32, 8, with_mins=False, gen=gen)
        w.data[num_rows - 1] = w.data[7]  # row 7 and the last: equal outputs in every row of x
        w.scales[num_rows - 1] = w.scales[7]
        packed = int8_dot.pack_panels(w, per_token, amx=True)
        bias = torch.randn(num_rows, generator=gen)
        bias[num_rows - 1] = bias[7]
        for rows in (2, 16, 17, 39):
            for dtype in (torch.float32, torch.bfloat16):
                x = random_x(rows, 96, dtype, gen)
                expected = int8_dot.panel_linear(x.float(), packed, bias).argmax(dim=-1)
                assert torch.equal(int8_dot.amx_panel_argmax(x, packed, bias), expected), (num_rows, rows, dtype)
        tied = bias.clone()
        tied[10:20] = bias.max() + 1e6  # outputs dominated by the bias: the first of the tied columns
        x = torch.zeros(3, 96)
        assert int8_dot.amx_panel_argmax(x, packed, tied).tolist() == [10] * 3
        tied[[25, 35]] = float("nan")  # NaN outputs: argmax takes the first of them
        assert int8_dot.amx_panel_argmax(x, packed, tied).tolist() == [25] * 3
        with pytest.raises(ValueError, match="AMX panels"):
            int8_dot.amx_panel_argmax(x, int8_dot.pack_panels(w, per_token, amx=False))


@pytest.mark.skipif(int8_dot.load_int8_dot_ops() is None or int8_dot.amx_runs(),
                    reason="needs the kernels built on a CPU (or process) without AMX-INT8 tiles")
def test_amx_panels_are_refused_with_a_clear_error_where_the_cpu_has_no_tiles() -> None:
    w = random_weight(16, 64, 32, 8, with_mins=False, gen=torch.Generator().manual_seed(15))
    assert not int8_dot.pack_panels(w).amx
    with pytest.raises(RuntimeError, match="cannot use AMX-INT8 tiles"):
        int8_dot.pack_panels(w, amx=True)


def test_narrow_codes_pack_unsigned_and_wide_ones_signed() -> None:
    gen = torch.Generator().manual_seed(12)
    narrow = random_weight(16, 64, 32, 8, with_mins=False, gen=gen, codes=(-20, 20))
    wide = random_weight(16, 64, 32, 8, with_mins=False, gen=gen)
    # a span of at most 127 codes is stored shifted, with the shift in a mins' term; a wider one as it is
    for amx in {False, int8_dot.amx_runs()}:
        packed_narrow, packed_wide = int8_dot.pack_panels(narrow, amx=amx), int8_dot.pack_panels(wide, amx=amx)
        assert all(packed_narrow.with_mins) and packed_narrow.mins.numel() > 0, amx
        assert not any(packed_wide.with_mins) and packed_wide.mins.numel() == 0, amx
    for w in (narrow, wide):
        x = random_x(3, 64, torch.float32, gen)
        assert_equals_reference(x, w, None, False, True, "panels")
        packed = int8_dot.pack_panels(w)
        assert torch.equal(int8_dot.panel_linear(x, packed), int8_dot.int8_dot_linear(x, w, panels=True))


def test_panels_packed_for_one_rounding_of_x_are_refused_for_the_other() -> None:
    # One scale per row (a whole-row group): per block of x, 20 chunks of 32 columns; per token, one chunk.
    w = random_weight(8, 640, None, 8, with_mins=False, gen=torch.Generator().manual_seed(13))
    per_block = int8_dot.pack_panels(w)
    mixed = int8_dot.PackedPanels(per_block.codes, per_block.scales, per_block.mins, per_block.meta, w.group_size,
                                  w.shape, per_token=True, amx=per_block.amx)
    with pytest.raises(RuntimeError, match="packed for another x_block"):
        int8_dot.panel_linear(torch.randn(2, 640), mixed)


@pytest.mark.parametrize("per_token", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_five_bit_rows_give_bit_for_bit_what_the_rows_kernel_gives_on_the_same_codes(dtype, per_token) -> None:
    # Q5_0's codes (-16..15) in five bits: the same int32 lanes, so the same float operations, on every ISA here.
    gen = torch.Generator().manual_seed(21)
    ops = int8_dot.load_int8_dot_ops()
    isas = [i for i, _ in enumerate(int8_dot.ISAS) if ops.supported(i)]
    for num_rows, num_cols, group_size in [(8, 640, 32), (7, 96, 32), (13, 128, 64), (9, 96, None), (1, 32, 32),
                                                 (6, 192, 96), (5, 160, 32)]:
        for with_mins in (False, True):
            w = random_weight(num_rows, num_cols, group_size, 8, with_mins, gen, codes=(-16, 16))
            assert int8_dot.fits_five_bits(w)
            five = int8_dot.pack_five_bits(w)
            assert five.data.shape == (num_rows, num_cols // 32 * 20)
            x = random_x(1, num_cols, dtype, gen)
            x_block = 0 if per_token else 32
            half = int8_dot.pack_five_bits(_with_scales_in(w, torch.float16))  # scales compact_scales kept in float16
            for isa in isas:
                expected = ops.linear(x, w.data, w.scales, w.mins, w.group_size, 8, num_cols, None, isa, x_block, False)
                ours = ops.five_bit_linear(x, five.data, five.scales, five.mins, w.group_size, num_cols, None, isa,
                                           x_block)
                assert ours.dtype == dtype
                torch.testing.assert_close(ours, expected, atol=0, rtol=0,
                                           msg=lambda m: f"{(num_rows, num_cols, group_size, with_mins, isa)}: {m}")
                wide = _with_scales_in(_with_scales_in(w, torch.float16), torch.float32)
                expected = ops.linear(x, wide.data, wide.scales, wide.mins, w.group_size, 8, num_cols, None, isa,
                                      x_block, False)
                ours = ops.five_bit_linear(x, half.data, half.scales, half.mins, w.group_size, num_cols, None, isa,
                                           x_block)
                assert torch.equal(ours, expected), (num_rows, num_cols, group_size, with_mins, isa)


def test_only_int8_codes_within_five_bits_and_whole_blocks_fit_five_bits() -> None:
    gen = torch.Generator().manual_seed(22)
    assert int8_dot.fits_five_bits(random_weight(4, 64, 32, 8, False, gen, codes=(-16, 16)))
    assert not int8_dot.fits_five_bits(random_weight(4, 64, 32, 8, False, gen, codes=(-17, 16)))
    assert not int8_dot.fits_five_bits(random_weight(4, 64, 32, 8, False, gen, codes=(-16, 17)))
    assert not int8_dot.fits_five_bits(random_weight(4, 64, 16, 8, False, gen, codes=(-16, 16)))  # groups of 16
    assert not int8_dot.fits_five_bits(random_weight(4, 67, 32, 8, False, gen, codes=(-16, 16)))  # partial block
    assert not int8_dot.fits_five_bits(random_weight(4, 64, 32, 4, False, gen))  # already four bits


def fifth_bits_word(u: list[int]) -> int:
    """A block's word of fifth bits: column 4 * i + b at bit 8 * b + i."""
    return sum(1 << (8 * (j % 4) + j // 4) for j in range(32) if u[j] >= 16)


def test_five_bit_rows_store_each_code_plus_16_in_a_nibble_and_a_bit() -> None:
    u = list(range(32))
    v = [(7 * j + 3) % 32 for j in range(32)]
    q = torch.tensor([u + v + u], dtype=torch.int8) - 16  # three blocks: a pair, then one alone
    five = int8_dot.pack_five_bits(qk.pack(q, torch.ones(1, 3), None, 32, 8))
    data = five.data[0].tolist()
    assert len(data) == 60
    assert data[:32] == [(u[j] & 15) | ((v[j] & 15) << 4) for j in range(32)]  # the pair's nibbles
    assert int.from_bytes(bytes(data[32:36]), "little") == fifth_bits_word(u)
    assert int.from_bytes(bytes(data[36:40]), "little") == fifth_bits_word(v)
    assert data[40:56] == [(j & 15) | (((j + 16) & 15) << 4) for j in range(16)]  # the last block's
    assert int.from_bytes(bytes(data[56:60]), "little") == fifth_bits_word(u)


def test_quantize_per_token_gives_the_codes_and_scales_of_the_rounding_the_kernels_use() -> None:
    gen = torch.Generator().manual_seed(21)
    x = torch.randn(7, 83, generator=gen) * torch.linspace(0.1, 9, 83)  # a partial last block; one all-zero row
    x[3] = 0
    codes, scales = int8_dot.load_int8_dot_ops().quantize_per_token(x)
    expected_codes, expected_scales = int8_dot.quantize_activations(x, per_token=True)
    assert codes.dtype == torch.int8 and codes.shape == (7, 83)
    assert torch.equal(codes, expected_codes)
    assert torch.equal(scales, expected_scales[:, 0])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("contiguous", [True, False], ids=["contiguous", "strided"])
def test_quantize_per_token_with_a_channel_scale_rounds_x_times_it_in_xs_dtype(dtype, contiguous) -> None:
    # w8a8's smoothing: the codes of x * s^-1 as x's dtype computes the product (bf16: rounded back to bf16), on the
    # vector path (contiguous float32 / bf16) and the generic one (a strided x) alike.
    gen = torch.Generator().manual_seed(22)
    x = (torch.randn(9, 83 * 2, generator=gen) * torch.linspace(0.1, 40, 83 * 2)).to(dtype)
    x = x[:, ::2] if not contiguous else x[:, :83].contiguous()
    inv = (1 / torch.linspace(0.5, 30, 83)).to(dtype)  # values of x's dtype, as the layers hold them
    codes, scales = int8_dot.load_int8_dot_ops().quantize_per_token(x, inv.float())
    expected_codes, expected_scales = int8_dot.quantize_activations((x * inv).float(), per_token=True)
    assert torch.equal(codes, expected_codes)
    assert torch.equal(scales, expected_scales[:, 0])
    with pytest.raises(RuntimeError, match="channel_scale must be contiguous float32"):
        int8_dot.load_int8_dot_ops().quantize_per_token(x, inv.float()[:80])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("num_rows,num_cols,rows_x", [(70, 96, 1), (33, 83, 64), (640, 2048, 130)])
def test_int_mm_linear_equals_float64_math_on_the_rounded_activations(dtype, num_rows, num_cols, rows_x) -> None:
    gen = torch.Generator().manual_seed(num_rows + rows_x)
    w = qk.quantize(torch.randn(num_rows, num_cols, generator=gen) * 0.05, 8, None)  # w8a8's weights
    assert int8_dot.takes_int_mm(w)
    x = (torch.randn(rows_x, num_cols, generator=gen) * 3).to(dtype)
    bias = torch.randn(num_rows, generator=gen)
    y = int8_dot.int_mm_linear(x, w, bias)
    assert y.dtype == dtype and y.shape == (rows_x, num_rows)
    ref = int8_dot.int8_dot_linear_reference(x, w, bias, per_token=True)
    magnitude = int8_dot.int8_dot_linear_reference(x.abs(), _magnitudes(w), None, True) + bias.abs().double()
    rounding = 2e-6 if dtype == torch.float32 else 2**-8  # float32 sums; bf16's rounding of the result
    assert torch.all((y.double() - ref).abs() <= rounding * magnitude + 1e-6)


@pytest.mark.skipif(not int8_dot.int_mm_fuses_gated(), reason="needs AVX-512 BF16 (and the kernels built)")
@pytest.mark.parametrize("num_cols", [83, 4096])
def test_scale_sums_into_bf16_gives_the_bits_of_float32_then_bf16(num_cols) -> None:
    # One pass from the int32 sums to bf16 rounds as torch rounds the float32 result; 83 columns: a masked tail.
    gen = torch.Generator().manual_seed(num_cols)
    ops = int8_dot.load_int8_dot_ops()
    sums = torch.randint(-2**24, 2**24, (37, num_cols), generator=gen, dtype=torch.int32)
    x_scales, w_scales = torch.rand(37, generator=gen) * 0.1, torch.rand(num_cols, generator=gen) * 0.01
    for bias in (None, torch.randn(num_cols, generator=gen)):
        expected = ops.scale_sums(sums, x_scales, w_scales, bias).to(torch.bfloat16)
        assert torch.equal(ops.scale_sums(sums, x_scales, w_scales, bias, True, -1), expected)


@pytest.mark.skipif(not int8_dot.int_mm_fuses_gated(), reason="needs AVX-512 BF16 (and the kernels built)")
@pytest.mark.parametrize("act,name", [(0, "silu"), (1, "gelu_pytorch_tanh")])
@pytest.mark.parametrize("intermediate,rows_x,k", [(40, 64, 96), (2048, 70, 640)])
def test_int_mm_gated_gives_the_bits_of_the_int_mm_route_then_act_and_mul(act, name, intermediate, rows_x, k) -> None:
    # gate rows, then up rows; 40 wide: the last 16 columns of each half masked
    from jido.layers.activation import get_gated_activation

    gen = torch.Generator().manual_seed(intermediate + act)
    w = qk.quantize(torch.randn(2 * intermediate, k, generator=gen) * 0.05, 8, None)
    x = random_x(rows_x, k, torch.bfloat16, gen) * 4
    inv = (1 / torch.linspace(0.5, 3, k)).bfloat16().float()  # a smoothed layer's channel scale
    for channel_scale in (None, inv):
        gated = int8_dot.int_mm_gated(x, w, act, None, channel_scale)
        expected = get_gated_activation(name)(int8_dot.int_mm_linear(x, w, None, channel_scale))
        assert gated.shape == (rows_x, intermediate) and torch.equal(gated, expected)
    with pytest.raises(ValueError, match="bf16 x"):
        int8_dot.int_mm_gated(x.float(), w, act)


@pytest.mark.skipif(not int8_dot.amx_runs(), reason="needs AMX-INT8 tiles (and the kernels built)")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("num_rows,num_cols,rows_x", [(70, 64, 1), (32, 128, 31), (100, 640, 33), (640, 2048, 130),
                                                      (17, 192, 257)])
def test_amx_gemm_gives_the_bits_of_the_int_mm_route(dtype, num_rows, num_cols, rows_x) -> None:
    # The same codes, exact int32 sums and the same two scale products: bit for bit torch._int_mm's route without a
    # bias; with one, up to the last bit of its add (which scale_sums may fuse). Rows and columns not filling a
    # 32 x 32 block of tiles (1, 31, 33, 257; 17, 70, 100) check the padded rows and the masked columns.
    gen = torch.Generator().manual_seed(num_rows * 3 + rows_x)
    w = qk.quantize(torch.randn(num_rows, num_cols, generator=gen) * 0.05, 8, None)
    assert int8_dot.takes_amx_gemm(w)
    gemm = int8_dot.pack_amx_gemm(w)
    x = random_x(rows_x, num_cols, dtype, gen)
    y = int8_dot.amx_gemm_linear(x, gemm, None)
    assert y.dtype == dtype and y.shape == (rows_x, num_rows)
    assert torch.equal(y, int8_dot.int_mm_linear(x, w, None))
    bias = torch.randn(num_rows, generator=gen)
    expected = int8_dot.int_mm_linear(x, w, bias)
    # a fused add rounds once where the unfused rounds the product too: an ulp of the terms, then the dtype's rounding
    terms = int8_dot.int_mm_linear(x.float(), w, None).abs() + bias.abs()
    bound = terms * 2**-23 + (0 if dtype == torch.float32 else expected.float().abs() * 2**-7)
    assert torch.all((int8_dot.amx_gemm_linear(x, gemm, bias).float() - expected.float()).abs() <= bound)


@pytest.mark.skipif(not int8_dot.amx_runs(), reason="needs AMX-INT8 tiles (and the kernels built)")
@pytest.mark.parametrize("act,name", [(0, "silu"), (1, "gelu_pytorch_tanh")])
@pytest.mark.parametrize("intermediate,rows_x,k", [(2048, 70, 128), (40, 33, 128), (16, 1, 128), (48, 300, 640)])
def test_amx_gemm_gated_gives_the_bits_of_the_int_mm_route_then_act_and_mul(act, name, intermediate, rows_x,
                                                                             k) -> None:
    # gate rows, then up rows: each output is act(gate) * up of the bf16 products, bit for bit; 40 wide, the last
    # block of 16 half full; K 640 over 300 rows: ten steps a block, rows in several groups of 32.
    from jido.layers.activation import get_gated_activation

    gen = torch.Generator().manual_seed(intermediate + rows_x + act)
    w = qk.quantize(torch.randn(2 * intermediate, k, generator=gen) * 0.05, 8, None)
    x = random_x(rows_x, k, torch.bfloat16, gen) * 4
    gated = int8_dot.amx_gemm_gated(x, int8_dot.pack_amx_gemm(w, gated=True), act)
    expected = get_gated_activation(name)(int8_dot.int_mm_linear(x, w, None))
    assert gated.shape == (rows_x, intermediate) and torch.equal(gated, expected)
    with pytest.raises(ValueError, match="gated packing"):
        int8_dot.amx_gemm_linear(x, int8_dot.pack_amx_gemm(w, gated=True))


def test_amx_gemm_takes_only_int_mm_weights_whose_k_fills_tile_multiplies() -> None:
    gen = torch.Generator().manual_seed(23)
    assert not int8_dot.takes_amx_gemm(qk.quantize(torch.randn(16, 96, generator=gen), 8, None))  # K 96: not 64s
    assert not int8_dot.takes_amx_gemm(qk.quantize(torch.randn(16, 128, generator=gen), 8, 32))
    with pytest.raises(RuntimeError, match="multiple of 64"):
        int8_dot.load_int8_dot_ops().pack_amx_gemm(torch.zeros(16, 96, dtype=torch.int8), False)


def test_int_mm_takes_only_int8_codes_scaled_per_row() -> None:
    gen = torch.Generator().manual_seed(22)
    weight = torch.randn(16, 64, generator=gen)
    assert int8_dot.takes_int_mm(qk.quantize(weight, 8, None))
    assert not int8_dot.takes_int_mm(qk.quantize(weight, 8, 32))  # group scales: not one GEMM
    assert not int8_dot.takes_int_mm(qk.quantize(weight, 4, None))  # int4 with mins
