"""The C++ bf16 prefill kernels (``csrc/flash_prefill.cpp``) against float64 attention over random shapes, GQA
ratios, windows, soft-caps, block sizes and cached prefixes. The oneDNN one: with oneDNN's AMX packing where this
CPU has AMX, and with jido's own VNNI packing on oneDNN's AVX-512 BF16 kernels (as on a Zen 4), in-process on such
a CPU and, on an AMX machine, in a process whose oneDNN is held to that ISA. The AMX tile one where this CPU has
AMX-BF16."""
from __future__ import annotations

import logging
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from paged_cases import make_case, reference, run

from jido.attention import cpu_extension, tiled_backend
from jido.attention.backend import AttentionLayerSpec
from jido.attention.tiled_backend import TiledAttentionBackend
from jido.utils import cpp_build
from jido.utils.cpu import cpu_info

needs_bf16 = pytest.mark.skipif(not cpu_info().has_native_bf16, reason="the kernel runs where bf16 is native")
# (a build forced to another ISA by JIDO_BUILD_ISA has no tile code)
TILES_BUILD = "amx_bf16" in cpu_info().flags and os.environ.get(cpp_build.BUILD_ISA_ENV, "amx") == "amx"
needs_amx = pytest.mark.skipif(not TILES_BUILD, reason="the tile kernel runs where AMX-BF16 is, in the AMX build")
TOLERANCE = {"atol": 3e-2, "rtol": 2e-2}  # bf16 inputs and output
# The random prefills' seeds come from one fixed seed, so a run is replayed exactly; each failure names its own seed.
_SEEDS = random.Random(20261207)


def check_random_prefills(draws: int, tiles: bool = False) -> None:
    """``draws`` random steps of prefills (no decode rows: queries of 17+ tokens) through the oneDNN kernel (or with
    ``tiles`` the AMX tile one), each against the float64 reference; the seed is in a failure's message."""
    kernel = cpu_extension.load_tile_prefill() if tiles else cpu_extension.load_flash_prefill(on_amx=True)
    assert kernel is not None
    for _ in range(draws):
        seed = _SEEDS.randrange(2**32)
        rng = random.Random(seed)
        backend = TiledAttentionBackend(prefill_query_tile=rng.choice([1, 7, 16, 64] if tiles else [16, 64]))
        backend._cpp_prefill_kernel = lambda spec, q, kv_cache: (kernel, backend.prefill_query_tile)
        num_kv_heads, group, head_dim = rng.choice([1, 2]), rng.choice([1, 2, 4]), rng.choice([64, 128, 256])
        window = rng.choice([None, rng.randint(1, 150)])
        softcap = rng.choice([None, rng.uniform(5.0, 30.0)])
        requests = [(rng.choice([0, rng.randint(1, 200)]), rng.randint(17, 300)) for _ in range(rng.randint(1, 3))]
        block_size = rng.choice([4, 16, 32])
        spec = AttentionLayerSpec(num_kv_heads * group, num_kv_heads, head_dim, head_dim**-0.5, window, softcap)
        case = make_case(requests, spec.num_heads, num_kv_heads, block_size, seed=seed, backend=backend,
                         dtype=torch.bfloat16, head_dim=head_dim)
        torch.testing.assert_close(run(spec, case).float(), reference(spec, case), **TOLERANCE,
                                   msg=lambda m: f"seed {seed}, {spec}, {requests}, block {block_size}, tile "
                                                         f"{backend.prefill_query_tile}: {m}")


@needs_bf16
def test_cpp_prefill_matches_float64_reference() -> None:
    check_random_prefills(6)


@needs_amx
def test_tile_prefill_matches_float64_reference() -> None:
    check_random_prefills(6, tiles=True)


@needs_amx
def test_tile_prefill_runs_where_amx_runs_and_is_the_backends_choice() -> None:
    assert cpu_extension.load_tile_prefill() is not None
    spec = AttentionLayerSpec(8, 2, 128, 128**-0.5)
    q = torch.zeros(3, 8, 128, dtype=torch.bfloat16)
    kernel, query_tile = TiledAttentionBackend()._cpp_prefill_kernel(spec, q, q)
    assert kernel is cpu_extension.load_tile_prefill() and query_tile == tiled_backend.TILE_PREFILL_ROWS // 4


@needs_amx
def test_tile_prefill_of_a_long_context_merges_its_key_segments() -> None:
    # 2,600 keys are three segments of the kernel's 1,024: each row's softmax is merged across them.
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(40, 4, 64, generator=gen).bfloat16()
    keys, values = (torch.randn(1, 2600, 64, generator=gen).bfloat16() for _ in range(2))
    out = torch.full_like(q, float("nan"))
    cpu_extension.load_tile_prefill()(out, q, keys, values, 0.125, 2560, 0, 0, 0.0, 16)
    scores = torch.einsum("qhd,kd->hqk", q.double(), keys[0].double()) * 0.125
    scores = scores.masked_fill(torch.arange(2600)[None, None] > torch.arange(2560, 2600)[None, :, None], -torch.inf)
    expected = torch.einsum("hqk,kd->qhd", scores.softmax(-1), values[0].double())
    torch.testing.assert_close(out.double(), expected, **TOLERANCE)


