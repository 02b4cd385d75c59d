"""Batched logit and probability filters: penalties, min-tokens bans, temperature, top-k, top-p and min-p."""
from __future__ import annotations

from dataclasses import dataclass

import torch

# NOTE: every filter takes a batch of rows with one setting per row and must give, row for row and bit
# for bit, the float32 result of the same step on that row alone (on the CPU, where cumsum runs in
# order): seeded requests keep their tokens only so. A row's neutral setting leaves it untouched.

# Room past the largest top-k for logits tied with a row's k-th, which top-k keeps too (bf16 logits
# tie often); a batch with more ties than that keeps its full-vocabulary probabilities.
_TIE_ROOM = 64
# Truncation pays off only while the kept candidates are a small part of the vocabulary.
_MAX_CANDIDATE_FRACTION = 1 / 16


@dataclass
class Probs:
    """Filtered probabilities of R rows, full or truncated to each row's candidates.

    Full: ``values`` is [R, vocab] and ``token_ids`` None. Truncated (every row had top-k): ``values``
    is [R, n], descending in each row, ``token_ids`` [R, n] their vocabulary ids, and every other token
    has probability 0. Either way the row's probabilities are exactly those of the full computation.
    """

    values: torch.Tensor
    token_ids: torch.Tensor | None
    vocab_size: int

    def select(self, rows: torch.Tensor) -> Probs:
        return Probs(self.values[rows], None if self.token_ids is None else self.token_ids[rows], self.vocab_size)

    def full_rows(self, rows: torch.Tensor) -> torch.Tensor:
        """The [len(rows), vocab] probabilities of ``rows``."""
        if self.token_ids is None:
            return self.values[rows]
        full = torch.zeros(rows.numel(), self.vocab_size, dtype=self.values.dtype, device=self.values.device)
        return full.scatter_(1, self.token_ids[rows], self.values[rows])


def apply_penalties(logits: torch.Tensor, rows: torch.Tensor, prompt_mask: torch.Tensor, output_counts: torch.Tensor,
                    repetition: torch.Tensor, presence: torch.Tensor, frequency: torch.Tensor) -> None:
    """Repetition (HF: prompt and output tokens) then presence and frequency (OpenAI: output only), in place.

    Row ``rows[i]`` of ``logits`` ([B, vocab]) gets the penalties ``repetition[i]``, ``presence[i]`` and
    ``frequency[i]`` over the tokens of ``prompt_mask[i]`` (bool) and ``output_counts[i]`` (int), [P, vocab].
    """
    # Only tokens of the prompt or the output change, a few hundred of the vocabulary per row: work on
    # those alone. An unseen token would lose frequency * 0 + presence * 0, nothing.
    index, token_ids = (prompt_mask | (output_counts > 0)).nonzero(as_tuple=True)  # [num_seen] each
    batch_rows = rows.to(logits.device)[index]
    values, counts = logits[batch_rows, token_ids], output_counts[index, token_ids]
    repetition, presence, frequency = (t.to(logits.device)[index] for t in (repetition, presence, frequency))
    values = torch.where(values > 0, values / repetition, values * repetition)
    values -= frequency * counts.to(values.dtype) + presence * (counts > 0)
    logits[batch_rows, token_ids] = values


def ban_tokens(logits: torch.Tensor, rows: list[int], token_ids: list[tuple[int, ...]]) -> None:
    """Set ``token_ids[i]`` (non-empty, ids < vocab) of row ``rows[i]`` to -inf, in place."""
    width = max(len(ids) for ids in token_ids)
    # Pad each row by repeating its first id: writing -inf twice is harmless. [K, width]
    padded = torch.tensor([list(ids) + [ids[0]] * (width - len(ids)) for ids in token_ids], device=logits.device)
    logits[torch.tensor(rows, device=logits.device)[:, None], padded] = float("-inf")


