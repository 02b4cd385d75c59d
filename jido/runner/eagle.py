"""EagleProposer: K tokens per request from an EAGLE draft layer on the target's hidden states, its KV in the pool."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch

from jido.attention.backend import AttentionLayerSpec, StepAttentionMetadata
from jido.config.speculative import SpeculativeConfig
from jido.core.kv_cache_spec import KVCacheConfig, KVCacheSpec
from jido.models.eagle import EagleDraft, load_eagle_draft
from jido.runner.draft_kv import DraftKV
from jido.runner.spec_decode import ProposalStep, ProposerContext, load_trained_draft
from jido.sampling.draft_vocab import DraftVocab
from jido.sampling.rejection_sampler import Drafts, sample_draft_chain


class EagleProposer:
    """``eagle``: the draft's entry ``i`` pairs the target's hidden state at position ``i`` with the token at
    ``i + 1``, in the draft's KV slot ``i``.

    After each step it first runs an entry for every position the target computed and kept (prefill chunks,
    verified tokens), so its KV covers every position with a known hidden state; its last entry predicts the
    hidden state of the new token, and each proposal's predicted state feeds the next entry. Entries written
    for proposals that are then rejected are simply written again.

    A prefix-cache hit brings the draft's entries with the target's blocks; the entry in a block's last slot
    pairs with the token after the block, so a request that shares the block but not that next token reads
    one entry made for another. That costs acceptance, never correctness: the target verifies every token.
    """

    def __init__(self, config: SpeculativeConfig, context: ProposerContext) -> None:
        self.context = context
        # int4 codes: on the AMX Xeon, the x4 draft at batch 1 proposed with the same acceptance as in int8 and
        # read half the bytes (its weights are streamed from memory once per proposed token), so proposing took
        # less time; end to end int4 ran ahead of int8, within the machine's noise
        # (benchmarks/results/spec_decode-2026-12-05-amx-xeon.md).
        self.draft: EagleDraft = load_trained_draft(config, context, load_eagle_draft, "EAGLE", quantized="int4")
        c, arch = self.draft.config, context.model_arch
        draft_arch = replace(arch, num_layers=1, sliding_windows=(None,), num_heads=c.num_heads,
                             num_kv_heads=c.num_kv_heads, head_dim=c.head_dim, intermediate_size=c.intermediate_size)
        self.kv = DraftKV(context, draft_arch, 1)
        self.vocab = DraftVocab(self.draft.draft_vocab, arch.vocab_size)
        self.spec = AttentionLayerSpec(num_heads=c.num_heads, num_kv_heads=c.num_kv_heads, head_dim=c.head_dim,
                                       scale=self.draft.scale, sliding_window=None, logit_softcap=None)

    def kv_cache_spec(self, first_layer_id: int) -> dict[int, KVCacheSpec]:
        return self.kv.kv_cache_spec(first_layer_id)

    def bind_kv_cache(self, kv_cache_config: KVCacheConfig, tensors: list[torch.Tensor],
                      target_caches: list[torch.Tensor], target_groups: list[int]) -> None:
        self.kv.bind_kv_cache(kv_cache_config, tensors, target_caches, target_groups)

    def remove(self, req_id: str) -> None:
        """Nothing per request: the draft's KV is the pool's, freed with the request's blocks."""

    @torch.inference_mode()
    def propose(self, step: ProposalStep) -> Drafts:
        k, sampled = step.num_speculative_tokens, step.inputs.sampled_req_ids
        first = self._first_pass(step)
        if not sampled or k == 0:
            return Drafts.deterministic([[] for _ in sampled])
        md = step.batch.sampling.metadata(step.inputs.sampled_rows.tolist())

        def advance(state: tuple[torch.Tensor, list[int]], ids: list[int]) -> tuple[torch.Tensor, list[int]]:
            # The next entry, at slot seq_len: the predicted hidden state with the token just proposed.
            features, seq_lens = state
            after = [n + 1 for n in seq_lens]
            return self._forward(torch.tensor(ids, device=features.device), features, seq_lens, [1] * len(ids),
                                 after, step.inputs.sampled_rows, step.batch.block_tables), after

        def greedy(state: tuple[torch.Tensor, list[int]]) -> torch.Tensor | None:
            columns = self.draft.argmax_columns(state[0])
            return None if columns is None else self.vocab.ids[columns]

        return sample_draft_chain(self.context.sampler, md, k, first, lambda state: self.draft.logits(state[0]),
                                  advance, self.vocab, greedy)

    def _first_pass(self, step: ProposalStep) -> tuple[torch.Tensor, list[int]]:
        """Entries for the positions the target computed and kept this step; the features of each sampled
        request's last entry, and the draft's context length after it."""
        inputs, batch = step.inputs, step.batch
        rejected = step.rejected()
        common = inputs.group_metadata[0]
        req_ids = list(step.sched.num_scheduled_tokens)
        rows = np.fromiter((batch.req_index[r] for r in req_ids), dtype=np.int64, count=len(req_ids))
        starts = np.concatenate([[0], np.cumsum(common.query_lens_list)]).astype(np.int64)
        firsts = [s - q for s, q in zip(common.seq_lens_list, common.query_lens_list)]
        # A position makes an entry once the token after it is known (a prompt scored with no output never is).
        keeps = [min(q - rejected.get(r, 0), int(batch.num_tokens[row]) - 1 - f)
                 for r, q, row, f in zip(req_ids, common.query_lens_list, rows, firsts)]
        live = [i for i, n in enumerate(keeps) if n > 0]
        if not live:
            return torch.empty(0), []
        hidden_rows = np.concatenate([np.arange(starts[i], starts[i] + keeps[i]) for i in live])
        positions = np.concatenate([np.arange(firsts[i], firsts[i] + keeps[i]) for i in live])
        rows, keeps = rows[live], [keeps[i] for i in live]
        # Each entry's token: the one after its position (the prompt's next, a verified one, or the new one).
        next_ids = batch.token_ids[np.repeat(rows, keeps), positions + 1]
        seq_lens = [firsts[i] + n for i, n in zip(live, keeps)]
        device = step.hidden.device
        features = self._forward(torch.from_numpy(next_ids).to(device),
                                 step.hidden[torch.from_numpy(hidden_rows).to(device)], positions.tolist(), keeps,
                                 seq_lens, rows, batch.block_tables)
        at = {req_ids[i]: j for j, i in enumerate(live)}
        ends = np.cumsum(keeps) - 1
        last = torch.tensor([int(ends[at[r]]) for r in inputs.sampled_req_ids], dtype=torch.long, device=device)
        return features[last], [seq_lens[at[r]] for r in inputs.sampled_req_ids]

    def _forward(self, token_ids: torch.Tensor, hidden: torch.Tensor, positions: list[int], query_lens: list[int],
                 seq_lens: list[int], rows: np.ndarray, block_tables: list[np.ndarray]) -> torch.Tensor:
        """The draft's predicted hidden states for a flat batch of entries, writing their KV as it goes."""
        metadata: StepAttentionMetadata = self.kv.attention_metadata(query_lens, seq_lens, rows, block_tables)
        cache, layer_metadata = self.kv.caches[0], metadata.per_layer[0]
        embeds = self.context.model.embed(token_ids).to(hidden.dtype)

        def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            return self.context.attn_backend.forward(self.spec, q, k, v, cache, layer_metadata)

        return self.draft(embeds, hidden, torch.tensor(positions, device=hidden.device), attend, max(seq_lens))
