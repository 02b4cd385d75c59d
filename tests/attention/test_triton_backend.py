"""The triton backend's kernels against the float64 reference: CUDA tensors where CUDA is present, else
CPU tensors under Triton's interpreter (tests/conftest.py sets ``TRITON_INTERPRET=1`` before triton loads)."""
from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed (it comes with the dev extra: pip install -e '.[dev]')")

from jido.attention.backend import AttentionLayerSpec  # noqa: E402
from jido.attention.registry import get_attention_backend  # noqa: E402
from jido.attention.triton_backend import (  # noqa: E402
    TritonAttentionBackend,
    TritonAttentionMetadata,
    reshape_and_cache,
    unified_attention,
)
from test_torch_backend import (  # noqa: E402  (pytest puts this folder on sys.path)
    DECODES,
    HEAD_DIM,
    MIXED,
    Case,
    _spec,
    make_case,
    reference,
)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("no CUDA and TRITON_INTERPRET is not 1: triton cannot run CPU tensors", allow_module_level=True)
pytestmark = [pytest.mark.gpu] if DEVICE == "cuda" else []

# Queries that span several query tiles, on top of prefixes that span several key tiles.
LONG_PREFILLS = [(40, 20), (0, 35), (70, 1)]


def _on_device(case: Case) -> Case:
    """The case's tensors on ``DEVICE``; its cache was written on CPU (by the torch backend: same layout)."""
    m = case.metadata
    metadata = type(m)(m.query_start_loc.to(DEVICE), m.seq_lens.to(DEVICE), m.block_tables.to(DEVICE),
                       m.slot_mapping.to(DEVICE), m.block_size, m.query_lens_list, m.seq_lens_list)
    return Case(case.q.to(DEVICE), case.k.to(DEVICE), case.v.to(DEVICE), case.kv_cache.to(DEVICE), metadata,
                TritonAttentionBackend(), case.full_k, case.full_v)


def _case(requests: list[tuple[int, int]], num_heads: int, num_kv_heads: int, block_size: int, seed: int = 0,
          head_dim: int = HEAD_DIM) -> Case:
    return _on_device(make_case(requests, num_heads, num_kv_heads, block_size, seed, backend="torch",
                                head_dim=head_dim))


def _attend(spec: AttentionLayerSpec, case: Case, num_splits: int = 1) -> torch.Tensor:
    """Write the step's K/V with the kernel, then attend into an output poisoned with NaN."""
    metadata = case.backend.build_metadata(case.metadata)
    reshape_and_cache(case.k, case.v, case.kv_cache, case.metadata.slot_mapping)
    out = torch.full_like(case.q, float("nan"))
    unified_attention(spec, case.q, case.kv_cache, out, metadata, num_splits)
    return out.cpu()


@pytest.mark.parametrize("block_size", [4, 64])  # key tiles span blocks; blocks span key tiles
@pytest.mark.parametrize("num_heads,num_kv_heads", [(4, 4), (4, 1), (6, 2), (8, 2)], ids=["mha", "mqa", "gqa3", "gqa4"])
@pytest.mark.parametrize("requests", [MIXED, LONG_PREFILLS, DECODES], ids=["mixed", "long", "decode_only"])
def test_unified_attention_matches_float64_reference(block_size: int, num_heads: int, num_kv_heads: int,
                                                      requests: list[tuple[int, int]]) -> None:
    spec = _spec(num_heads, num_kv_heads)
    case = _case(requests, num_heads, num_kv_heads, block_size)
    torch.testing.assert_close(_attend(spec, case), reference(spec, case), atol=2e-5, rtol=0)


@pytest.mark.parametrize("window", [1, 8, 40])
@pytest.mark.parametrize("softcap", [None, 2.0])
@pytest.mark.parametrize("requests", [MIXED, LONG_PREFILLS], ids=["mixed", "long"])
def test_sliding_window_and_softcap_match_float64_reference(window: int, softcap: float | None,
                                                            requests: list[tuple[int, int]]) -> None:
    spec = _spec(4, 2, window, softcap)
    case = _case(requests, 4, 2, block_size=4)
    torch.testing.assert_close(_attend(spec, case), reference(spec, case), atol=2e-5, rtol=0)


@pytest.mark.parametrize("num_splits", [2, 7])
@pytest.mark.parametrize("window", [None, 6])
@pytest.mark.parametrize("requests", [DECODES, MIXED], ids=["decode_only", "mixed"])
def test_split_keys_merged_by_log_sum_exp_match_float64_reference(num_splits: int, window: int | None,
                                                                  requests: list[tuple[int, int]]) -> None:
    # More splits than a short request has key tiles: the empty splits must weigh nothing.
    spec = _spec(4, 2, window, softcap=2.0)
    case = _case(requests, 4, 2, block_size=8)
    torch.testing.assert_close(_attend(spec, case, num_splits), reference(spec, case), atol=2e-5, rtol=0)