def apply_token_bitmask(logits: torch.Tensor, rows: torch.Tensor, bitmask: torch.Tensor) -> None:
    """-inf, in place, for every token of ``rows`` ([G] int64) whose bit in ``bitmask`` ([G, words] int32) is 0.

    Bit ``t % 32`` of word ``t // 32`` allows token ``t``; logits columns past the mask's bits are disallowed.
    """
    index = rows.to(logits.device)
    whole = index.numel() == logits.shape[0] and bool((index == torch.arange(index.numel(), device=index.device)).all())
    target = logits if whole else logits[index]
    words = bitmask.to(logits.device)
    full = min(words.shape[1], target.shape[1] // 32)  # words whose 32 tokens all have a logit
    # A grammar's mask is mostly whole words, all banned or all allowed: those are filled 32 logits at a time, and
    # only the mixed words (and a ragged tail) are unpacked bit by bit.
    blocks = target[:, :full * 32].view(target.shape[0], full, 32)
    whole_words = words[:, :full]
    blocks[whole_words == 0] = float("-inf")
    mixed = (whole_words != 0) & (whole_words != -1)
    if bool(mixed.any()):
        blocks[mixed] = blocks[mixed].masked_fill_(~_unpacked(whole_words[mixed][:, None], 32), float("-inf"))
    if full * 32 < target.shape[1]:
        tail = target[:, full * 32:]
        num_bits = min(tail.shape[1], (words.shape[1] - full) * 32)
        tail[:, :num_bits].masked_fill_(~_unpacked(words[:, full:], num_bits), float("-inf"))
        tail[:, num_bits:] = float("-inf")
    if not whole:
        logits[index] = target


def _unpacked(words: torch.Tensor, num_bits: int) -> torch.Tensor:
    """[N, num_bits] bool: bit ``t % 32`` of word ``t // 32`` of each row of ``words`` ([N, W] int32)."""
    shifts = torch.arange(32, dtype=torch.int32, device=words.device)
    return ((words[:, :, None] >> shifts) & 1).flatten(1)[:, :num_bits].bool()


def filtered_probs(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor | None = None,
                   top_p: torch.Tensor | None = None, min_p: torch.Tensor | None = None) -> Probs:
    """Probabilities after temperature ([R], > 0), top-k, top-p and min-p; None skips a filter for every row.

    ``logits`` [R, vocab] is divided by the temperature in place. When every row has top-k, top-p and
    min-p work on the few candidates top-k kept rather than on the whole vocabulary.
    """
    logits.div_(temperature.to(logits.device)[:, None])
    candidates = top_k_filter(logits, top_k) if top_k is not None else None
    # The softmax runs over the full vocabulary even when few tokens remain: summing in another order
    # would change the last bits.
    probs = torch.softmax(logits, dim=-1)
    filtered = Probs(probs if candidates is None else probs.gather(1, candidates), candidates, logits.shape[-1])
    if top_p is not None:
        top_p_filter(filtered, top_p)
    if min_p is not None:
        min_p_filter(filtered.values, min_p)
    return filtered


def top_k_filter(logits: torch.Tensor, top_k: torch.Tensor) -> torch.Tensor | None:
    """Keep each row's k highest logits and ties with the k-th (``top_k`` [R] int64 on the CPU, 0 = off), in place.

    Returns, when every row has top-k and they keep few tokens, [R, n] token ids in descending logit
    order that include every kept token; else None.
    """
    vocab = logits.shape[-1]
    top_k = top_k.clamp(max=vocab)
    max_k = int(top_k.max())
    every_row = bool((top_k > 0).all()) and max_k + _TIE_ROOM <= vocab * _MAX_CANDIDATE_FRACTION
    values, token_ids = logits.topk(max_k + _TIE_ROOM if every_row else max_k)  # [R, n], descending
    top_k = top_k.to(logits.device)[:, None]
    kth = values.gather(1, (top_k - 1).clamp(min=0)).masked_fill(top_k == 0, float("-inf"))
    logits.masked_fill_(logits < kth, float("-inf"))
    # The candidates hold every kept token when their last one is not kept itself.
    if every_row and bool((values[:, -1:] < kth).all()):
        return token_ids
    return None


def top_p_filter(probs: Probs, top_p: torch.Tensor) -> None:
    """Keep each row's smallest set of most likely tokens whose mass reaches top_p ([R] on the CPU, 1 = off), in place.

    A token is dropped when the mass of the tokens sorted before it already reaches top_p. The kept set
    is the one a full descending ``sort`` of the row keeps, even where equal probabilities straddle the cut.
    """
    if probs.token_ids is None:
        # Sorting the whole vocabulary is the costly part: only rows with top-p on pay for it.
        rows = (top_p < 1).nonzero().flatten().to(probs.values.device)
        probs.values[rows] = _top_p_sorted(probs.values[rows], top_p.to(rows.device)[rows])
        return
    top_p = top_p.to(probs.values.device)
    values = probs.values  # candidates, already in descending order
    drop = _nucleus_drop(values, top_p)
    # topk orders equal probabilities its own way; where the drop decision differs inside a run of equal
    # ones, which of them stay depends on that order, so those rows take the full sort.
    split_tie = ((values[:, 1:] == values[:, :-1]) & (drop[:, 1:] != drop[:, :-1]) & (values[:, 1:] > 0)).any(-1)
    rows = split_tie.nonzero().flatten()
    sorted_rows = _top_p_sorted(probs.full_rows(rows), top_p[rows]) if rows.numel() else None
    values.masked_fill_(drop, 0.0)
    if sorted_rows is not None:
        values[rows] = sorted_rows.gather(1, probs.token_ids[rows])


def min_p_filter(probs: torch.Tensor, min_p: torch.Tensor) -> None:
    """Drop tokens less likely than min_p ([R], 0 = off) times the row's most likely token, in place.

    ``probs`` is [R, vocab] or any [R, n] that holds each row's most likely token.
    """
    min_p = min_p.to(probs.device)
    probs.masked_fill_(probs < min_p[:, None] * probs.max(-1, keepdim=True).values, 0.0)


def _top_p_sorted(probs: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    values, order = probs.sort(descending=True)
    return probs.scatter(1, order, values.masked_fill(_nucleus_drop(values, top_p), 0.0))


def _nucleus_drop(sorted_probs: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    # A row with top_p 1 keeps everything, even where rounding makes the mass before a token reach 1.
    return (sorted_probs.cumsum(-1) - sorted_probs >= top_p[:, None]) & (top_p[:, None] < 1)
