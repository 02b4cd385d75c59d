"""PromptLogprobsCollector: the prompt logprobs of the requests that asked for them, gathered chunk by chunk."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from jido.core.outputs import PromptLogprobsLists, SchedulerOutput
from jido.sampling.prompt_logprobs import compute_prompt_logprobs

_MAX_LOGITS = 1 << 24  # float32 logits materialised at once (64 MiB), however long the chunk


@dataclass
class _Pending:
    prompt_token_ids: torch.Tensor  # [P]
    num_top: int
    parts: list[PromptLogprobsLists] = field(default_factory=list)  # one per computed chunk, in order


class PromptLogprobsCollector:
    """Scores prompt tokens as the steps compute them; a request's whole list leaves in one step.

    A prompt may be computed over several steps (chunked prefill). Each step the collector scores the
    rows of the requests that asked (row ``i`` of a chunk predicts the token after it) and hands a
    request's prompt logprobs over in the step that computes the end of its prompt: the step that samples
    its first token. Requests that did not ask cost nothing. The scheduler sends a request that owes
    prompt logprobs from position 0 (no prefix-cache hit); one that comes back with outputs after a
    preemption sent them already and is not scored again.
    """

    def __init__(self, compute_logits: Callable[[torch.Tensor], torch.Tensor], vocab_size: int,
                 device: torch.device) -> None:
        self.compute_logits = compute_logits
        self.device = device
        self.rows_per_slice = max(1, _MAX_LOGITS // vocab_size)
        self._pending: dict[str, _Pending] = {}

    def update(self, sched: SchedulerOutput) -> None:
        """Forget dropped requests; start a record for each new one that asked and still owes its list."""
        for req_id in sched.finished_req_ids:
            self._pending.pop(req_id, None)
        for new in sched.scheduled_new_reqs:
            num_top = new.sampling_params.prompt_logprobs
            if num_top is not None and len(new.token_ids) == new.num_prompt_tokens:
                prompt = torch.tensor(new.token_ids, dtype=torch.long, device=self.device)
                self._pending[new.req_id] = _Pending(prompt, num_top)

    def collect(self, sched: SchedulerOutput, hidden: torch.Tensor) -> dict[str, PromptLogprobsLists]:
        """Score this step's prompt rows; return the lists of the requests whose prompts are now computed.

        NOTE: ``hidden`` ([num_tokens, hidden_size]) holds each request's scheduled tokens end to end in
        ``num_scheduled_tokens`` order, as ``InputBatch.prepare_inputs`` lays them out.
        """
        if not self._pending:
            return {}
        computed = {new.req_id: new.num_computed_tokens for new in sched.scheduled_new_reqs}
        computed.update((c.req_id, c.num_computed_tokens) for c in sched.scheduled_cached_reqs)
        done: dict[str, PromptLogprobsLists] = {}
        offset = 0
        for req_id, num_tokens in sched.num_scheduled_tokens.items():
            pending = self._pending.get(req_id)
            if pending is not None:
                start, prompt_len = computed[req_id], len(pending.prompt_token_ids)
                # The row of the last prompt token predicts the first output: that one is sampled, not scored.
                num_rows = max(min(start + num_tokens, prompt_len - 1) - start, 0)
                self._score(pending, hidden[offset:offset + num_rows], start)
                if start + num_tokens >= prompt_len:
                    done[req_id] = _concat(pending.parts)
                    del self._pending[req_id]
            offset += num_tokens
        return done

    def _score(self, pending: _Pending, hidden: torch.Tensor, start: int) -> None:
        for first in range(0, hidden.shape[0], self.rows_per_slice):
            rows = hidden[first:first + self.rows_per_slice]
            targets = pending.prompt_token_ids[start + first + 1:start + first + 1 + rows.shape[0]]
            pending.parts.append(compute_prompt_logprobs(self.compute_logits(rows), targets, pending.num_top))


def _concat(parts: list[PromptLogprobsLists]) -> PromptLogprobsLists:
    return PromptLogprobsLists([x for p in parts for x in p.logprobs], [x for p in parts for x in p.ranks],
                               [x for p in parts for x in p.top_token_ids],
                               [x for p in parts for x in p.top_logprobs])