@needs_bf16
@pytest.mark.parametrize("tiles", [False, True])
def test_prefill_kernels_read_q_keys_and_values_as_views_of_a_fused_projection(tiles: bool) -> None:
    if tiles and not TILES_BUILD:
        pytest.skip("the tile kernel runs where AMX-BF16 is, in the AMX build")
    kernel = cpu_extension.load_tile_prefill() if tiles else cpu_extension.load_flash_prefill(on_amx=True)
    # One token's row of a fused projection: 4 query heads, then 2 KV heads of keys, then of values.
    qkv = torch.randn(90, (4 + 2 + 2) * 64, generator=torch.Generator().manual_seed(1)).bfloat16()
    q = qkv[:, : 4 * 64].view(90, 4, 64)
    keys = qkv[:, 4 * 64 : 6 * 64].view(90, 2, 64).transpose(0, 1)
    values = qkv[:, 6 * 64 :].view(90, 2, 64).transpose(0, 1)
    assert not (q.is_contiguous() or keys.is_contiguous() or values.is_contiguous())
    strided, dense = (torch.empty(90, 4, 64, dtype=torch.bfloat16) for _ in range(2))
    kernel(strided, q, keys, values, 0.125, 0, 0, 30, 0.0, 16)
    kernel(dense, q.contiguous(), keys.contiguous(), values.contiguous(), 0.125, 0, 0, 30, 0.0, 16)
    assert torch.equal(strided, dense)


@pytest.mark.skipif("amx_bf16" not in cpu_info().flags, reason="tests the AVX-512 BF16 path on an AMX machine")
def test_cpp_prefill_without_amx_packs_its_own_vnni_layout_and_matches_reference() -> None:
    # ONEDNN_MAX_CPU_ISA makes oneDNN run as on an AVX-512 BF16 CPU without AMX: its packing refuses, so the kernel
    # packs keys and values itself, in the layout oneDNN's AVX-512 BF16 brgemm reads.
    script = ("import torch; from jido.attention import cpu_extension; import test_cpp_prefill as t; "
              "cpu_extension.load_flash_prefill(on_amx=True); assert not torch.ops.jido_cpu_prefill.amx(); "
              "t.check_random_prefills(4)")
    env = {**os.environ, "ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16"}
    done = subprocess.run([sys.executable, "-c", script], cwd=Path(__file__).parent, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]


@needs_bf16
def test_cpp_prefill_that_onednn_refuses_at_load_falls_back_to_sdpa_with_a_warning() -> None:
    # Held to AVX2, oneDNN refuses bf16 micro-kernels: the load-time self-check catches it, so no request meets it.
    script = ("import logging; logging.basicConfig(); from jido.attention import cpu_extension; "
              "assert cpu_extension.load_flash_prefill(on_amx=True) is None")
    env = {**os.environ, "ONEDNN_MAX_CPU_ISA": "AVX2"}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "C++ prefill attention unavailable" in done.stderr and "using PyTorch's SDPA for prefill" in done.stderr


@needs_bf16
def test_cpp_prefill_build_failure_falls_back_to_sdpa_with_a_warning(tmp_path, monkeypatch, caplog) -> None:
    broken = tmp_path / "flash_prefill.cpp"
    broken.write_text("#error this source does not compile\n")
    monkeypatch.setattr(cpp_build, "CACHE_ROOT", tmp_path / "build")
    monkeypatch.setattr(tiled_backend, "load_flash_prefill", lambda: cpu_extension.load_flash_prefill(broken))
    monkeypatch.setattr(tiled_backend, "load_tile_prefill", lambda: cpu_extension.load_tile_prefill(broken))
    with caplog.at_level(logging.WARNING, logger=cpp_build.__name__):
        spec = AttentionLayerSpec(4, 1, 64, 0.125, sliding_window=40)
        case = make_case([(30, 50), (0, 90)], 4, 1, block_size=16, backend="tiled", dtype=torch.bfloat16,
                         head_dim=64)
        torch.testing.assert_close(run(spec, case).float(), reference(spec, case), **TOLERANCE)
    assert cpu_extension.load_flash_prefill(broken) is None and cpu_extension.load_tile_prefill(broken) is None
    assert "C++ prefill attention unavailable" in caplog.text and "using PyTorch's SDPA for prefill" in caplog.text


@needs_bf16
def test_cpp_prefill_rejects_what_it_cannot_run() -> None:
    kernel = cpu_extension.load_flash_prefill(on_amx=True)
    assert kernel is not None, "the C++ prefill kernel did not build here"
    q = torch.zeros(8, 2, 64, dtype=torch.bfloat16)
    keys = torch.zeros(1, 8, 64, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="bfloat16 tensors"):
        kernel(q.float(), q.float(), keys.float(), keys.float(), 0.1, 0, 0, 0, 0.0, 64)
    with pytest.raises(RuntimeError, match="head sizes"):
        kernel(q[..., :32].contiguous(), q[..., :32].contiguous(), keys[..., :32].contiguous(),
               keys[..., :32].contiguous(), 0.1, 0, 0, 0, 0.0, 64)
    with pytest.raises(RuntimeError, match="cover every query"):
        kernel(q, q, keys[:, :4].contiguous(), keys[:, :4].contiguous(), 0.1, 0, 0, 0, 0.0, 64)
