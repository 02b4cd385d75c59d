"""batch_invariant on a tiny GGUF of mixed block types served on its codes (``gguf``): a request's logprobs and greedy
tokens are the same alone, batched, cached and chunked (tests/invariance_checks.py)."""
from __future__ import annotations

from pathlib import Path

import pytest
from invariance_checks import check_invariance, prompts
from test_quantized_linear import mixed_llama_for_engine

from jido.layers import int8_dot


@pytest.mark.skipif(int8_dot.load_int8_dot_ops() is None, reason="no int8 dot kernel for this CPU")
def test_gguf_codes_logprobs_are_the_same_alone_batched_cached_and_chunked(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    # Its q projection is Q5_0, which five-bit rows serve at one row when not batch-invariant.
    path = mixed_llama_for_engine(tmp_path, monkeypatch)
    check_invariance(str(path), "gguf", prompts(1, 264))
