"""Every registered backend, and the tiled one with tiny tiles on both decode paths, against float64 attention
over random shapes, dtypes, GQA ratios, windows, soft-caps, block sizes and prefix lengths."""
from __future__ import annotations

import logging
import random
import subprocess
import sys

import pytest
import torch
from paged_cases import make_case, reference, run

from jido.attention import cpu_extension, tiled_backend
from jido.utils import cpp_build
from jido.attention.backend import AttentionBackend, AttentionLayerSpec
from jido.attention.registry import supported_attention_backends
from jido.attention.tiled_backend import TiledAttentionBackend

# bf16 keeps 8 bits of mantissa: inputs and the output are rounded, so compare loosely.
TOLERANCE = {torch.float32: {"atol": 3e-5, "rtol": 1e-5}, torch.bfloat16: {"atol": 3e-2, "rtol": 2e-2}}
# The random cases' seeds come from one fixed seed, so a run is replayed exactly; each failure names its own seed.
_SEEDS = random.Random(20261207)


def _check_random_case(backend: str | AttentionBackend, dtype: torch.dtype, max_len: int = 200) -> None:
    """One random step (its seed, drawn from _SEEDS, is in the failure message) against the float64 reference;
    prefixes and queries up to ``max_len`` tokens."""
    seed = _SEEDS.randrange(2**32)
    rng = random.Random(seed)
    num_kv_heads, group = rng.choice([1, 2, 4]), rng.choice([1, 2, 4])
    head_dim, block_size = rng.choice([8, 32, 64, 256]), rng.choice([1, 4, 16, 32])
    window = rng.choice([None, rng.randint(1, 80)])
    softcap = rng.choice([None, rng.uniform(1.0, 30.0)])
    requests = [(rng.choice([0, rng.randint(1, max_len)]), rng.choice([1, 1, rng.randint(2, max_len)]))
                for _ in range(rng.randint(1, 6))]
    params = dict(num_kv_heads=num_kv_heads, group=group, head_dim=head_dim, block_size=block_size, window=window,
                  softcap=softcap, requests=requests)
    spec = AttentionLayerSpec(num_kv_heads * group, num_kv_heads, head_dim, head_dim**-0.5, window, softcap)
    case = make_case(requests, spec.num_heads, num_kv_heads, block_size, seed=seed, backend=backend, dtype=dtype,
                     head_dim=head_dim)
    out = run(spec, case)
    assert out.dtype == dtype
    torch.testing.assert_close(out.float(), reference(spec, case), **TOLERANCE[dtype],
                               msg=lambda m: f"seed {seed}, {params}: {m}")


@pytest.mark.parametrize("draw", range(8))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
# triton draws its own random shapes in test_triton_backend.py (fp32 only: the interpreter's bf16 dot is wrong).
@pytest.mark.parametrize("backend", [name for name in supported_attention_backends() if name != "triton"])
def test_random_step_matches_float64_reference(backend: str, dtype: torch.dtype, draw: int) -> None:
    _check_random_case(backend, dtype)


@pytest.mark.parametrize("draw", range(6))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("cpp_decode", [True, False], ids=["cpp_decode", "torch_decode"])
def test_tiled_backend_with_tiny_tiles_and_splits_matches_reference(cpp_decode: bool, dtype: torch.dtype,
                                                                     draw: int) -> None:
    # Tiles of 3 queries and 2 blocks, decode splits of 1 block: every merge and rescale path runs.
    backend = TiledAttentionBackend(query_tile=3, key_tile_blocks=2, decode_split_blocks=1, use_cpp_decode=cpp_decode,
                                    dense_prefill_max_scores=0)  # every prefill through the tiled loop
    _check_random_case(backend, dtype, max_len=40)


