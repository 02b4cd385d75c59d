"""MedusaProposer: K tokens per request from Medusa heads on the target's hidden state at its newest token."""
from __future__ import annotations

import numpy as np
import torch

from jido.config.speculative import SpeculativeConfig
from jido.core.kv_cache_spec import KVCacheConfig, KVCacheSpec
from jido.models.medusa import MedusaHeads, load_medusa_heads
from jido.runner.spec_decode import ProposalStep, ProposerContext, load_trained_draft
from jido.sampling.draft_vocab import DraftVocab
from jido.sampling.rejection_sampler import Drafts, sample_draft_chain


class MedusaProposer:
    """``medusa``: head ``k`` guesses the token ``k`` places after the step's new one, from the hidden state that
    sampled the new one; the guesses form the chain the next step verifies.

    A head's distribution does not read the guesses before it, yet each is a distribution over its position given
    the context, which is all exact verification needs. The heads hold no KV: nothing to write, nothing to roll
    back. K is at most the number of heads trained.
    """

    def __init__(self, config: SpeculativeConfig, context: ProposerContext) -> None:
        self.context = context
        self.heads: MedusaHeads = load_trained_draft(config, context, load_medusa_heads, "Medusa")
        c = self.heads.config
        if not config.is_auto and config.max_num_speculative_tokens > c.num_heads:
            raise ValueError(f"num_speculative_tokens ({config.max_num_speculative_tokens}) exceeds the {c.num_heads} "
                             f"Medusa heads in {config.model}: each proposal needs a head of its own")
        self.vocab = DraftVocab(self.heads.draft_vocab, context.model_arch.vocab_size)

    def kv_cache_spec(self, first_layer_id: int) -> dict[int, KVCacheSpec]:
        return {}  # heads on hidden states: no KV

    def bind_kv_cache(self, kv_cache_config: KVCacheConfig, tensors: list[torch.Tensor],
                      target_caches: list[torch.Tensor], target_groups: list[int]) -> None:
        """Nothing to bind."""

    def remove(self, req_id: str) -> None:
        """Nothing per request."""

    @torch.inference_mode()
    def propose(self, step: ProposalStep) -> Drafts:
        inputs = step.inputs
        k = min(step.num_speculative_tokens, self.heads.config.num_heads)
        if not inputs.sampled_req_ids or k == 0:
            return Drafts.deterministic([[] for _ in inputs.sampled_req_ids])
        hidden = step.hidden[self._newest_rows(step)]
        md = step.batch.sampling.metadata(inputs.sampled_rows.tolist())

        def logits_of(head: int) -> torch.Tensor:
            return self.heads.logits(self.heads.features(hidden, head))

        return sample_draft_chain(self.context.sampler, md, k, 0, logits_of, lambda head, ids: head + 1, self.vocab)

    @staticmethod
    def _newest_rows(step: ProposalStep) -> torch.Tensor:
        """Per sampled request, the row of ``step.hidden`` its newest token was sampled from: its last accepted
        proposal's position, or its last input's when none held."""
        inputs = step.inputs
        starts = np.concatenate([[0], np.cumsum([len(d) + 1 for d in inputs.draft_token_ids])[:-1]])
        kept = np.array([max(1, len(ids)) for ids in step.verified.token_ids])
        return inputs.logits_indices[torch.from_numpy(starts + kept - 1).to(inputs.logits_indices.device)]
