"""SpecDecoder: the runner's half of speculative decoding — verify a step's proposals, propose the next ones."""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

from jido.config.speculative import SpeculativeConfig
from jido.core.outputs import SchedulerOutput
from jido.runner.input_batch import InputBatch, ModelInputs
from jido.sampling.metadata import shift_metadata
from jido.sampling.ngram_proposer import NgramProposer
from jido.sampling.rejection_sampler import Drafts, RejectionSampler, VerifiedTokens
from jido.sampling.sampler import Sampler


@dataclass
class ProposalStep:
    """What a proposer may read after a step: its batch (verified tokens appended) and its forward pass."""

    sched: SchedulerOutput
    inputs: ModelInputs
    batch: InputBatch
    hidden: torch.Tensor  # [num_tokens, hidden] the target's last hidden states of the step's tokens
    verified: VerifiedTokens  # per sampled request (``inputs.sampled_req_ids``), its new tokens
    num_speculative_tokens: int  # K: propose at most this many per request


class Proposer(Protocol):
    """Proposes the tokens that should follow each sampled request's new tokens.

    Contract: ``propose`` is called once per step that sampled something, after the step's verified tokens
    were appended to the batch, and returns :class:`Drafts` for ``step.inputs.sampled_req_ids`` in that
    order, at most ``num_speculative_tokens`` each (none is fine). A proposer with a distribution q returns
    it per proposal: the rejection sampler needs it next step. ``remove`` forgets a request that
    finished or was preempted (a resumed one comes back as new).
    """

    def propose(self, step: ProposalStep) -> Drafts: ...

    def remove(self, req_id: str) -> None: ...


class NgramDrafter:
    """The ``ngram`` method on the runner's token rows."""

    def __init__(self, config: SpeculativeConfig, **_: Any) -> None:
        self.ngrams = NgramProposer(config.prompt_lookup_min, config.prompt_lookup_max)

    def propose(self, step: ProposalStep) -> Drafts:
        batch, k = step.batch, step.num_speculative_tokens
        return Drafts.deterministic([
            self.ngrams.propose(req_id, batch.token_ids[row, :batch.num_tokens[row]], k)
            for req_id, row in zip(step.inputs.sampled_req_ids, step.inputs.sampled_rows.tolist())])

    def remove(self, req_id: str) -> None:
        self.ngrams.remove(req_id)


# method -> (module, class) of its proposer, imported only when asked for.
_PROPOSERS: dict[str, tuple[str, str]] = {
    "ngram": ("jido.runner.spec_decode", "NgramDrafter"),
}


def make_proposer(config: SpeculativeConfig, **context: Any) -> Proposer:
    """The proposer of ``config.method``, given what it may need of the runner (model, caches, device)."""
    module_name, class_name = _PROPOSERS[config.method]
    return getattr(importlib.import_module(module_name), class_name)(config, **context)


class SpecDecoder:
    """Verifies the proposals a step computed and asks the proposer for the next step's.

    Keeps, between steps, the draft distributions q of the proposals it handed out (the scheduler sends
    back a prefix of them to verify, possibly cut short by the budget or ``max_tokens``).
    """

    def __init__(self, config: SpeculativeConfig, sampler: Sampler, proposer: Proposer) -> None:
        self.config = config
        self.rejection = RejectionSampler(sampler)
        self.proposer = proposer
        self._draft_probs: dict[str, torch.Tensor] = {}

    def update(self, sched: SchedulerOutput) -> None:
        for req_id in sched.finished_req_ids:
            self.proposer.remove(req_id)
            self._draft_probs.pop(req_id, None)

    def verify(self, logits: torch.Tensor, inputs: ModelInputs, batch: InputBatch) -> VerifiedTokens:
        """The sampled requests' new tokens from ``logits`` at ``inputs.logits_indices`` (used up)."""
        drafts = inputs.draft_token_ids
        md = batch.sampling.metadata(inputs.sampled_rows.tolist())
        if any(drafts):
            # Row j of request i samples the position after its first j proposals.
            sources = np.repeat(np.arange(len(drafts)), [len(d) + 1 for d in drafts]).tolist()
            md = shift_metadata(md, sources, [d[:j] for d in drafts for j in range(len(d) + 1)])
        probs = []
        for req_id, ids in zip(inputs.sampled_req_ids, drafts):
            q = self._draft_probs.pop(req_id, None)
            probs.append(None if q is None or not ids else q[:len(ids)])
        return self.rejection.verify(logits, md, Drafts(drafts, probs))

    def propose(self, step: ProposalStep) -> dict[str, list[int]]:
        drafts = self.proposer.propose(step)
        proposals = {}
        for req_id, ids, q in zip(step.inputs.sampled_req_ids, drafts.token_ids, drafts.probs):
            if ids:
                proposals[req_id] = ids
                if q is not None:
                    self._draft_probs[req_id] = q
        return proposals
