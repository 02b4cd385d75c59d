"""Transformer shapes the cost model needs: a small catalog and a parser for HF config.json."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from jido.utils.hf_config import kv_tokens_held, layer_sliding_windows, text_config


class ModelShapeError(ValueError):
    """A model name is unknown or a config.json lacks a field the planner needs."""


@dataclass(frozen=True)
class ModelShape:
    """Decoder-only transformer with gated MLP (optionally MoE) and grouped-query attention."""

    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    num_experts: int = 1
    num_active_experts: int = 1
    tie_embeddings: bool = False
    sliding_window: int | None = None
    num_sliding_layers: int = 0

    def __post_init__(self) -> None:
        for key in ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim",
                    "intermediate_size", "vocab_size", "num_experts", "num_active_experts"):
            if getattr(self, key) < 1:
                raise ModelShapeError(f"{self.name}: {key} must be >= 1, got {getattr(self, key)}")
        if self.num_heads % self.num_kv_heads:
            raise ModelShapeError(f"{self.name}: num_heads {self.num_heads} must be a multiple of "
                                  f"num_kv_heads {self.num_kv_heads}")
        if self.num_active_experts > self.num_experts:
            raise ModelShapeError(f"{self.name}: num_active_experts {self.num_active_experts} > "
                                  f"num_experts {self.num_experts}")
        if not 0 <= self.num_sliding_layers <= self.num_layers:
            raise ModelShapeError(f"{self.name}: num_sliding_layers must be in [0, num_layers]")
        if self.num_sliding_layers and not self.sliding_window:
            raise ModelShapeError(f"{self.name}: sliding layers need a sliding_window")

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 1

    @property
    def attention_params_per_layer(self) -> int:
        q_and_o = 2 * self.hidden_size * self.num_heads * self.head_dim
        k_and_v = 2 * self.hidden_size * self.num_kv_heads * self.head_dim
        return q_and_o + k_and_v

    @property
    def expert_params(self) -> int:
        """One expert's gated MLP: gate, up and down projections."""
        return 3 * self.hidden_size * self.intermediate_size

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size * (1 if self.tie_embeddings else 2)

    @property
    def num_params(self) -> int:
        router = self.hidden_size * self.num_experts if self.is_moe else 0
        per_layer = self.attention_params_per_layer + self.num_experts * self.expert_params + router
        return self.num_layers * per_layer + self.embedding_params

    @property
    def num_active_params(self) -> int:
        """Parameters one token multiplies through, excluding embeddings and the LM head."""
        per_layer = self.attention_params_per_layer + self.num_active_experts * self.expert_params
        return self.num_layers * per_layer

    def kv_bytes_per_token(self, bytes_per_element: float = 2.0) -> float:
        """K and V for one token in every layer: 2 * layers * kv_heads * head_dim * bytes."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * bytes_per_element

    def kv_bytes(self, num_tokens: float, bytes_per_element: float = 2.0, block_size: int = 1) -> float:
        """KV bytes one sequence of num_tokens holds; sliding-window layers keep only the window.

        The runner's formula (:func:`jido.utils.hf_config.kv_tokens_held`): with ``block_size`` set to
        the engine's, it counts whole blocks as jido's block pool does.
        """
        per_layer_token = 2 * self.num_kv_heads * self.head_dim * bytes_per_element
        num_full = self.num_layers - self.num_sliding_layers
        tokens = math.ceil(num_tokens)
        held = (num_full * kv_tokens_held(tokens, None, block_size)
                + self.num_sliding_layers * kv_tokens_held(tokens, self.sliding_window, block_size))
        return per_layer_token * held

    def attention_flops(self, num_query_tokens: float, num_context_tokens: float) -> float:
        """QK^T and PV for queries attending to context, over all layers (2 FLOPs per MAC)."""
        return 4 * self.num_layers * self.num_heads * self.head_dim * num_query_tokens * num_context_tokens


CATALOG: dict[str, ModelShape] = {
    # meta-llama/Llama-3.1-8B config.json
    "llama-3.1-8b": ModelShape("llama-3.1-8b", 32, 4096, 32, 8, 128, 14336, 128256),
    # meta-llama/Llama-3.1-70B config.json
    "llama-3.1-70b": ModelShape("llama-3.1-70b", 80, 8192, 64, 8, 128, 28672, 128256),
    # Qwen/Qwen3-32B config.json (head_dim 128, so q width 8192 != hidden 5120)
    "qwen3-32b": ModelShape("qwen3-32b", 64, 5120, 64, 8, 128, 25600, 151936),
    # mistralai/Mixtral-8x7B-v0.1 config.json: 8 experts, 2 active per token
    "mixtral-8x7b": ModelShape("mixtral-8x7b", 32, 4096, 32, 8, 128, 14336, 32000,
                               num_experts=8, num_active_experts=2),
    # google/gemma-3-270m config.json: 5 of every 6 layers use a 512-token sliding window
    "gemma-3-270m": ModelShape("gemma-3-270m", 18, 640, 4, 1, 256, 2048, 262144, tie_embeddings=True,
                               sliding_window=512, num_sliding_layers=15),
}


def load_model(name_or_path: str) -> ModelShape:
    """A catalog model by name, or the shape read from an HF config.json path."""
    if name_or_path in CATALOG:
        return CATALOG[name_or_path]
    path = Path(name_or_path)
    if not path.is_file():
        raise ModelShapeError(f"unknown model {name_or_path!r}: not in the catalog "
                              f"({', '.join(CATALOG)}) and not a config.json file")
    return shape_from_hf_config(json.loads(path.read_text()), name=path.parent.name or path.stem)


def shape_from_hf_config(config: Mapping[str, Any], name: str = "hf-model") -> ModelShape:
    """Parse the fields of a Hugging Face config.json (text_config of multimodal models too)."""
    cfg = text_config(config)
    try:
        num_layers = int(cfg["num_hidden_layers"])
        hidden = int(cfg["hidden_size"])
        num_heads = int(cfg["num_attention_heads"])
        intermediate = int(cfg.get("moe_intermediate_size") or cfg["intermediate_size"])
        vocab = int(cfg["vocab_size"])
    except KeyError as exc:
        raise ModelShapeError(f"{name}: config.json lacks {exc.args[0]!r}") from exc
    num_experts = int(cfg.get("num_local_experts") or cfg.get("num_experts") or cfg.get("n_routed_experts") or 1)
    windows = [w for w in layer_sliding_windows(cfg) if w is not None]
    num_sliding, window = len(windows), (max(windows) if windows else None)
    return ModelShape(
        name=name, num_layers=num_layers, hidden_size=hidden, num_heads=num_heads,
        num_kv_heads=int(cfg.get("num_key_value_heads") or num_heads),
        head_dim=int(cfg.get("head_dim") or hidden // num_heads),
        intermediate_size=intermediate, vocab_size=vocab, num_experts=num_experts,
        num_active_experts=int(cfg.get("num_experts_per_tok") or 1) if num_experts > 1 else 1,
        tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        sliding_window=window, num_sliding_layers=num_sliding,
    )
