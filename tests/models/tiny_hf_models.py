"""Tiny randomly initialised transformers models of each family, and ours loaded with the same weights."""
from __future__ import annotations

import torch
from transformers import (AutoModelForCausalLM, Gemma3TextConfig, LlamaConfig, PreTrainedConfig, Qwen2Config, Qwen3Config,
                          Qwen3MoeConfig)

from jido.attention.registry import get_attention_backend
from jido.models.config import ModelArchConfig
from jido.models.registry import get_model_class

VOCAB_SIZE = 128
_COMMON = dict(
    vocab_size=VOCAB_SIZE, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
    num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
)


def tiny_hf_config(arch: str) -> PreTrainedConfig:
    """One config per family, each exercising what sets it apart."""
    if arch == "llama":
        # original_max_position_embeddings is small so that llama3 scaling touches every frequency band.
        rope = {"rope_type": "llama3", "rope_theta": 10_000.0, "factor": 8.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
        return LlamaConfig(**_COMMON, rope_parameters=rope)
    if arch == "qwen2":
        return Qwen2Config(**_COMMON)  # q/k/v biases
    if arch == "qwen3":
        return Qwen3Config(**_COMMON)  # per-head q/k RMSNorm
    if arch == "qwen3_moe":
        # 4 experts, top-2 renormalised, the middle layer dense.
        return Qwen3MoeConfig(**_COMMON, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                              norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[1])
    # Gemma 3: MQA, window 4 on two of three layers (prompts are longer), scale != head_dim ** -0.5.
    return Gemma3TextConfig(
        **{**_COMMON, "num_key_value_heads": 1}, query_pre_attn_scalar=24, sliding_window=4,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"], final_logit_softcapping=3.0,
    )


def tiny_models(arch: str, seed: int = 0) -> tuple[torch.nn.Module, torch.nn.Module]:
    """(transformers model, our model) in float32 with identical random weights."""
    torch.manual_seed(seed)
    hf = AutoModelForCausalLM.from_config(tiny_hf_config(arch), attn_implementation="eager").float().eval()
    _randomize(hf, norm_center=0.0 if arch == "gemma3" else 1.0)
    hf_dict = {**hf.config.to_dict(), "architectures": [type(hf).__name__]}
    config = ModelArchConfig.from_hf_config(hf_dict)
    ours = get_model_class(config.architecture)(config, get_attention_backend("torch")).eval()
    ours.load_weights(hf.state_dict().items())
    return hf, ours


@torch.no_grad()
def _randomize(model: torch.nn.Module, norm_center: float) -> None:
    # HF's init (std 0.02, unit norms) gives near-uniform logits; larger weights make the comparison bite.
    for name, param in model.named_parameters():
        if "norm" in name:
            param.copy_(norm_center + 0.1 * torch.randn_like(param))
        else:
            param.normal_(0.0, 0.15)
