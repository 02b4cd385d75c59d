"""SamplingBatch: the persistent, slot-indexed sampling settings and token counts of the runner's requests."""
from __future__ import annotations

from collections.abc import Sequence

import torch

from jido.core.sampling_params import SamplingParams
from jido.sampling.metadata import SamplingMetadata, TokenCounts, needs_penalties

# Every per-slot tensor with its dtype and neutral value: greedy, nothing filtered, no penalties, no logprobs.
_FIELDS: dict[str, tuple[torch.dtype, float | int | bool]] = {
    "temperature": (torch.float32, 0.0), "top_k": (torch.int64, 0), "top_p": (torch.float32, 1.0),
    "min_p": (torch.float32, 0.0), "repetition_penalty": (torch.float32, 1.0),
    "presence_penalty": (torch.float32, 0.0), "frequency_penalty": (torch.float32, 0.0),
    "seeds": (torch.int64, 0), "has_seed": (torch.bool, False), "output_positions": (torch.int64, 0),
    "min_tokens": (torch.int64, 0), "num_logprobs": (torch.int64, -1),
}


class SamplingBatch:
    """Per-request sampling state in slots 0..max_num_seqs-1, patched per request instead of rebuilt per step.

    The owner (the runner) decides which request lives in which slot. A slot is written in full once
    (``add_request``), advanced by each output token sampled for it (``append_tokens``), moved when
    the owner condenses its batch (``move_request``) and forgotten when the request leaves
    (``remove_request``). ``metadata(slots)`` slices the rows the step samples, in that order, into a
    :class:`SamplingMetadata`; with slots 0..B-1 the per-row tensors are views, not copies.

    Invariants:
      - a slot's output position is the number of output tokens its request has, the position of the next
        sample, as long as the owner calls ``append_tokens`` once per sampled token;
      - token counts exist (and are kept up to date) only for slots whose request has penalties.

    NOTE: metadata tensors may be views of this batch: use them before the next patch.
    """

    def __init__(self, max_num_seqs: int, vocab_size: int, device: torch.device | str = "cpu") -> None:
        self.max_num_seqs = max_num_seqs
        self.vocab_size = vocab_size
        self.columns = {name: torch.full((max_num_seqs,), neutral, dtype=dtype)
                        for name, (dtype, neutral) in _FIELDS.items()}
        self.stop_token_ids: list[tuple[int, ...]] = [()] * max_num_seqs
        self.token_counts = TokenCounts(max_num_seqs, vocab_size, device)

    def add_request(self, slot: int, params: SamplingParams, prompt_token_ids: list[int],
                    output_token_ids: list[int], eos_token_ids: tuple[int, ...]) -> None:
        """Write a request into ``slot`` in full: a new request, or one resumed with its earlier output."""
        values = {
            "temperature": 0.0 if params.is_greedy else params.temperature, "top_k": max(params.top_k, 0),
            "top_p": params.top_p, "min_p": params.min_p, "repetition_penalty": params.repetition_penalty,
            "presence_penalty": params.presence_penalty, "frequency_penalty": params.frequency_penalty,
            # (seed * mix + position) mod 2**63 depends only on seed mod 2**63, which fits an int64.
            "seeds": 0 if params.seed is None else params.seed % 2**63, "has_seed": params.seed is not None,
            "output_positions": len(output_token_ids), "min_tokens": params.min_tokens,
            "num_logprobs": -1 if params.logprobs is None else params.logprobs,
        }
        for name, value in values.items():
            self.columns[name][slot] = value
        banned = list(params.stop_token_ids) + ([] if params.ignore_eos else list(eos_token_ids))
        self.stop_token_ids[slot] = tuple(t for t in banned if t < self.vocab_size)
        if self._penalized(slot):
            self.token_counts.set_row(slot, prompt_token_ids, output_token_ids)

    def remove_request(self, slot: int) -> None:
        """Reset ``slot`` to the neutral settings; its token counts row is left to be overwritten."""
        for name, (_, neutral) in _FIELDS.items():
            self.columns[name][slot] = neutral
        self.stop_token_ids[slot] = ()

    def move_request(self, src: int, dst: int) -> None:
        """Move the request in ``src`` to the free slot ``dst``; ``src`` becomes free."""
        for column in self.columns.values():
            column[dst] = column[src]
        self.stop_token_ids[dst] = self.stop_token_ids[src]
        if self._penalized(src):
            self.token_counts.move_row(src, dst)
        self.remove_request(src)

    def append_tokens(self, slots: Sequence[int], token_ids: Sequence[int] | torch.Tensor) -> None:
        """Record sampled tokens, ``token_ids[i]`` for ``slots[i]`` (a slot repeats for several tokens, in order;
        a tensor may be on any device)."""
        index = torch.tensor(slots, dtype=torch.long)
        token_ids = torch.as_tensor(token_ids, dtype=torch.long)
        positions = self.columns["output_positions"]
        positions.index_add_(0, index, torch.ones_like(index))
        penalized = self._penalty_mask(index)
        if bool(penalized.any()):
            self.token_counts.add_output_tokens(index[penalized], token_ids[penalized.to(token_ids.device)])

    def metadata(self, slots: Sequence[int]) -> SamplingMetadata:
        """The settings of ``slots``, row i of the batch being slot ``slots[i]``."""
        index = _index(slots)
        penalized = self._penalty_mask(index)
        prompt_mask = output_counts = None
        if bool(penalized.any()):
            prompt_mask, output_counts = self.token_counts.select(torch.arange(self.max_num_seqs)[index][penalized])
        return SamplingMetadata(**{name: column[index] for name, column in self.columns.items()},
                                stop_token_ids=[self.stop_token_ids[s] for s in slots],
                                prompt_token_mask=prompt_mask, output_token_counts=output_counts)

    def _penalty_mask(self, index: slice | torch.Tensor) -> torch.Tensor:
        return needs_penalties(self.columns["repetition_penalty"][index], self.columns["presence_penalty"][index],
                               self.columns["frequency_penalty"][index])

    def _penalized(self, slot: int) -> bool:
        return bool(self._penalty_mask(slice(slot, slot + 1)))


def _index(slots: Sequence[int]) -> slice | torch.Tensor:
    # Slots 0..B-1 (a condensed batch sampling every request) slice without copying.
    if list(slots) == list(range(len(slots))):
        return slice(0, len(slots))
    return torch.tensor(slots, dtype=torch.long)
