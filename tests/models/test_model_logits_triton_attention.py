"""Our models with the triton attention backend give transformers' logits (kernels interpreted on CPU)."""
from __future__ import annotations

import os

import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed (it comes with the dev extra: pip install -e '.[dev]')")
if os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("the tiny runner keeps tensors on CPU, which triton runs only under TRITON_INTERPRET=1",
                allow_module_level=True)

from test_model_logits import _hf_logits, _run_chunks, _tokens  # noqa: E402
from tiny_hf_models import tiny_models  # noqa: E402

from jido.attention.registry import get_attention_backend  # noqa: E402


@pytest.mark.parametrize("arch", ["llama", "gemma3"])  # GQA 4/2; MQA with a window of 4 and its own scale
def test_chunked_prefill_then_decode_with_triton_attention_matches_transformers(arch: str) -> None:
    hf, torch_ours = tiny_models(arch)
    ours = type(torch_ours)(torch_ours.config, get_attention_backend("triton")).eval()
    ours.load_state_dict(torch_ours.state_dict())
    tokens = _tokens(seed=2)
    chunk_lens = [3, 6, len(tokens) - 14] + [1] * 5  # chunks that start and end mid-block, then decodes
    torch.testing.assert_close(_run_chunks(ours, tokens, chunk_lens), _hf_logits(hf, tokens), atol=1e-4, rtol=0)


@pytest.mark.parametrize("arch", ["llama", "gemma3"])  # SiLU, no q/k norms; tanh-GELU, q/k norms, Gemma's residuals
def test_triton_layer_ops_in_place_of_the_cpu_kernels_match_transformers(arch: str, monkeypatch) -> None:
    # On CUDA the layers call jido.layers.triton_ops; here its kernels stand in for the C++ ones (same calls).
    from jido.layers import activation, rms_norm, rotary, triton_ops

    for module, name in ((rms_norm, "load_norm_ops"), (rotary, "load_norm_ops"), (activation, "load_activation_ops")):
        monkeypatch.setattr(module, name, lambda: triton_ops)
    hf, torch_ours = tiny_models(arch)
    ours = type(torch_ours)(torch_ours.config, get_attention_backend("triton")).eval()
    ours.load_state_dict(torch_ours.state_dict())
    tokens = _tokens(seed=3)
    chunk_lens = [5, len(tokens) - 8] + [1] * 3
    torch.testing.assert_close(_run_chunks(ours, tokens, chunk_lens), _hf_logits(hf, tokens), atol=1e-4, rtol=0)
