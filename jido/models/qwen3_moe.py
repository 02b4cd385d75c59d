"""Qwen3-MoE: the Qwen3 decoder (q/k-norm) with a mixture of experts in place of the MLP on its sparse layers."""
from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch import nn

from jido.attention.backend import AttentionBackend
from jido.layers.moe import FusedMoE
from jido.layers.quantization import QuantizationConfig
from jido.layers.rms_norm import RMSNorm
from jido.models.config import ModelArchConfig
from jido.models.llama import LlamaAttention, LlamaForCausalLM, LlamaMLP, RopeCosSin

# model.layers.3.mlp.experts.5.gate_proj.weight -> ("model.layers.3.mlp", 5, "gate_proj")
_EXPERT = re.compile(r"(?P<prefix>.+\.mlp)\.experts\.(?P<expert>\d+)\.(?P<proj>gate_proj|up_proj|down_proj)\.weight")
_FUSED_EXPERTS = re.compile(r"(?P<prefix>.+\.mlp)\.experts\.(?P<proj>gate_up_proj|down_proj)")
_PROJS = {"w13_weight": ("gate_proj", "up_proj"), "w2_weight": ("down_proj",)}


class Qwen3MoeDecoderLayer(nn.Module):
    """Pre-norm block whose MLP is a :class:`FusedMoE` on sparse layers and a dense gated MLP elsewhere."""

    def __init__(self, config: ModelArchConfig, layer_idx: int, backend: AttentionBackend,
                 quant_config: QuantizationConfig | None = None):
        super().__init__()
        c = config
        self.self_attn = LlamaAttention(c, layer_idx, backend, quant_config=quant_config)
        if c.is_sparse_layer(layer_idx):
            self.mlp: nn.Module = FusedMoE(c.num_experts, c.num_experts_per_tok, c.hidden_size,
                                           c.moe_intermediate_size, c.norm_topk_prob, c.hidden_act)
        else:
            self.mlp = LlamaMLP(c, quant_config)
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)

    def forward(self, x: torch.Tensor, rope: RopeCosSin, kv_cache: torch.Tensor, metadata: Any) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), rope, kv_cache, metadata)
        return x + self.mlp(self.post_attention_layernorm(x))


class Qwen3MoeForCausalLM(LlamaForCausalLM):
    """Qwen3-MoE with HF names: checkpoints store each expert's projections (``experts.<e>.gate_proj``);
    transformers 5's in-memory state dict stacks them (``experts.gate_up_proj``), which loads too. Experts
    this rank does not hold (expert parallelism) are skipped while loading."""

    layer_cls = Qwen3MoeDecoderLayer

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        super().load_weights(_per_expert(weights))

    def take_expert_load(self) -> list[int]:
        """(token, expert) pairs routed to each expert-parallel rank since the last call, over all layers."""
        loads = [m.take_expert_load() for m in self.modules() if isinstance(m, FusedMoE)]
        return torch.stack(loads).sum(0).tolist() if loads else []

    def _on_this_stage(self, name: str) -> bool:
        match = _EXPERT.fullmatch(name)
        if match is None or not super()._on_this_stage(name):
            return super()._on_this_stage(name)
        return self.get_submodule(match["prefix"]).holds_expert(int(match["expert"]))

    def _expected_hf_names(self, params: dict[str, nn.Parameter]) -> set[str]:
        names = super()._expected_hf_names(params)
        for name in [n for n in names if n.rpartition(".")[2] in _PROJS]:
            names.discard(name)
            prefix, _, param_name = name.rpartition(".")
            moe = self.get_submodule(prefix)
            experts = range(moe.first_expert, moe.first_expert + moe.num_local)
            names.update(f"{prefix}.experts.{e}.{proj}.weight" for e in experts for proj in _PROJS[param_name])
        return names

    def _param_for(self, name: str) -> tuple[str, str | None]:
        match = _EXPERT.fullmatch(name)
        if match is None:
            return super()._param_for(name)
        param = "w2_weight" if match["proj"] == "down_proj" else "w13_weight"
        return f"{match['prefix']}.{param}", f"{match['expert']}:{match['proj']}"


def _per_expert(weights: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
    """Stacked expert tensors (``[E, 2I, hidden]`` gate then up, ``[E, hidden, I]`` down) split per expert."""
    for name, tensor in weights:
        match = _FUSED_EXPERTS.fullmatch(name)
        if match is None:
            yield name, tensor
            continue
        prefix = f"{match['prefix']}.experts"
        for expert, part in enumerate(tensor):
            if match["proj"] == "down_proj":
                yield f"{prefix}.{expert}.down_proj.weight", part
            else:
                gate, up = part.chunk(2, dim=0)
                yield f"{prefix}.{expert}.gate_proj.weight", gate
                yield f"{prefix}.{expert}.up_proj.weight", up
