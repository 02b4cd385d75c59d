"""Gemma 3 (text): scaled embeddings, (1 + w) norms around both sublayers, q/k-norm, local/global layers."""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from jido.attention.backend import AttentionBackend
from jido.layers.quantization import QuantizationConfig
from jido.layers.rms_norm import RMSNorm
from jido.models.config import ModelArchConfig
from jido.models.llama import LlamaAttention, LlamaForCausalLM, LlamaMLP, LlamaModel, RopeCosSin

# Multimodal checkpoints nest the text model (transformers 5 and 4 layouts); our names are the text-only ones.
_TEXT_PREFIXES = {
    "model.language_model.": "model.",
    "language_model.model.": "model.",
    "language_model.lm_head.": "lm_head.",
}
_VISION_PREFIXES = ("vision_tower.", "multi_modal_projector.", "model.vision_tower.", "model.multi_modal_projector.")


class Gemma3DecoderLayer(nn.Module):
    """Norms before *and* after attention and MLP (sandwich norm); sliding or global per layer."""

    def __init__(
        self,
        config: ModelArchConfig,
        layer_idx: int,
        backend: AttentionBackend,
        quant_config: QuantizationConfig | None = None,
    ):
        super().__init__()
        eps, hidden = config.rms_norm_eps, config.hidden_size
        self.self_attn = LlamaAttention(config, layer_idx, backend, unit_offset_norm=True, quant_config=quant_config)
        self.mlp = LlamaMLP(config, quant_config)
        self.input_layernorm = RMSNorm(hidden, eps, unit_offset=True)
        self.post_attention_layernorm = RMSNorm(hidden, eps, unit_offset=True)
        self.pre_feedforward_layernorm = RMSNorm(hidden, eps, unit_offset=True)
        self.post_feedforward_layernorm = RMSNorm(hidden, eps, unit_offset=True)

    def forward(self, x: torch.Tensor, rope: RopeCosSin, kv_cache: torch.Tensor, metadata: Any) -> torch.Tensor:
        x = self.post_attention_layernorm(self.self_attn(self.input_layernorm(x), rope, kv_cache, metadata), x)
        return self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x)), x)  # x + norm(mlp)


class Gemma3Model(LlamaModel):
    """Llama's model body with embeddings scaled by ``sqrt(hidden_size)``."""

    def __init__(
        self,
        config: ModelArchConfig,
        backend: AttentionBackend,
        layer_cls: type[nn.Module],
        unit_offset_norm: bool,
        quant_config: QuantizationConfig | None = None,
    ):
        super().__init__(config, backend, layer_cls, unit_offset_norm, quant_config)
        # In the model dtype because HF rounds the scale to it (55.5 in bf16, not 55.43); rounded from float32,
        # as when a float32 model is cast, since rounding the float64 value straight to bf16 could differ.
        scale = torch.tensor(config.hidden_size**0.5, dtype=torch.float32).to(torch.get_default_dtype())
        self.register_buffer("embed_scale", scale, persistent=False)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(input_ids) * self.embed_scale


class Gemma3ForCausalLM(LlamaForCausalLM):
    """Gemma 3 text model; also takes the text weights of ``Gemma3ForConditionalGeneration`` checkpoints."""

    model_cls = Gemma3Model
    layer_cls = Gemma3DecoderLayer
    unit_offset_norm = True

    def hf_name(self, name: str) -> str | None:
        if name.startswith(_VISION_PREFIXES):
            return None
        for prefix, ours in _TEXT_PREFIXES.items():
            if name.startswith(prefix):
                return super().hf_name(ours + name[len(prefix):])
        return super().hf_name(name)
