"""The start-up memory check: a KV cache and step workspace that do not fit the host's available memory are refused
with every size and the kv_cache_memory that would fit, instead of being paged in until the OOM killer ends them."""
from __future__ import annotations

from pathlib import Path

import pytest

from jido import LLM
from jido.utils.host_memory import (GIB, InsufficientMemoryError, StepWorkspace, check_kv_cache_fits,
                                    mem_available_bytes)

WORKSPACE = StepWorkspace(max_num_seqs=4, max_num_batched_tokens=64, vocab_size=1000, hidden_size=16,
                          intermediate_size=32)


def test_mem_available_is_read_from_meminfo_in_bytes(tmp_path: Path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24000000 kB\nMemFree:        1000 kB\nMemAvailable:   20000000 kB\n")
    assert mem_available_bytes(meminfo) == 20_000_000 * 1024
    assert mem_available_bytes(tmp_path / "missing") is None


def test_the_workspace_counts_float32_logits_for_every_sequence_and_a_full_steps_activations():
    assert WORKSPACE.bytes == 4 * (4 * 1000 + 64 * (2 * 32 + 4 * 16))


def test_a_kv_cache_that_fits_passes_and_one_that_does_not_is_refused_with_the_size_that_fits():
    check_kv_cache_fits(GIB, WORKSPACE, 3 * GIB, available_bytes=2 * GIB)
    check_kv_cache_fits(100 * GIB, WORKSPACE, 0, available_bytes=None)  # unknown: no check
    with pytest.raises(InsufficientMemoryError) as refused:
        check_kv_cache_fits(4 * GIB, WORKSPACE, 3 * GIB, available_bytes=2 * GIB)
    message = str(refused.value)
    assert "the KV cache (kv_cache_memory, 4.00 GiB)" in message and "2.00 GiB available" in message
    assert "the weights (3.00 GiB) loaded" in message
    assert f"--kv-cache-memory {(2 * GIB - WORKSPACE.bytes) >> 20}MiB or less" in message


def test_an_engine_asked_for_more_kv_cache_than_the_host_has_is_refused_at_start(tiny_model_folder: Path):
    available = mem_available_bytes()
    assert available is not None
    with pytest.raises(InsufficientMemoryError, match="not enough memory: the KV cache"):
        LLM(str(tiny_model_folder), kv_cache_memory=f"{2 * available >> 20}MiB")
