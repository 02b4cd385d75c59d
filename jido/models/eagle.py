"""EagleDraft: EAGLE's draft, one decoder layer that runs on the target's hidden states (feature-level drafting).

At entry ``i`` the draft reads the target's final hidden state ``h_i`` and the embedding of the token after it,
``x_{i+1}``. From them it predicts the target's next hidden state, ``h_{i+1}``, and through the target's own LM
head rows the token after that, ``x_{i+2}``. Its prediction then stands in for ``h_{i+1}`` at the next entry,
so a chain of K proposals costs K passes of one layer. (Li et al., "EAGLE: Speculative Sampling Requires
Rethinking Feature Uncertainty", 2024; the multi-pass training is EAGLE-3's "training-time test".)

Two choices of jido's own:
- The LM head is the target's rows for a *draft vocabulary*, the tokens the target emits most, so that a
  proposal costs a fraction of the target's head: 16k rows against Gemma 3's 262k.
- Norms before the concatenation, since a Gemma embedding is ~25x the scale of a normed hidden state.

Attention is passed in, so the same module trains on dense sequences and proposes on the paged cache.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from jido.layers.activation import get_gated_activation
from jido.layers.rotary import RotaryEmbedding, apply_rotary, norm_and_rotate_qk
from jido.models.draft_layers import (DraftLinear, DraftNorm, load_draft_weights, read_draft_config, save_draft,
                                      softcapped)
# q, k, v: [tokens, heads * head_dim] -> attention output [tokens, num_heads * head_dim]
Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class EagleDraftConfig:
    """The draft's shape, and what it was trained for (``target``: the target model's description)."""

    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    draft_vocab_size: int
    target_vocab_size: int
    hidden_act: str = "silu"
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10_000.0
    final_logit_softcapping: float | None = None  # the target's, applied to the draft's logits alike
    method: str = "eagle"
    target: dict[str, Any] = field(default_factory=dict)
    training: dict[str, Any] = field(default_factory=dict)  # what `jido train-draft` ran and measured

    def __post_init__(self) -> None:
        if self.method != "eagle":
            raise ValueError(f"an EAGLE draft folder holds method 'eagle', this one {self.method!r}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})")
        if not 0 < self.draft_vocab_size <= self.target_vocab_size:
            raise ValueError(f"draft_vocab_size must be in 1..{self.target_vocab_size}, got {self.draft_vocab_size}")


class EagleDraft(nn.Module):
    """The draft layer over flat rows ``[tokens, ...]``; ``draft_vocab`` maps its logits' columns to token ids."""

    def __init__(self, config: EagleDraftConfig) -> None:
        super().__init__()
        self.config = c = config
        hidden, q_size, kv_size = c.hidden_size, c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
        self.embed_norm, self.hidden_norm = DraftNorm(hidden, c.rms_norm_eps), DraftNorm(hidden, c.rms_norm_eps)
        self.fc = DraftLinear(2 * hidden, hidden, bias=False)
        self.input_norm = DraftNorm(hidden, c.rms_norm_eps)
        self.qkv_proj = DraftLinear(hidden, q_size + 2 * kv_size, bias=False)
        self.o_proj = DraftLinear(q_size, hidden, bias=False)
        self.post_attention_norm = DraftNorm(hidden, c.rms_norm_eps)
        self.gate_up_proj = DraftLinear(hidden, 2 * c.intermediate_size, bias=False)
        self.down_proj = DraftLinear(c.intermediate_size, hidden, bias=False)
        self.out_norm = DraftNorm(hidden, c.rms_norm_eps)
        self.lm_head = DraftLinear(hidden, c.draft_vocab_size, bias=False)  # the target's rows, kept frozen
        self.register_buffer("draft_vocab", torch.zeros(c.draft_vocab_size, dtype=torch.long))
        self.rope = RotaryEmbedding(c.head_dim, c.rope_theta)
        self.act = get_gated_activation(c.hidden_act)
        self.sizes = [q_size, kv_size, kv_size]

    @property
    def scale(self) -> float:
        return self.config.head_dim ** -0.5

    def project(self, embeds: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor, max_len: int | None = None
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """The residual stream and rotated q, k, v of entries (``embeds``: of the token after each hidden state);
        ``max_len``: past the largest position, where the caller knows it (else read from ``positions``)."""
        x = self.fc(torch.cat([self.embed_norm(embeds), self.hidden_norm(hidden)], dim=-1))
        qkv = self.qkv_proj(self.input_norm(x))
        num, head_dim = x.shape[0], self.config.head_dim
        if max_len is None:
            max_len = int(positions.max()) + 1 if positions.numel() else 1
        cos, sin = self.rope(positions, max_len)
        q_size, kv_size, _ = self.sizes
        if not torch.is_grad_enabled():  # proposing: rotated in place by one kernel call (it has no backward)
            q, k = norm_and_rotate_qk(qkv, q_size, kv_size, head_dim, cos, sin)
            return x, q, k, qkv[:, q_size + kv_size:]
        q, k, v = qkv.split(self.sizes, dim=-1)
        q = apply_rotary(q.reshape(num, -1, head_dim), cos, sin).reshape(num, -1)
        k = apply_rotary(k.reshape(num, -1, head_dim), cos, sin).reshape(num, -1)
        return x, q, k, v

    def finish(self, x: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
        """The predicted next hidden states from the residual stream and the attention output."""
        x = x + self.o_proj(attended)
        x = x + self.down_proj(self.act(self.gate_up_proj(self.post_attention_norm(x))))
        return self.out_norm(x)

    def forward(self, embeds: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor,
                attend: Attend, max_len: int | None = None) -> torch.Tensor:
        x, q, k, v = self.project(embeds, hidden, positions, max_len)
        return self.finish(x, attend(q, k, v))

    def logits(self, features: torch.Tensor) -> torch.Tensor:
        """Logits over the draft vocabulary ``[rows, draft_vocab_size]``, soft-capped as the target's."""
        return softcapped(self.lm_head(features), self.config.final_logit_softcapping)

    def argmax_columns(self, features: torch.Tensor) -> torch.Tensor | None:
        """Each row's argmax column of :meth:`logits` ([rows] int64) from the head's kernel, without the logits, where
        it gives one (the head's panels, AMX or vector); None where it does not or the logits are soft-capped (capped
        values may tie where the raw ones do not). It reads the logits in float32 where :meth:`logits` rounds them to
        the model's dtype first, so near-ties can break the other way: a proposal either way, verified by the target."""
        if self.config.final_logit_softcapping is not None:
            return None
        return self.lm_head.argmax_columns(features)

    def save(self, folder: Path, training: dict[str, Any] | None = None) -> None:
        """Write the config (with ``training``: what trained it) and the weights to ``folder``."""
        save_draft(self, self.config, folder, training)


def load_eagle_draft(folder: str | Path, device: torch.device, dtype: torch.dtype,
                     bits: int | None = None) -> EagleDraft:
    """The draft `jido train-draft --method eagle` wrote to ``folder``, in eval mode, its linear layers packed for
    proposing (in int8 / int4 codes with ``bits`` 8 / 4, where the int8 kernels run on this CPU).

    Raises:
        ValueError: the folder does not hold an EAGLE draft.
    """
    folder = Path(folder)
    draft = EagleDraft(EagleDraftConfig(**read_draft_config(folder, "eagle", "EAGLE")))
    return load_draft_weights(draft, folder, device, dtype, bits)
