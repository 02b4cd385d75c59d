"""The quantization seam: every linear layer and the LM head create and apply their weights through a LinearMethod."""
from __future__ import annotations

from collections import Counter

import pytest
import torch
from tiny_hf_models import tiny_models
from tiny_paged_batch import TinyPagedRunner
from torch import nn

from jido.attention.registry import get_attention_backend
from jido.layers.parameter import WeightLoader
from jido.layers.quantization import (
    LinearMethod,
    QuantizationConfig,
    UnquantizedLinearMethod,
    get_quantization_config,
)


class _CountingMethod(UnquantizedLinearMethod):
    """The dense method, counting each call by the kind of layer it serves."""

    def __init__(self, calls: Counter[str]) -> None:
        self.calls = calls

    def create_weights(
        self, layer: nn.Module, in_features: int, out_features: int, weight_loader: WeightLoader
    ) -> None:
        self.calls[f"create {type(layer).__name__}"] += 1
        super().create_weights(layer, in_features, out_features, weight_loader)

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        self.calls[f"apply {type(layer).__name__}"] += 1
        return super().apply(layer, x, bias)

    def apply_logits(self, layer: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
        self.calls[f"logits {type(layer).__name__}"] += 1
        return super().apply_logits(layer, hidden)


class _CountingConfig(QuantizationConfig):
    name = "counting"

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()

    def get_linear_method(self, layer: nn.Module) -> LinearMethod:
        return _CountingMethod(self.calls)


@pytest.mark.parametrize("arch, head", [("llama", "ColumnParallelLinear"), ("gemma3", "VocabParallelEmbedding")])
def test_linear_layers_and_lm_head_go_through_the_configured_method(arch: str, head: str) -> None:
    hf, ours = tiny_models(arch)
    config = _CountingConfig()
    model = type(ours)(ours.config, get_attention_backend(), quant_config=config).eval()
    model.load_weights(hf.state_dict().items())
    tokens = {"req": [3, 1, 4, 1, 5, 9, 2, 6]}
    logits = TinyPagedRunner(model).step(tokens)["req"]
    torch.testing.assert_close(logits, TinyPagedRunner(ours).step(tokens)["req"], atol=0, rtol=0)
    num_layers = ours.config.num_layers  # per layer: qkv and gate_up column-parallel, o and down row-parallel
    expected = {"create QKVParallelLinear": num_layers, "create MergedColumnParallelLinear": num_layers,
                "create RowParallelLinear": 2 * num_layers, "apply QKVParallelLinear": num_layers,
                "apply MergedColumnParallelLinear": num_layers, "apply RowParallelLinear": 2 * num_layers,
                f"logits {head}": 1}
    if head == "ColumnParallelLinear":
        expected["create ColumnParallelLinear"] = 1
    assert config.calls == expected


def test_unknown_quantization_lists_the_known_ones() -> None:
    assert type(get_quantization_config()).__name__ == "UnquantizedConfig"
    with pytest.raises(ValueError, match=r"unknown quantization 'gptq'; available: \['fp8', 'gguf', 'gguf_w8a8', 'int4', 'int8', 'none', 'w8a8'\]"):
        get_quantization_config("gptq")
