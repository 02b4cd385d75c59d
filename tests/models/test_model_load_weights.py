"""load_weights takes HF names, fuses projections, and names what does not fit."""
from __future__ import annotations

import re

import pytest
import torch
from tiny_hf_models import tiny_models
from tiny_paged_batch import TinyPagedRunner

from jido.attention.registry import get_attention_backend
from jido.layers.parameter import default_device_and_dtype


def _logits(model: torch.nn.Module, tokens: list[int]) -> torch.Tensor:
    return TinyPagedRunner(model).step({"req": tokens})["req"]


def test_missing_and_unexpected_weights_are_named() -> None:
    hf, ours = tiny_models("qwen2")
    weights = dict(hf.state_dict())
    del weights["model.layers.1.self_attn.k_proj.bias"]
    weights["model.layers.0.mlp.extra.weight"] = torch.zeros(1)
    expected = r"missing \['model.layers.1.self_attn.k_proj.bias'\], unexpected \['model.layers.0.mlp.extra.weight'\]"
    with pytest.raises(ValueError, match=expected):
        ours.load_weights(weights.items())


def test_tied_embeddings_need_no_lm_head_and_gemma3_multimodal_names_load_the_text_model() -> None:
    hf, ours = tiny_models("gemma3")
    fresh = type(ours)(ours.config, get_attention_backend()).eval()
    # transformers-5 multimodal layout: the text model under model.language_model, plus vision weights.
    text_weights = {n: t for n, t in hf.state_dict().items() if n != "lm_head.weight"}
    weights = {n.replace("model.", "model.language_model.", 1): t for n, t in text_weights.items()}
    weights["model.vision_tower.patch_embedding.weight"] = torch.zeros(1)
    fresh.load_weights(weights.items())
    tokens = [3, 1, 4, 1, 5, 9, 2, 6]
    torch.testing.assert_close(_logits(fresh, tokens), _logits(ours, tokens), atol=0, rtol=0)


def test_q_k_v_are_fused_into_one_projection() -> None:
    hf, ours = tiny_models("llama")
    attn = ours.model.layers[0].self_attn
    hf_attn = hf.model.layers[0].self_attn
    expected = torch.cat([hf_attn.q_proj.weight, hf_attn.k_proj.weight, hf_attn.v_proj.weight])
    torch.testing.assert_close(attn.qkv_proj.weight, expected, atol=0, rtol=0)


def test_every_parameter_carries_a_weight_loader() -> None:
    _, ours = tiny_models("qwen2")
    assert all(callable(getattr(p, "weight_loader", None)) for p in ours.parameters())


@pytest.mark.parametrize(
    "name, bad_shape, expected",
    [
        ("model.layers.1.self_attn.k_proj.weight", (31, 64), "expected shape (32, 64), got (31, 64)"),
        ("model.norm.weight", (65,), "expected shape (64,), got (65,)"),
    ],
)
def test_shape_mismatch_names_the_tensor_and_both_shapes(name: str, bad_shape: tuple[int, ...], expected: str) -> None:
    hf, ours = tiny_models("llama")
    weights = dict(hf.state_dict())
    weights[name] = torch.zeros(bad_shape)
    with pytest.raises(ValueError, match=re.escape(f"{name}: {expected}")):
        ours.load_weights(weights.items())


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_model_built_in_bfloat16_equals_the_float32_model_cast(arch: str) -> None:
    hf, ours = tiny_models(arch)
    with default_device_and_dtype(torch.device("cpu"), torch.bfloat16):
        built = type(ours)(ours.config, get_attention_backend())
    assert torch.get_default_dtype() == torch.float32
    built.load_weights(hf.state_dict().items())
    cast = ours.to(torch.bfloat16)
    tensors = {**dict(built.named_buffers()), **built.state_dict()}
    expected = {**dict(cast.named_buffers()), **cast.state_dict()}
    assert {t.dtype for t in tensors.values()} == {torch.bfloat16}
    assert tensors.keys() == expected.keys()
    for name, tensor in tensors.items():
        assert torch.equal(tensor, expected[name]), name
    assert {rope.inv_freq.dtype for rope in built.model.ropes} == {torch.float32}
    tokens = [3, 1, 4, 1, 5, 9, 2, 6]
    torch.testing.assert_close(_logits(built, tokens), _logits(cast, tokens), atol=0, rtol=0)
