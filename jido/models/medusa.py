"""MedusaHeads: Medusa's extra decoding heads, each reading the target's final hidden state at the newest token.

The target's LM head turns ``h_t`` into the token after it, ``x_{t+1}``; head ``k`` (1-based) turns the same
``h_t`` into a guess at ``x_{t+1+k}``, so one step's K guesses cost K small heads and no pass of any layer (Cai et
al., "Medusa: Simple LLM Inference Acceleration Framework with Multiple Decoding Heads", 2024). A head is
Medusa-1's: residual blocks ``x + SiLU(W x + b)`` starting from zero (the head begins as the target's own next-token
prediction), then LM head rows.

One choice of jido's own, as for the EAGLE draft: every head shares the target's LM head rows for a *draft
vocabulary* (the tokens the target emits most), kept frozen, so a guess costs a 16k-row head against Gemma 3's
262k, and training fits only the blocks.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from jido.models.draft_layers import DraftLinear, load_draft_weights, read_draft_config, save_draft, softcapped


@dataclass(frozen=True)
class MedusaConfig:
    """The heads' shape, and what they were trained for (``target``: the target model's description)."""

    hidden_size: int
    num_heads: int  # head k guesses the token k + 1 places after the newest hidden state
    num_layers: int  # residual blocks per head
    draft_vocab_size: int
    target_vocab_size: int
    final_logit_softcapping: float | None = None  # the target's, applied to the heads' logits alike
    method: str = "medusa"
    target: dict[str, Any] = field(default_factory=dict)
    training: dict[str, Any] = field(default_factory=dict)  # what `jido train-draft` ran and measured

    def __post_init__(self) -> None:
        if self.method != "medusa":
            raise ValueError(f"a Medusa folder holds method 'medusa', this one {self.method!r}")
        for name in ("hidden_size", "num_heads", "num_layers"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if not 0 < self.draft_vocab_size <= self.target_vocab_size:
            raise ValueError(f"draft_vocab_size must be in 1..{self.target_vocab_size}, got {self.draft_vocab_size}")


class MedusaHeads(nn.Module):
    """The heads over flat rows ``[rows, hidden]``; ``draft_vocab`` maps their logits' columns to token ids."""

    def __init__(self, config: MedusaConfig) -> None:
        super().__init__()
        self.config = c = config
        self.blocks = nn.ModuleList([
            nn.ModuleList([DraftLinear(c.hidden_size, c.hidden_size, bias=True) for _ in range(c.num_layers)])
            for _ in range(c.num_heads)])
        for block in self.blocks.modules():
            if isinstance(block, DraftLinear):
                nn.init.zeros_(block.weight)
                nn.init.zeros_(block.bias)
        self.lm_head = DraftLinear(c.hidden_size, c.draft_vocab_size, bias=False)  # the target's rows, kept frozen
        self.register_buffer("draft_vocab", torch.zeros(c.draft_vocab_size, dtype=torch.long))

    def features(self, hidden: torch.Tensor, head: int) -> torch.Tensor:
        """Head ``head``'s (0-based) features of the target's hidden states ``[rows, hidden]``."""
        x = hidden
        for block in self.blocks[head]:
            x = x + F.silu(block(x))
        return x

    def logits(self, features: torch.Tensor) -> torch.Tensor:
        """Logits over the draft vocabulary ``[rows, draft_vocab_size]``, soft-capped as the target's."""
        return softcapped(self.lm_head(features), self.config.final_logit_softcapping)

    def save(self, folder: Path, training: dict[str, Any] | None = None) -> None:
        """Write the config (with ``training``: what trained them) and the weights to ``folder``."""
        save_draft(self, self.config, folder, training)


def load_medusa_heads(folder: str | Path, device: torch.device, dtype: torch.dtype,
                      bits: int | None = None) -> MedusaHeads:
    """The heads `jido train-draft --method medusa` wrote to ``folder``, in eval mode, packed for proposing (in int8 /
    int4 codes with ``bits`` 8 / 4, where the int8 kernels run on this CPU).

    Raises:
        ValueError: the folder does not hold Medusa heads.
    """
    folder = Path(folder)
    heads = MedusaHeads(MedusaConfig(**read_draft_config(folder, "medusa", "Medusa")))
    return load_draft_weights(heads, folder, device, dtype, bits)
