"""DraftModelProposer: a smaller model (or the target's first layers) proposes tokens, its KV in the same pool."""
from __future__ import annotations

import numpy as np
import torch

from jido.config.speculative import SpeculativeConfig
from jido.core.kv_cache_spec import KVCacheConfig, KVCacheSpec
from jido.models.config import ModelArchConfig
from jido.models.loader import gguf_source, load_config, resolve_model
from jido.runner.draft_kv import DraftKV
from jido.runner import smoothing
from jido.runner.model_loading import load_model, resolve_quantization
from jido.runner.spec_decode import ProposalStep, ProposerContext
from jido.sampling.rejection_sampler import Drafts, sample_draft_chain


class DraftModelProposer:
    """``draft_model``: K tokens per request from a draft run autoregressively after each step.

    A separate draft (``model``) keeps its own KV in the pool, as layers after the target's (the scheduler
    allocates, caches and frees them with the target's); each step it first computes what the target
    computed and kept (prefill chunks, the verified tokens, the new token), so its KV always covers every
    computed position; rejected proposals' slots are simply written again later. The layer-truncated
    self-draft (``num_layers``) is the target's first layers: the target's own KV serves it, so it only runs
    the new tokens and its proposals.
    """

    def __init__(self, config: SpeculativeConfig, context: ProposerContext) -> None:
        self.context = context
        if config.num_layers is not None:
            if config.num_layers >= context.model_arch.num_layers:
                raise ValueError(f"speculative num_layers={config.num_layers}: the target has "
                                 f"{context.model_arch.num_layers} layers; a self-draft needs fewer")
            self.model, self.arch, self.num_layers = context.model, context.model_arch, config.num_layers
            self.shares_target_kv = True
        else:
            self.model, self.arch = _load_draft(config, context)
            self.num_layers, self.shares_target_kv = self.arch.num_layers, False
        self.kv = DraftKV(context, self.arch, self.num_layers, self.shares_target_kv)

    # -- the KV cache: the pool's (see DraftKV) ------------------------------------------------------
    def kv_cache_spec(self, first_layer_id: int) -> dict[int, KVCacheSpec]:
        return self.kv.kv_cache_spec(first_layer_id)

    def bind_kv_cache(self, kv_cache_config: KVCacheConfig, tensors: list[torch.Tensor],
                      target_caches: list[torch.Tensor], target_groups: list[int]) -> None:
        self.kv.bind_kv_cache(kv_cache_config, tensors, target_caches, target_groups)

    # -- proposing ------------------------------------------------------------------------------------
    def propose(self, step: ProposalStep) -> Drafts:
        k = step.num_speculative_tokens
        sampled = step.inputs.sampled_req_ids
        if k == 0 and self.shares_target_kv:
            return Drafts.deterministic([[] for _ in sampled])  # the target's KV needs no catching up
        first = self._first_pass(step)
        if not sampled or k == 0:
            return Drafts.deterministic([[] for _ in sampled])
        md = step.batch.sampling.metadata(step.inputs.sampled_rows.tolist())

        def advance(state: tuple[torch.Tensor, list[int]], ids: list[int]) -> tuple[torch.Tensor, list[int]]:
            seq_lens = [n + 1 for n in state[1]]
            return self._forward(ids, [n - 1 for n in seq_lens], [1] * len(ids), seq_lens, step.inputs.sampled_rows,
                                 step.batch.block_tables), seq_lens

        return sample_draft_chain(self.context.sampler, md, k, first, lambda state: self.model.compute_logits(state[0]),
                                  advance)

    def _first_pass(self, step: ProposalStep) -> tuple[torch.Tensor, list[int]]:
        """Run what the draft has not seen yet; the hidden states of each sampled request's last token, and its
        context length after it."""
        inputs, verified = step.inputs, step.verified
        new_token = {r: ids[-1] for r, ids in zip(inputs.sampled_req_ids, verified.token_ids)}
        rejected = step.rejected()
        common = inputs.group_metadata[0]
        req_ids = list(step.sched.num_scheduled_tokens)
        rows = np.fromiter((step.batch.req_index[r] for r in req_ids), dtype=np.int64, count=len(req_ids))
        token_ids: list[int] = []
        query_lens, seq_lens = [], []
        starts = np.concatenate([[0], np.cumsum(common.query_lens_list)])
        flat = inputs.input_ids.tolist()
        for i, req_id in enumerate(req_ids):
            query_len, seq_len = common.query_lens_list[i], common.seq_lens_list[i]
            keep = query_len - rejected.get(req_id, 0)  # the target's inputs that are now tokens
            ids = flat[starts[i]:starts[i] + keep] if not self.shares_target_kv else []
            if req_id in new_token:
                ids = ids + [new_token[req_id]]
            token_ids.extend(ids)
            query_lens.append(len(ids))
            seq_lens.append(seq_len - query_len + keep + (req_id in new_token))
        keep_rows = [i for i, n in enumerate(query_lens) if n]
        if not keep_rows:
            return torch.empty(0), []
        query_lens = [query_lens[i] for i in keep_rows]
        seq_lens = [seq_lens[i] for i in keep_rows]
        positions = np.concatenate([np.arange(s - q, s) for q, s in zip(query_lens, seq_lens)])
        hidden = self._forward(token_ids, positions.tolist(), query_lens, seq_lens, rows[keep_rows],
                               step.batch.block_tables)
        # Each sampled request's last row, and its context length after it.
        ends = np.cumsum(query_lens) - 1
        at = {req_ids[i]: j for j, i in enumerate(keep_rows)}
        last = torch.tensor([int(ends[at[r]]) for r in inputs.sampled_req_ids], dtype=torch.long, device=hidden.device)
        return hidden[last], [seq_lens[at[r]] for r in inputs.sampled_req_ids]

    def _forward(self, token_ids: list[int], positions: list[int], query_lens: list[int], seq_lens: list[int],
                 rows: np.ndarray, block_tables: list[np.ndarray]) -> torch.Tensor:
        """The draft's hidden states for a flat batch of the input batch's ``rows``, writing its KV as it goes.

        ``block_tables`` are the input batch's, one per pool group.
        """
        metadata = self.kv.attention_metadata(query_lens, seq_lens, rows, block_tables)
        device = self.context.device
        return self.model(torch.tensor(token_ids, device=device), torch.tensor(positions, device=device),
                          self.kv.caches, metadata)

    def remove(self, req_id: str) -> None:
        """Nothing per request: the draft's KV is the pool's, freed with the request's blocks."""


def _load_draft(config: SpeculativeConfig, context: ProposerContext) -> tuple[torch.nn.Module, ModelArchConfig]:
    folder = resolve_model(config.model)
    arch = ModelArchConfig.from_hf_config(load_config(folder))
    if arch.vocab_size != context.model_arch.vocab_size:
        raise ValueError(f"draft model {config.model!r} has a vocabulary of {arch.vocab_size} tokens, the target "
                         f"{context.model_arch.vocab_size}: a draft must share the target's tokenizer")
    quantization = resolve_quantization(config.quantization, context.device, gguf_source(folder) is not None)
    model = load_model(folder, arch, context.attn_backend, context.device, context.dtype, quantization,
                       context.quantization_group_size)
    # Under w8a8 the draft stays unsmoothed (it only proposes; the target verifies): no float copy kept for it.
    smoothing.discard(model)
    return model, arch
