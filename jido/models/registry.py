"""Maps HF architecture names to our model classes, importing a family's module only when asked for."""
from __future__ import annotations

import importlib

from torch import nn

# HF architecture name -> (module, class). Aliases point several HF names at one implementation.
_MODELS: dict[str, tuple[str, str]] = {
    "LlamaForCausalLM": ("jido.models.llama", "LlamaForCausalLM"),
    "Qwen2ForCausalLM": ("jido.models.qwen2", "Qwen2ForCausalLM"),
    "Qwen3ForCausalLM": ("jido.models.qwen3", "Qwen3ForCausalLM"),
    "Qwen3MoeForCausalLM": ("jido.models.qwen3_moe", "Qwen3MoeForCausalLM"),
    "Gemma3ForCausalLM": ("jido.models.gemma3", "Gemma3ForCausalLM"),
}
_ALIASES: dict[str, str] = {"Gemma3ForConditionalGeneration": "Gemma3ForCausalLM"}


def supported_architectures() -> list[str]:
    """Every HF architecture name we can serve, aliases included."""
    return sorted([*_MODELS, *_ALIASES])


def canonical_architecture(arch_name: str | None) -> str:
    """The architecture our code implements for ``arch_name`` (resolving aliases).

    Raises:
        ValueError: the architecture is not supported (the message lists the supported ones).
    """
    arch = _ALIASES.get(arch_name, arch_name) if arch_name else None
    if arch not in _MODELS:
        raise ValueError(f"unsupported model architecture {arch_name!r}; supported: {supported_architectures()}")
    return arch


def get_model_class(arch_name: str) -> type[nn.Module]:
    """The model class for an HF architecture name, e.g. ``"LlamaForCausalLM"``."""
    module_name, class_name = _MODELS[canonical_architecture(arch_name)]
    return getattr(importlib.import_module(module_name), class_name)
