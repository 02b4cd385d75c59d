"""batch_invariant on tiny random Gemma 3 models, in float32 (dense layers on oneDNN) and int8 (the int8 panels): a
request's logprobs and greedy tokens are the same alone, batched, cached and chunked (tests/invariance_checks.py)."""
from __future__ import annotations

from pathlib import Path

import pytest
from invariance_checks import check_invariance, prompts
from tiny_model_folder import BOS_ID, write_tiny_model_folder

from jido.layers import int8_dot


@pytest.mark.parametrize("quantization", ["none", "int8"])
def test_tiny_gemma_logprobs_are_the_same_alone_batched_cached_and_chunked(tmp_path: Path, quantization: str) -> None:
    if quantization == "int8" and int8_dot.load_int8_dot_ops() is None:
        pytest.skip("no int8 dot kernel for this CPU")
    folder = write_tiny_model_folder(tmp_path, weight_scale=0.2)
    check_invariance(str(folder), quantization, prompts(BOS_ID, 128))
