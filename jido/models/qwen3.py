"""Qwen3: the Llama decoder with a per-head RMSNorm on queries and keys (``ModelArchConfig.qk_norm``)."""
from __future__ import annotations

from jido.models.llama import LlamaForCausalLM


class Qwen3ForCausalLM(LlamaForCausalLM):
    """Same graph and HF parameter names as Llama plus ``self_attn.q_norm``/``k_norm``, set by the config."""
