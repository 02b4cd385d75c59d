"""Qwen2: the Llama decoder with biases on the q/k/v projections (set by ``ModelArchConfig.qkv_bias``)."""
from __future__ import annotations

from jido.models.llama import LlamaForCausalLM


class Qwen2ForCausalLM(LlamaForCausalLM):
    """Same graph and HF parameter names as Llama; the config turns on the q/k/v biases."""