def test_tiled_new_keys_and_values_land_in_their_slots() -> None:
    case = make_case([(0, 7), (5, 3), (13, 1)], 4, 2, block_size=4, backend="tiled")
    run(AttentionLayerSpec(4, 2, 16, 0.25), case)
    block_ids, offsets = case.metadata.slot_mapping // 4, case.metadata.slot_mapping % 4
    for cache, new in ((case.kv_cache[0], case.k), (case.kv_cache[1], case.v)):
        # [blocks, kv_heads, block_size, head_dim] read at (block, :, offset) -> [num_tokens, kv_heads, head_dim]
        torch.testing.assert_close(cache[block_ids, :, offsets].flatten(1), new, atol=0, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("tokens", [13, 600])  # 600: a prefill's rows, split over the threads
def test_cpp_kv_write_fills_the_same_slots_as_the_pytorch_write(dtype, tokens, monkeypatch) -> None:
    # k and v as the model hands them over: strided column splits of one fused QKV output.
    gen = torch.Generator().manual_seed(11)
    num_blocks, kv_heads, block_size, head_dim = 160, 2, 4, 16
    qkv = torch.randn(tokens, 3 * kv_heads * head_dim, generator=gen).to(dtype)
    k, v = qkv[:, kv_heads * head_dim:2 * kv_heads * head_dim], qkv[:, 2 * kv_heads * head_dim:]
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:tokens]
    shape = TiledAttentionBackend.get_kv_cache_shape(num_blocks, block_size, kv_heads, head_dim, dtype)
    ours = torch.full(shape, float("nan"), dtype=dtype)  # poisoned: a slot written twice or not at all shows
    tiled_backend.write_kv(ours, k, v, slots)
    # One slot past the cache, last: the call fails and no row of the step is written.
    untouched = ours.clone()
    bad = torch.cat([torch.randperm(num_blocks * block_size, generator=gen)[:tokens - 1],
                     torch.tensor([num_blocks * block_size])])
    with pytest.raises(RuntimeError, match="outside the cache"):
        tiled_backend.write_kv(untouched, torch.zeros_like(k), torch.zeros_like(v), bad)
    torch.testing.assert_close(untouched, ours, atol=0, rtol=0, equal_nan=True)
    monkeypatch.setattr(tiled_backend, "load_write_kv", lambda: None)
    expected = torch.full(shape, float("nan"), dtype=dtype)
    tiled_backend.write_kv(expected, k, v, slots)
    torch.testing.assert_close(ours, expected, atol=0, rtol=0, equal_nan=True)
    assert int(torch.isnan(ours).logical_not().sum()) == 2 * tokens * kv_heads * head_dim


def test_cpp_decode_build_failure_falls_back_to_pytorch_with_a_warning(tmp_path, monkeypatch, caplog) -> None:
    broken = tmp_path / "paged_decode.cpp"
    broken.write_text("#error this source does not compile\n")
    monkeypatch.setattr(cpp_build, "CACHE_ROOT", tmp_path / "build")
    monkeypatch.setattr(tiled_backend, "load_paged_decode", lambda: cpu_extension.load_paged_decode(broken))
    with caplog.at_level(logging.WARNING, logger=cpp_build.__name__):
        spec = AttentionLayerSpec(4, 1, 16, 0.25, sliding_window=9)
        case = make_case([(30, 1), (3, 1), (70, 1)], 4, 1, block_size=4, backend="tiled")
        torch.testing.assert_close(run(spec, case), reference(spec, case), atol=2e-5, rtol=0)
    assert cpu_extension.load_paged_decode(broken) is None
    assert "C++ attention kernels unavailable" in caplog.text and "using the PyTorch decode path" in caplog.text


def test_cpp_decode_kernel_builds_on_this_machine() -> None:
    # The fallback keeps jido correct without a compiler; this says when the fast path silently went missing.
    assert cpu_extension.load_paged_decode() is not None


