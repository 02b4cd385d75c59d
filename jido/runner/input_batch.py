"""The runner's per-request state and the flat batch of inputs built from it each step."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from jido.attention.backend import AttentionMetadata
from jido.core.outputs import SchedulerOutput
from jido.core.sampling_params import SamplingParams
from jido.sampling.sampler import SamplingRow


@dataclass
class CachedRequestState:
    """What the runner keeps about a request between steps."""

    req_id: str
    token_ids: list[int]
    num_prompt_tokens: int
    sampling_params: SamplingParams
    eos_token_ids: tuple[int, ...]
    block_ids: list[int]
    num_computed_tokens: int

    def sampling_row(self) -> SamplingRow:
        return SamplingRow(self.sampling_params, self.token_ids[:self.num_prompt_tokens],
                           self.token_ids[self.num_prompt_tokens:], self.eos_token_ids)


@dataclass
class ModelInputs:
    input_ids: torch.Tensor  # [num_tokens]
    positions: torch.Tensor  # [num_tokens]
    metadata: AttentionMetadata
    logits_indices: torch.Tensor  # [num_sampled] rows of the hidden states to sample from
    sampled_req_ids: list[str]


def update_states(states: dict[str, CachedRequestState], sched: SchedulerOutput) -> None:
    """Apply the scheduler's diffs: drop finished/preempted requests, add new ones, extend the rest."""
    for req_id in sched.finished_req_ids:
        states.pop(req_id, None)
    for new in sched.scheduled_new_reqs:
        states[new.req_id] = CachedRequestState(new.req_id, list(new.token_ids), new.num_prompt_tokens,
                                                new.sampling_params, new.eos_token_ids, list(new.block_ids),
                                                new.num_computed_tokens)
    for cached in sched.scheduled_cached_reqs:
        state = states[cached.req_id]
        state.block_ids.extend(cached.new_block_ids)
        state.num_computed_tokens = cached.num_computed_tokens


def build_inputs(states: dict[str, CachedRequestState], sched: SchedulerOutput, block_size: int,
                 device: torch.device) -> ModelInputs:
    """Lay the scheduled tokens of every request end to end, with their positions and cache slots."""
    req_ids = list(sched.num_scheduled_tokens)
    query_lens = [sched.num_scheduled_tokens[r] for r in req_ids]
    starts = [states[r].num_computed_tokens for r in req_ids]
    seq_lens = [s + n for s, n in zip(starts, query_lens)]
    input_ids = np.concatenate([np.asarray(states[r].token_ids[s:e], dtype=np.int64)
                                for r, s, e in zip(req_ids, starts, seq_lens)])
    positions = np.concatenate([np.arange(s, e, dtype=np.int64) for s, e in zip(starts, seq_lens)])
    block_table = _block_table([states[r].block_ids for r in req_ids])
    req_index = np.repeat(np.arange(len(req_ids)), query_lens)
    slots = block_table[req_index, positions // block_size].astype(np.int64) * block_size + positions % block_size
    query_start_loc = np.concatenate([[0], np.cumsum(query_lens)]).astype(np.int32)
    # A request samples once all its known tokens are computed; a mid-prompt chunk does not.
    sampled = [i for i, r in enumerate(req_ids) if seq_lens[i] == len(states[r].token_ids)]
    metadata = AttentionMetadata(
        query_start_loc=torch.from_numpy(query_start_loc).to(device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        block_tables=torch.from_numpy(block_table).to(device),
        slot_mapping=torch.from_numpy(slots).to(device),
        block_size=block_size, query_lens_list=query_lens, seq_lens_list=seq_lens)
    return ModelInputs(
        input_ids=torch.from_numpy(input_ids).to(device), positions=torch.from_numpy(positions).to(device),
        metadata=metadata,
        logits_indices=torch.tensor([query_start_loc[i + 1] - 1 for i in sampled], dtype=torch.long, device=device),
        sampled_req_ids=[req_ids[i] for i in sampled])


def _block_table(block_ids: list[list[int]]) -> np.ndarray:
    # [num_reqs, max_num_blocks], padded with block 0 (never read: masked by seq_lens)
    table = np.zeros((len(block_ids), max(len(b) for b in block_ids)), dtype=np.int32)
    for i, ids in enumerate(block_ids):
        table[i, :len(ids)] = ids
    return table
