"""InputBatch: the runner's persistent per-request state, patched by each step's diffs, and the flat batch built from it."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from jido.attention.backend import AttentionMetadata, build_groups_metadata
from jido.core.outputs import NewRequestData, SchedulerOutput
from jido.sampling.batch import SamplingBatch
from jido.utils.host_copy import to_device


@dataclass
class ModelInputs:
    input_ids: torch.Tensor  # [num_tokens]
    positions: torch.Tensor  # [num_tokens]
    group_metadata: list[AttentionMetadata]  # one per KV cache group
    # [num_sampled + num_draft_tokens] rows of the hidden states to sample from: per sampled request its
    # proposals' positions, then its last (without proposals, one row per request)
    logits_indices: torch.Tensor
    sampled_req_ids: list[str]
    sampled_rows: np.ndarray  # [num_sampled] rows of the input batch they belong to
    draft_token_ids: list[list[int]]  # [num_sampled] the proposals each verifies this step (often none)


class InputBatch:
    """Every running request's tokens, progress and block tables in preallocated arrays, one row each.

    A request keeps its row from the step it arrives until it finishes or is preempted; each step only
    the changes are written (new requests, new blocks, new tokens), so the host work of a step grows with
    what changed, not with the context. The scheduler owns ``num_computed_tokens``: the batch takes its
    count from every step's diff and never advances it.
    """

    def __init__(self, max_num_reqs: int, num_groups: int, block_size: int, vocab_size: int,
                 device: torch.device) -> None:
        self.block_size = block_size
        self.device = device
        self.req_index: dict[str, int] = {}
        self._free_rows = list(range(max_num_reqs - 1, -1, -1))
        self.token_ids = np.zeros((max_num_reqs, 256), dtype=np.int64)
        self.num_tokens = np.zeros(max_num_reqs, dtype=np.int64)
        self.num_prompt_tokens = np.zeros(max_num_reqs, dtype=np.int64)
        self.num_computed_tokens = np.zeros(max_num_reqs, dtype=np.int64)
        self.block_tables = [np.zeros((max_num_reqs, 16), dtype=np.int32) for _ in range(num_groups)]
        self.num_blocks = np.zeros((num_groups, max_num_reqs), dtype=np.int64)
        self.sampling = SamplingBatch(max_num_reqs, vocab_size, device)  # row i is sampling slot i

    # -- diffs ------------------------------------------------------------------------------------
    def update(self, sched: SchedulerOutput) -> None:
        """Apply the scheduler's diffs: drop finished/preempted requests, add new ones, extend the rest."""
        for req_id in sched.finished_req_ids:
            self.remove(req_id)
        for new in sched.scheduled_new_reqs:
            self.add(new)
        for cached in sched.scheduled_cached_reqs:
            row = self.req_index[cached.req_id]
            for group, block_ids in enumerate(cached.new_block_ids):
                self._append_blocks(group, row, block_ids)
            self.num_computed_tokens[row] = cached.num_computed_tokens

    def add(self, new: NewRequestData) -> None:
        row = self._free_rows.pop()
        self.req_index[new.req_id] = row
        self.num_tokens[row] = 0
        self.append_tokens(row, new.token_ids)
        self.num_prompt_tokens[row] = new.num_prompt_tokens
        self.num_computed_tokens[row] = new.num_computed_tokens
        for group, block_ids in enumerate(new.block_ids):
            self.num_blocks[group, row] = 0
            self._append_blocks(group, row, block_ids)
        prompt = new.token_ids[:new.num_prompt_tokens]
        self.sampling.add_request(row, new.sampling_params, prompt, new.token_ids[new.num_prompt_tokens:],
                                  new.eos_token_ids)

    def remove(self, req_id: str) -> None:
        row = self.req_index.pop(req_id, None)
        if row is not None:
            self.sampling.remove_request(row)
            self._free_rows.append(row)

    def append_tokens(self, row: int, token_ids: list[int]) -> None:
        start = int(self.num_tokens[row])
        end = start + len(token_ids)
        if end > self.token_ids.shape[1]:
            self.token_ids = _grown(self.token_ids, end)
        self.token_ids[row, start:end] = token_ids
        self.num_tokens[row] = end

    def append_sampled(self, rows: np.ndarray, token_ids: list[list[int]]) -> None:
        """Record each row's new tokens (one, or several from verified proposals): in the token rows and in
        the sampling state (output positions, penalty counts)."""
        counts = np.fromiter((len(ids) for ids in token_ids), dtype=np.int64, count=len(token_ids))
        ends = self.num_tokens[rows] + counts
        if int(ends.max()) > self.token_ids.shape[1]:
            self.token_ids = _grown(self.token_ids, int(ends.max()))
        token_rows = np.repeat(rows, counts)  # [num_new]: each new token's row
        flat = [t for ids in token_ids for t in ids]
        self.token_ids[token_rows, _ranges(ends - counts, counts)] = flat
        self.num_tokens[rows] = ends
        self.sampling.append_tokens(token_rows.tolist(), flat)

    def _append_blocks(self, group: int, row: int, block_ids: list[int]) -> None:
        if not block_ids:
            return
        start = int(self.num_blocks[group, row])
        end = start + len(block_ids)
        if end > self.block_tables[group].shape[1]:
            self.block_tables[group] = _grown(self.block_tables[group], end)
        self.block_tables[group][row, start:end] = block_ids
        self.num_blocks[group, row] = end

    def request_view(self, req_id: str) -> tuple[np.ndarray, int, list[np.ndarray]]:
        """One request's known tokens, computed count and block table per group (copies of its row)."""
        row = self.req_index[req_id]
        tables = [table[row, :self.num_blocks[g, row]].copy() for g, table in enumerate(self.block_tables)]
        return self.token_ids[row, :self.num_tokens[row]].copy(), int(self.num_computed_tokens[row]), tables

    # -- the step's flat batch --------------------------------------------------------------------
    def prepare_inputs(self, sched: SchedulerOutput, device: torch.device | None = None) -> ModelInputs:
        """Lay the scheduled tokens of every request end to end, with positions, slots and metadata, on ``device``
        (default: the batch's; the host for a step that CUDA graphs send to the GPU themselves)."""
        device = self.device if device is None else device
        req_ids = list(sched.num_scheduled_tokens)
        rows = np.fromiter((self.req_index[r] for r in req_ids), dtype=np.int64, count=len(req_ids))
        query_lens = list(sched.num_scheduled_tokens.values())
        query_lens_np = np.asarray(query_lens, dtype=np.int64)
        starts = self.num_computed_tokens[rows]
        seq_lens = starts + query_lens_np
        # [num_tokens]: which request each token belongs to, and its position in that request.
        token_req = np.repeat(np.arange(len(rows)), query_lens_np)
        cum = np.cumsum(query_lens_np)
        positions = np.arange(int(cum[-1])) - (cum - query_lens_np)[token_req] + starts[token_req]
        drafts = [sched.scheduled_spec_decode_tokens.get(r, []) for r in req_ids]
        num_drafts = self._write_drafts(rows, drafts)
        input_ids = self.token_ids[rows[token_req], positions]
        max_blocks = -(-int(seq_lens.max()) // self.block_size)
        seq_lens_list = seq_lens.tolist()
        group_metadata = build_groups_metadata(query_lens, seq_lens_list,
                                               [table[rows, :max_blocks] for table in self.block_tables],
                                               self.block_size, device)
        # A request samples once all its known tokens are computed (a mid-prompt chunk does not): at its
        # last known token and at each proposal after it.
        sampled = np.nonzero(seq_lens - num_drafts == self.num_tokens[rows])[0]
        num_rows = num_drafts[sampled] + 1  # request i's rows are the last num_rows[i] of its tokens
        logits_indices = _ranges(cum[sampled] - num_rows, num_rows)
        return ModelInputs(
            input_ids=to_device(input_ids, device),
            positions=to_device(positions, device),
            group_metadata=group_metadata,
            logits_indices=to_device(logits_indices, device),
            sampled_req_ids=[req_ids[i] for i in sampled],
            sampled_rows=rows[sampled],
            draft_token_ids=[drafts[i] for i in sampled])

    def _write_drafts(self, rows: np.ndarray, drafts: list[list[int]]) -> np.ndarray:
        """Put each request's proposals after its known tokens, where the step reads its inputs; returns their counts.

        They are not tokens of the request (``num_tokens`` stays): the tokens verified next take their places.
        """
        num_drafts = np.fromiter((len(d) for d in drafts), dtype=np.int64, count=len(drafts))
        for row, ids in zip(rows.tolist(), drafts):
            if ids:
                end = int(self.num_tokens[row]) + len(ids)
                if end > self.token_ids.shape[1]:
                    self.token_ids = _grown(self.token_ids, end)
                self.token_ids[row, end - len(ids):end] = ids
        return num_drafts


def _ranges(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """``starts[i], ..., starts[i] + counts[i] - 1`` for every i, end to end: [sum(counts)] int64."""
    within = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
    return np.repeat(starts, counts) + within


def _grown(array: np.ndarray, min_width: int) -> np.ndarray:
    """A copy of a 2-D array with at least ``min_width`` columns (doubling, so growth is amortised)."""
    width = max(min_width, 2 * array.shape[1])
    grown = np.zeros((array.shape[0], width), dtype=array.dtype)
    grown[:, :array.shape[1]] = array
    return grown