def test_random_shapes_match_float64_reference() -> None:
    seed = random.randrange(2**31)  # fresh inputs each run; the seed is in the failure message
    rng = random.Random(seed)
    for _ in range(3):
        num_kv_heads = rng.choice([1, 2])
        num_heads = num_kv_heads * rng.choice([1, 2, 3, 4])
        requests = [(rng.choice([0, rng.randrange(1, 50)]), rng.choice([1, rng.randrange(1, 30)]))
                    for _ in range(rng.randrange(1, 5))]
        spec = _spec(num_heads, num_kv_heads, rng.choice([None, rng.randrange(1, 30)]), rng.choice([None, 5.0]))
        case = _case(requests, num_heads, num_kv_heads, rng.choice([1, 4, 16, 64]), seed)
        torch.testing.assert_close(_attend(spec, case, rng.choice([1, 3])), reference(spec, case), atol=2e-5,
                                   rtol=0, msg=lambda m: f"seed {seed}, {spec}, {requests}: {m}")


def test_blocks_outside_the_window_are_never_read() -> None:
    window, block_size = 5, 4
    spec = _spec(4, 2, window)
    case = _case(MIXED + [(40, 6)], 4, 2, block_size)
    m = case.metadata
    for table, seq_len, query_len in zip(m.block_tables, m.seq_lens_list, m.query_lens_list):
        first_visible = max(0, seq_len - query_len - window + 1)
        case.kv_cache[:, table[: first_visible // block_size].long()] = float("nan")
    torch.testing.assert_close(_attend(spec, case, num_splits=2), reference(spec, case), atol=2e-5, rtol=0)


def test_backend_forward_writes_the_cache_and_matches_float64_reference() -> None:
    backend = get_attention_backend("triton")
    assert isinstance(backend, TritonAttentionBackend)
    spec = _spec(4, 2, window=7, softcap=3.0)
    case = _case(MIXED, 4, 2, block_size=4)
    metadata = backend.build_metadata(case.metadata)
    assert isinstance(metadata, TritonAttentionMetadata)
    out = backend.forward(spec, case.q, case.k, case.v, case.kv_cache, metadata).cpu()
    torch.testing.assert_close(out, reference(spec, case), atol=2e-5, rtol=0)
    cache = case.kv_cache.cpu().reshape(2, -1, 2 * HEAD_DIM)
    slots = case.metadata.slot_mapping.cpu()
    torch.testing.assert_close(cache[0][slots], case.k.cpu(), atol=0, rtol=0)
    torch.testing.assert_close(cache[1][slots], case.v.cpu(), atol=0, rtol=0)


def test_kv_write_takes_strided_rows_and_skips_padding_slots() -> None:
    num_kv_heads, block_size, num_blocks = 2, 4, 5
    width = num_kv_heads * HEAD_DIM
    # k and v as column slices of one fused qkv output: rows are strided.
    qkv = torch.randn(6, 3 * width, device=DEVICE)
    k, v = qkv[:, width : 2 * width], qkv[:, 2 * width :]
    cache = torch.zeros(TritonAttentionBackend.get_kv_cache_shape(num_blocks, block_size, num_kv_heads, HEAD_DIM),
                        device=DEVICE)
    slots = torch.tensor([17, 3, -1, 8, 19, -1], device=DEVICE)
    reshape_and_cache(k, v, cache, slots)
    expected = torch.zeros(2, num_blocks * block_size, width)
    written = slots.cpu() >= 0
    expected[0, slots.cpu()[written]] = k.cpu()[written]
    expected[1, slots.cpu()[written]] = v.cpu()[written]
    torch.testing.assert_close(cache.cpu().view(2, -1, width), expected, atol=0, rtol=0)


@pytest.mark.skipif(DEVICE != "cuda", reason="16-bit dots need a GPU (the interpreter's bf16 dot is wrong)")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_16_bit_inputs_match_float64_reference_within_their_precision(dtype: torch.dtype) -> None:
    spec = _spec(8, 2, window=9, softcap=4.0)
    case = _case(MIXED + LONG_PREFILLS, 8, 2, block_size=16)
    # The reference sees the same rounded inputs, so what remains is the kernel's 16-bit P @ V and output.
    case = Case(case.q.to(dtype), case.k.to(dtype), case.v.to(dtype), case.kv_cache.to(dtype), case.metadata,
                case.backend, [k.to(dtype) for k in case.full_k], [v.to(dtype) for v in case.full_v])
    torch.testing.assert_close(_attend(spec, case, num_splits=2).float(), reference(spec, case), atol=2e-2, rtol=0)


def test_gpu_benchmark_checks_its_shapes_on_cpu_under_the_interpreter() -> None:
    script = Path(__file__).resolve().parents[2] / "benchmarks" / "attention_triton_gpu.py"
    result = subprocess.run([sys.executable, str(script), "--device", "cpu", "--tiny"], capture_output=True,
                            text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(script.parents[1])})
    assert result.returncode == 0, result.stderr
    rows = [line for line in result.stdout.splitlines() if line.startswith(("| prefill", "| decode"))]
    assert len(rows) == 4 and not any("WRONG" in row for row in rows), result.stdout


@pytest.mark.parametrize("head_dim", [8, 24])  # below tl.dot's 16, and not a power of two: padded, masked
def test_head_dims_that_need_padding_match_float64_reference(head_dim: int) -> None:
    spec = AttentionLayerSpec(4, 2, head_dim, head_dim**-0.5, sliding_window=6, logit_softcap=2.0)
    case = _case(MIXED, 4, 2, block_size=4, head_dim=head_dim)
    assert case.q.shape[1] == 4 * head_dim
    torch.testing.assert_close(_attend(spec, case, num_splits=2), reference(spec, case), atol=2e-5, rtol=0)
