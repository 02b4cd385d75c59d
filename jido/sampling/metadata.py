"""SamplingMetadata: a batch's sampling settings as per-row tensors; TokenCounts: token statistics for penalties."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch


Rows = torch.Tensor | np.ndarray  # [B], one value per row


@dataclass
class SamplingMetadata:
    """How each of the B rows of a logits batch samples, as tensors the sampler works on in one go.

    Per-row tensors are [B] and live on the CPU (the sampler moves what it needs to the logits' device),
    so the flags below are computed without a device sync and the seeded-row loop reads plain ints.
    The neutral value of every setting is a no-op, so rows that do not use a feature cost nothing
    beyond the rows that do.

    Contract:
      - ``temperature`` float32: 0 for a greedy row, else >= 1e-5 (SamplingParams' greedy threshold).
      - ``top_k`` int64: 0 = off; any k >= vocab is also a no-op. ``top_p`` float32 in (0, 1], 1 = off.
        ``min_p`` float32 in [0, 1], 0 = off.
      - ``repetition_penalty`` (1 = off), ``presence_penalty``/``frequency_penalty`` (0 = off) float32.
        The rows with any of them on are ``penalty_rows`` (derived, ascending); ``prompt_token_mask``
        [P, vocab] bool and ``output_token_counts`` [P, vocab] int32 hold those rows' token statistics in
        that order, on the logits' device, and are None when P is 0.
      - ``seeds`` int64 holds ``seed mod 2**63`` where ``has_seed`` is true (anything elsewhere);
        ``output_positions`` int64 is how many output tokens the row has, i.e. the position being sampled.
      - ``min_tokens`` int64 and ``stop_token_ids`` (one tuple per row, ids < vocab): while a row's
        output position is below its min_tokens, its stop_token_ids get -inf. The caller puts the EOS ids
        there too unless the request ignores EOS.
      - ``num_logprobs`` int64: -1 = no logprobs for the row, else how many top entries to report.
      - ``grammar_rows`` (ascending) are the rows under a structured-output grammar and ``grammar_bitmask``
        [G, ceil(vocab / 32)] int32 their allowed tokens (bit t % 32 of word t // 32); None when G is 0.
    """

    temperature: torch.Tensor
    top_k: torch.Tensor
    top_p: torch.Tensor
    min_p: torch.Tensor
    repetition_penalty: torch.Tensor
    presence_penalty: torch.Tensor
    frequency_penalty: torch.Tensor
    seeds: torch.Tensor
    has_seed: torch.Tensor
    output_positions: torch.Tensor
    min_tokens: torch.Tensor
    stop_token_ids: list[tuple[int, ...]]
    num_logprobs: torch.Tensor
    prompt_token_mask: torch.Tensor | None = None
    output_token_counts: torch.Tensor | None = None
    grammar_rows: torch.Tensor | None = None  # [G] int64, CPU
    grammar_bitmask: torch.Tensor | None = None  # [G, words] int32, CPU
    # Derived in __post_init__; the filter flags look at random rows only (greedy rows ignore them).
    all_greedy: bool = field(init=False)
    all_random: bool = field(init=False)
    no_top_k: bool = field(init=False)
    no_top_p: bool = field(init=False)
    no_min_p: bool = field(init=False)
    penalty_rows: torch.Tensor | None = field(init=False)  # [P] int64, CPU; None when no row has penalties
    banned_rows: list[int] = field(init=False)  # rows still short of min_tokens with ids to ban
    max_num_logprobs: int | None = field(init=False)

    def __post_init__(self) -> None:
        # On numpy views of the [B] CPU tensors: each small torch op carries a dispatch cost that numpy's calls
        # on [B] arrays do not, and there are ~25 of them a step.
        random = self.temperature.numpy() > 0
        self.all_greedy = not random.any()
        self.all_random = bool(random.all())
        self.no_top_k = not (self.top_k.numpy()[random] > 0).any()
        self.no_top_p = not (self.top_p.numpy()[random] < 1).any()
        self.no_min_p = not (self.min_p.numpy()[random] > 0).any()
        penalized = needs_penalties(self.repetition_penalty.numpy(), self.presence_penalty.numpy(),
                                    self.frequency_penalty.numpy())
        self.penalty_rows = torch.from_numpy(np.flatnonzero(penalized)) if penalized.any() else None
        _check_counts(self)
        short = np.flatnonzero(self.output_positions.numpy() < self.min_tokens.numpy()).tolist()
        self.banned_rows = [row for row in short if self.stop_token_ids[row]]
        num_logprobs = self.num_logprobs.numpy()
        self.max_num_logprobs = int(num_logprobs.max()) if (num_logprobs >= 0).any() else None

    @property
    def num_rows(self) -> int:
        return self.temperature.shape[0]

    @property
    def no_penalties(self) -> bool:
        return self.penalty_rows is None

    @property
    def plain_greedy(self) -> bool:
        """Whether each row's token is the argmax of its logits as they come: greedy rows, no penalties, no bans."""
        return self._greedy_unpenalized and self.grammar_rows is None

    @property
    def _greedy_unpenalized(self) -> bool:
        return self.all_greedy and self.no_penalties and not self.banned_rows

    @property
    def argmax_only(self) -> bool:
        """Whether each row's token is its logits' argmax and nothing else reads them: ``plain_greedy`` and no
        logprobs (the sampler then needs no logits: see ``Model.greedy_token_ids``)."""
        return self.plain_greedy and self.max_num_logprobs is None

    @property
    def argmax_under_grammar(self) -> bool:
        """Whether each row's token is its logits' argmax once grammar masks are applied, and nothing else reads
        them: ``argmax_only`` but for the masks (see :func:`jido.sampling.sampler.argmax_under_grammar`)."""
        return self._greedy_unpenalized and self.max_num_logprobs is None and self.grammar_rows is not None

    def row_bitmasks(self, num_rows: int) -> torch.Tensor:
        """Every row's grammar bitmask (int32 ``[num_rows, words]``): its grammar's for ``grammar_rows``, all bits set
        (every token allowed) for the others. Needs ``grammar_rows``."""
        assert self.grammar_rows is not None and self.grammar_bitmask is not None
        masks = torch.full((num_rows, self.grammar_bitmask.shape[1]), -1, dtype=torch.int32)
        masks[self.grammar_rows] = self.grammar_bitmask
        return masks


# The per-row tensors of SamplingMetadata, which a shifted copy gathers row by row.
_ROW_FIELDS = ("temperature", "top_k", "top_p", "min_p", "repetition_penalty", "presence_penalty",
               "frequency_penalty", "seeds", "has_seed", "output_positions", "min_tokens", "num_logprobs")


def shift_metadata(md: SamplingMetadata, source_rows: list[int], prefixes: list[list[int]]) -> SamplingMetadata:
    """Rows sampled as if tokens had been sampled first: row r is ``md``'s row ``source_rows[r]`` after ``prefixes[r]``.

    Speculative decoding samples position ``p + j`` of a request after its first ``j`` proposals; the
    target's distribution there is what the one-token-per-step run would see, so the output position
    (seeds, min-tokens bans) moves on by ``len(prefixes[r])`` and penalties count the prefix as output.
    ``source_rows`` must be non-decreasing (the penalty rows stay in ascending order).
    """
    index = torch.tensor(source_rows, dtype=torch.long)
    fields = {name: getattr(md, name)[index] for name in _ROW_FIELDS}
    fields["output_positions"] = fields["output_positions"] + torch.tensor([len(p) for p in prefixes],
                                                                           dtype=torch.long)
    mask = counts = None
    if md.penalty_rows is not None:
        where = {int(row): i for i, row in enumerate(md.penalty_rows)}
        rows = [r for r, source in enumerate(source_rows) if source in where]
        gather = torch.tensor([where[source_rows[r]] for r in rows], device=md.output_token_counts.device)
        mask, counts = md.prompt_token_mask[gather], md.output_token_counts[gather].clone()
        extra = [(i, t) for i, r in enumerate(rows) for t in prefixes[r] if t < counts.shape[1]]
        if extra:
            at = torch.tensor(extra, device=counts.device).T
            counts.index_put_((at[0], at[1]), torch.ones(len(extra), dtype=counts.dtype, device=counts.device),
                              accumulate=True)
    return SamplingMetadata(**fields, stop_token_ids=[md.stop_token_ids[s] for s in source_rows],
                            prompt_token_mask=mask, output_token_counts=counts)


def with_grammar(md: SamplingMetadata, req_ids: list[str], bitmasks: dict[str, np.ndarray],
                 num_rows: list[int] | None = None) -> SamplingMetadata:
    """``md`` with the grammar bitmasks of the requests that have one: request ``req_ids[i]`` owns ``num_rows[i]``
    consecutive rows of ``md`` (one each by default; 1 + K where a step verifies K proposals), and its bitmasks
    ([rows, words], :class:`jido.core.outputs.SchedulerOutput`) one for each."""
    num_rows = num_rows or [1] * len(req_ids)
    rows, masks, start = [], [], 0
    for req_id, count in zip(req_ids, num_rows):
        if req_id in bitmasks:
            mask = bitmasks[req_id].reshape(-1, bitmasks[req_id].shape[-1])
            if len(mask) != count:
                raise ValueError(f"request {req_id} samples {count} rows but has {len(mask)} grammar bitmasks")
            rows.extend(range(start, start + count))
            masks.append(mask)
        start += count
    if rows:
        md.grammar_rows = torch.tensor(rows, dtype=torch.long)
        md.grammar_bitmask = torch.from_numpy(np.concatenate(masks))
    return md


def needs_penalties(repetition: Rows, presence: Rows, frequency: Rows) -> Rows:
    """Which rows have any penalty on ([B] bool, a tensor or an array as given): the one rule for metadata and the
    rows it counts tokens for."""
    return (repetition != 1) | (presence != 0) | (frequency != 0)


def _check_counts(md: SamplingMetadata) -> None:
    num_penalized = 0 if md.penalty_rows is None else md.penalty_rows.numel()
    for name in ("prompt_token_mask", "output_token_counts"):
        counts = getattr(md, name)
        rows = 0 if counts is None else counts.shape[0]
        if rows != num_penalized:
            raise ValueError(f"{name} must have one row per row with penalties ({num_penalized}), got {rows}")


class TokenCounts:
    """Per-row token statistics that penalties need, kept on the device and updated incrementally.

    Row i is the prompt mask ([vocab] bool: the ids the prompt holds) and the output counts ([vocab]
    int32: how often each id was sampled) of whatever request the owner keeps in slot i. The tensors
    ([num_rows, vocab]) are allocated on the first ``set_row``, so a batch that never uses penalties
    never pays for them. Ids >= vocab (tokenizer entries the logits lack) are ignored.
    """

    def __init__(self, num_rows: int, vocab_size: int, device: torch.device | str = "cpu") -> None:
        self.num_rows = num_rows
        self.vocab_size = vocab_size
        self.device = torch.device(device)
        self.prompt_mask: torch.Tensor | None = None
        self.output_counts: torch.Tensor | None = None

    @property
    def allocated(self) -> bool:
        return self.prompt_mask is not None

    def set_row(self, row: int, prompt_token_ids: list[int], output_token_ids: list[int]) -> None:
        """Make ``row`` describe a request from scratch (a new one, or one resumed after preemption)."""
        if self.prompt_mask is None:
            shape = (self.num_rows, self.vocab_size)
            self.prompt_mask = torch.zeros(shape, dtype=torch.bool, device=self.device)
            self.output_counts = torch.zeros(shape, dtype=torch.int32, device=self.device)
        self.prompt_mask[row] = False
        self.prompt_mask[row, self._ids(prompt_token_ids)] = True
        self.output_counts[row] = torch.bincount(self._ids(output_token_ids), minlength=self.vocab_size)

    def add_output_tokens(self, rows: torch.Tensor, token_ids: torch.Tensor) -> None:
        """Count one new output token per listed row: ``rows`` and ``token_ids`` are [N] int64, ids < vocab."""
        ones = torch.ones(rows.shape, dtype=torch.int32, device=self.device)
        self.output_counts.index_put_((rows.to(self.device), token_ids.to(self.device)), ones, accumulate=True)

    def move_row(self, src: int, dst: int) -> None:
        """Copy row ``src`` into row ``dst`` (condensing a batch); ``src`` is left as it was."""
        self.prompt_mask[dst] = self.prompt_mask[src]
        self.output_counts[dst] = self.output_counts[src]

    def select(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The [len(rows), vocab] mask and counts of ``rows`` (CPU int64): views when the rows are consecutive."""
        first, count = int(rows[0]), rows.numel()
        if bool((rows == torch.arange(first, first + count)).all()):
            return self.prompt_mask[first:first + count], self.output_counts[first:first + count]
        index = rows.to(self.device)
        return self.prompt_mask[index], self.output_counts[index]

    def _ids(self, token_ids: list[int]) -> torch.Tensor:
        ids = torch.tensor(token_ids, dtype=torch.long)
        return ids[ids < self.vocab_size].to(self.device)
