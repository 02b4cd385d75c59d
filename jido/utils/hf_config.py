"""Reading Hugging Face config.json dicts: the one parser of text settings and layer types, torch-free."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def text_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """The text model's settings: multimodal checkpoints nest them in ``text_config``; top-level ids still apply."""
    return {**config, **(config.get("text_config") or {})}


def layer_sliding_windows(cfg: Mapping[str, Any]) -> tuple[int | None, ...]:
    """Per layer, its sliding window (a query at ``p`` sees keys ``p - w < k <= p``) or ``None`` for global.

    Read from ``layer_types`` (transformers 5), Gemma's ``sliding_window_pattern`` (every pattern-th layer
    is global), or Qwen's ``use_sliding_window`` with ``max_window_layers``. A ``sliding_window`` value
    without any of these is not used: Qwen configs carry one that is off unless switched on.
    """
    num_layers = int(cfg["num_hidden_layers"])
    window = cfg.get("sliding_window") if cfg.get("use_sliding_window", True) else None
    if not window:
        return (None,) * num_layers
    if cfg.get("layer_types"):
        return tuple(window if t == "sliding_attention" else None for t in cfg["layer_types"])
    pattern = cfg.get("_sliding_window_pattern") or cfg.get("sliding_window_pattern")
    if pattern:
        return tuple(window if (i + 1) % pattern else None for i in range(num_layers))
    if cfg.get("use_sliding_window"):
        first = cfg.get("max_window_layers", num_layers)
        return tuple(window if i >= first else None for i in range(num_layers))
    return (None,) * num_layers


def kv_tokens_held(num_tokens: int, sliding_window: int | None, block_size: int = 1) -> int:
    """Token slots one layer holds for a request of ``num_tokens`` tokens, in whole blocks.

    A global layer holds every token; a sliding one only the blocks its last query can see (the window's
    ``w - 1`` earlier keys can straddle one more block). With ``block_size=1`` this is ``min(n, w)``.
    """
    blocks = -(-num_tokens // block_size)
    if sliding_window is not None:
        blocks = min(blocks, -(-(sliding_window - 1) // block_size) + 1)
    return blocks * block_size