def test_a_build_lock_left_by_a_killed_process_does_not_hang_the_next_load() -> None:
    # torch waits forever on a build folder's `lock` file; a process killed inside its load leaves one behind.
    cached = cpp_build.CACHE_ROOT / cpp_build.build_key("jido_cpu_attn", cpu_extension.SOURCE, cpp_build.target_isa())
    if not (cached / f"{cached.name}.so").exists():
        pytest.skip("the paged decode kernel is not built yet")
    # The build folder itself, built already, so a load only takes the locks: a copy elsewhere would be rebuilt
    # (the build names the paths of its folder's copies of the sources).
    lock = cached / "lock"
    lock.touch()
    try:
        # A fresh process, as after the kill: a process holds one build of a library only.
        script = "from jido.attention import cpu_extension; assert cpu_extension.load_paged_decode() is not None"
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=180)
        assert done.returncode == 0, done.stderr[-2000:]
        assert not lock.exists() and "left by a process that died" in done.stderr
    finally:
        lock.unlink(missing_ok=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("window", [None, 7], ids=["global", "window7"])
def test_speculative_verify_rows_attend_as_runs_and_match_the_float64_reference(dtype: torch.dtype,
                                                                                 window: int | None) -> None:
    # Verify steps of K + 1 rows (and a 16-token prompt, the longest run) among plain decodes; decode splits of one
    # block, so each run's items cut rows' key ranges at every block edge, including blocks a row cannot see.
    spec = AttentionLayerSpec(8, 2, 32, 32**-0.5, window, 20.0)
    requests = [(37, 5), (0, 1), (3, 2), (60, 1), (12, 16), (29, 9), (1, 3)]
    for split in (1, 2, 32):
        backend = TiledAttentionBackend(decode_split_blocks=split)
        case = make_case(requests, 8, 2, block_size=4, seed=split, backend=backend, dtype=dtype, head_dim=32)
        torch.testing.assert_close(run(spec, case).float(), reference(spec, case), **TOLERANCE[dtype])


def test_rows_sharing_blocks_at_consecutive_positions_give_each_row_its_own_attention() -> None:
    # The kernel runs rows whose blocks are the same as one run whether or not they are one request's: two
    # decodes of requests sharing a prompt's blocks at positions 40 and 41 (the second row sees one key more)
    # must each get what that row gets alone.
    kernel = cpu_extension.load_paged_decode()
    gen = torch.Generator().manual_seed(3)
    cache = torch.randn(2, 12, 1, 8, 64, generator=gen)
    table = torch.randperm(12, generator=gen)[:6].int()
    q = torch.randn(3, 4, 64, generator=gen)
    tables, lens = table.repeat(3, 1).contiguous(), torch.tensor([40, 41, 42], dtype=torch.int32)
    together = torch.empty_like(q)
    kernel(together, q, cache, tables, lens, 0.125, 0, 0.0, 2)
    for row in range(3):
        alone = torch.empty_like(q[row:row + 1])
        kernel(alone, q[row:row + 1].contiguous(), cache, tables[row:row + 1], lens[row:row + 1], 0.125, 0, 0.0, 2)
        torch.testing.assert_close(together[row:row + 1], alone, atol=2e-6, rtol=1e-5)
    keys = cache[0][table.long()].reshape(-1, 64)[:42]
    values = cache[1][table.long()].reshape(-1, 64)[:42]
    scores = (q.double() @ keys.double().T * 0.125).masked_fill(torch.arange(42) >= lens[:, None, None], float("-inf"))
    torch.testing.assert_close(together, (scores.softmax(-1) @ values.double()).float(), atol=2e-6, rtol=1e-5)


@pytest.mark.parametrize("head_dim", [32, 96, 256])
def test_cpp_decode_on_a_bf16_cache_is_within_the_output_rounding_of_float64(head_dim: int) -> None:
    # bf16 caches of 32 columns a row and more run the kernels that widen keys and values in split order (even
    # columns, then odd, per 32): 96 takes both the 64-column and the last-32 loops; 256 (a multiple of 64) is scored
    # by vdpbf16ps from the bf16 q where the CPU has AVX-512 BF16. A column put back in the wrong place would be off by
    # whole values; here each output may be off by its bf16 rounding only.
    kernel = cpu_extension.load_paged_decode()
    gen = torch.Generator().manual_seed(head_dim)
    cache = torch.randn(2, 40, 1, 16, head_dim, generator=gen).to(torch.bfloat16)
    table = torch.randperm(40, generator=gen)[:20].int()
    lens = torch.tensor([300, 301, 302, 77], dtype=torch.int32)  # a run of three rows, and a row of its own
    tables = table.repeat(4, 1).contiguous()
    q = torch.randn(4, 4, head_dim, generator=gen).to(torch.bfloat16)
    out = torch.full_like(q, float("nan"))
    kernel(out, q, cache, tables, lens, head_dim**-0.5, 0, 0.0, 32)
    keys = cache[0][table.long()].reshape(-1, head_dim).double()
    values = cache[1][table.long()].reshape(-1, head_dim).double()
    scores = (q.double() @ keys.T * head_dim**-0.5).masked_fill(torch.arange(320) >= lens[:, None, None], float("-inf"))
    expected = scores.softmax(-1) @ values
    torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=2**-8)
