"""SpecDecoder: the runner's half of speculative decoding — verify a step's proposals, propose the next ones."""
from __future__ import annotations

import importlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, TypeVar

import numpy as np
import torch

from jido.attention.backend import AttentionBackend
from jido.config.speculative import SpeculativeConfig
from jido.core.kv_cache_spec import KVCacheConfig, KVCacheSpec
from jido.core.outputs import SchedulerOutput
from jido.models.config import ModelArchConfig
from jido.runner.input_batch import InputBatch, ModelInputs
from jido.sampling.auto_k import AutoK
from jido.sampling.metadata import SamplingMetadata, shift_metadata
from jido.sampling.ngram_proposer import NgramProposer
from jido.sampling.rejection_sampler import Drafts, RejectionSampler, VerifiedTokens
from jido.sampling.sampler import Sampler


@dataclass(frozen=True)
class ProposerContext:
    """What a proposer may use of the runner it proposes for."""

    model: torch.nn.Module  # the target
    model_arch: ModelArchConfig
    attn_backend: AttentionBackend
    device: torch.device
    dtype: torch.dtype
    kv_cache_dtype: torch.dtype
    block_size: int
    sampler: Sampler
    quantization_group_size: int | None = None
    quantization: str = "none"  # the target's scheme, as resolved (a draft follows it unless told otherwise)


TrainedDraft = TypeVar("TrainedDraft", bound=torch.nn.Module)
# A trained draft's `quantization` -> the bits of its codes (None: dense, in the model's dtype).
TRAINED_DRAFT_BITS: dict[str, int | None] = {"int8": 8, "int4": 4, "none": None}


def load_trained_draft(config: SpeculativeConfig, context: ProposerContext,
                       load: Callable[[str, torch.device, torch.dtype, int | None], TrainedDraft],
                       name: str, quantized: str = "int8") -> TrainedDraft:
    """The draft `jido train-draft` wrote to ``config.model`` (``load``: EAGLE's or Medusa's loader), in the codes of
    ``quantized`` under a quantized target unless ``config.quantization`` says otherwise (``int8``, ``int4`` or
    ``none``), as the draft model's; ``name`` is how errors call it.

    Codes because a proposal then reads a quarter (int8) or an eighth (int4) of float32's bytes, and a proposal's
    time, bound by those bytes, is what speculation must keep small beside the target's step.

    Raises:
        ValueError: a quantization other than int8, int4 or none, or a draft trained for another hidden size or
            vocabulary.
    """
    quantization = config.quantization or (quantized if context.quantization != "none" else "none")
    if quantization not in TRAINED_DRAFT_BITS:
        raise ValueError(f"{name} drafts run in float, int8 or int4: quantization {quantization!r} is not supported")
    draft = load(config.model, context.device, context.dtype, TRAINED_DRAFT_BITS[quantization])
    c, arch = draft.config, context.model_arch
    if (c.hidden_size, c.target_vocab_size) != (arch.hidden_size, arch.vocab_size):
        raise ValueError(f"the {name} draft in {config.model} was trained for hidden size {c.hidden_size} and "
                         f"{c.target_vocab_size} tokens; this target has {arch.hidden_size} and {arch.vocab_size}")
    return draft


@dataclass
class ProposalStep:
    """What a proposer may read after a step: its batch (verified tokens appended) and its forward pass."""

    sched: SchedulerOutput
    inputs: ModelInputs
    batch: InputBatch
    hidden: torch.Tensor  # [num_tokens, hidden] the target's last hidden states of the step's tokens
    verified: VerifiedTokens  # per sampled request (``inputs.sampled_req_ids``), its new tokens
    num_speculative_tokens: int  # K: propose at most this many per request

    def rejected(self) -> dict[str, int]:
        """Per sampled request, how many of its inputs this step the verification threw away (rejected proposals)."""
        inputs = self.inputs
        return {r: len(d) + 1 - len(ids)
                for r, d, ids in zip(inputs.sampled_req_ids, inputs.draft_token_ids, self.verified.token_ids)}


class Proposer(Protocol):
    """Proposes the tokens that should follow each sampled request's new tokens.

    Contract: ``propose`` is called once per step that computed anything, after the step's verified tokens
    were appended to the batch, and returns :class:`Drafts` for ``step.inputs.sampled_req_ids`` in that
    order, at most ``num_speculative_tokens`` each (none is fine). A proposer with a distribution q returns
    it per proposal: the rejection sampler needs it next step. ``remove`` forgets a request that
    finished or was preempted (a resumed one comes back as new). A proposer with KV of its own reports its
    layers with ``kv_cache_spec`` (ids from ``first_layer_id`` on, before the pool is laid out) and gets
    their tensors with ``bind_kv_cache``, so the pool holds and frees them with the target's.
    """

    def propose(self, step: ProposalStep) -> Drafts: ...

    def remove(self, req_id: str) -> None: ...

    def kv_cache_spec(self, first_layer_id: int) -> dict[int, KVCacheSpec]: ...

    def bind_kv_cache(self, kv_cache_config: KVCacheConfig, tensors: list[torch.Tensor],
                      target_caches: list[torch.Tensor], target_groups: list[int]) -> None: ...


class NgramDrafter:
    """The ``ngram`` method on the runner's token rows."""

    def __init__(self, config: SpeculativeConfig, context: ProposerContext) -> None:
        self.ngrams = NgramProposer(config.prompt_lookup_min, config.prompt_lookup_max)

    def propose(self, step: ProposalStep) -> Drafts:
        batch, k = step.batch, step.num_speculative_tokens
        return Drafts.deterministic([
            self.ngrams.propose(req_id, batch.token_ids[row, :batch.num_tokens[row]], k)
            for req_id, row in zip(step.inputs.sampled_req_ids, step.inputs.sampled_rows.tolist())])

    def remove(self, req_id: str) -> None:
        self.ngrams.remove(req_id)

    def kv_cache_spec(self, first_layer_id: int) -> dict[int, KVCacheSpec]:
        return {}  # no model, no KV

    def bind_kv_cache(self, kv_cache_config: KVCacheConfig, tensors: list[torch.Tensor],
                      target_caches: list[torch.Tensor], target_groups: list[int]) -> None:
        """Nothing to bind."""


# method -> (module, class) of its proposer, imported only when asked for.
_PROPOSERS: dict[str, tuple[str, str]] = {
    "ngram": ("jido.runner.spec_decode", "NgramDrafter"),
    "draft_model": ("jido.runner.draft_model", "DraftModelProposer"),
    "medusa": ("jido.runner.medusa", "MedusaProposer"),
    "eagle": ("jido.runner.eagle", "EagleProposer"),
}


def make_proposer(config: SpeculativeConfig, context: ProposerContext) -> Proposer:
    """The proposer of ``config.method``, given what it may use of the runner."""
    if config.method not in _PROPOSERS:
        raise ValueError(f"speculative method {config.method!r} has no proposer in this jido; "
                         f"available: {', '.join(_PROPOSERS)}")
    module_name, class_name = _PROPOSERS[config.method]
    return getattr(importlib.import_module(module_name), class_name)(config, context)


class SpecDecoder:
    """Verifies the proposals a step computed and asks the proposer for the next step's.

    Keeps, between steps, the draft distributions q of the proposals it handed out (the scheduler sends
    back a prefix of them to verify, possibly cut short by the budget or ``max_tokens``). With
    ``num_speculative_tokens: "auto"`` an :class:`AutoK` picks each step's K from what the steps measure.
    """

    def __init__(self, config: SpeculativeConfig, sampler: Sampler, proposer: Proposer) -> None:
        self.config = config
        self.rejection = RejectionSampler(sampler)
        self.proposer = proposer
        self.auto_k = AutoK(config.max_num_speculative_tokens) if config.is_auto else None
        self._draft_probs: dict[str, torch.Tensor] = {}
        self._asked: dict[str, int] = {}  # proposals asked for each request, for AutoK's acceptance counts

    def kv_cache_spec(self, first_layer_id: int) -> dict[int, KVCacheSpec]:
        return self.proposer.kv_cache_spec(first_layer_id)

    def bind_kv_cache(self, kv_cache_config: KVCacheConfig, tensors: list[torch.Tensor],
                      target_caches: list[torch.Tensor], target_groups: list[int]) -> None:
        self.proposer.bind_kv_cache(kv_cache_config, tensors, target_caches, target_groups)

    def update(self, sched: SchedulerOutput) -> None:
        for req_id in sched.finished_req_ids:
            self.proposer.remove(req_id)
            self._draft_probs.pop(req_id, None)
            self._asked.pop(req_id, None)

    @staticmethod
    def metadata(inputs: ModelInputs, batch: InputBatch) -> SamplingMetadata:
        """The sampling settings of the rows at ``inputs.logits_indices``: row j of request i samples the position
        after its first j proposals."""
        drafts = inputs.draft_token_ids
        md = batch.sampling.metadata(inputs.sampled_rows.tolist())
        if not any(drafts):
            return md
        sources = np.repeat(np.arange(len(drafts)), [len(d) + 1 for d in drafts]).tolist()
        return shift_metadata(md, sources, [d[:j] for d in drafts for j in range(len(d) + 1)])

    def verify(self, logits: torch.Tensor, inputs: ModelInputs, md: SamplingMetadata) -> VerifiedTokens:
        """The sampled requests' new tokens from ``logits`` at ``inputs.logits_indices`` (used up), whose rows'
        settings are ``md`` (:meth:`metadata`)."""
        return self.rejection.verify(logits, md, self._drafts(inputs))

    def verify_argmax(self, token_ids: torch.Tensor, inputs: ModelInputs) -> VerifiedTokens:
        """:meth:`verify` for rows that need only the target's argmax (``md.argmax_only``), given as ``token_ids``."""
        return self.rejection.verify_argmax(token_ids, self._drafts(inputs))

    def _drafts(self, inputs: ModelInputs) -> Drafts:
        """The proposals the step verifies, with the distributions they were drawn from (kept since they were)."""
        probs = []
        for req_id, ids in zip(inputs.sampled_req_ids, inputs.draft_token_ids):
            q = self._draft_probs.pop(req_id, None)
            probs.append(None if q is None or not ids else q[:len(ids)])
        return Drafts(inputs.draft_token_ids, probs)

    def propose(self, sched: SchedulerOutput, inputs: ModelInputs, batch: InputBatch, hidden: torch.Tensor,
                verified: VerifiedTokens, model_s: float) -> dict[str, list[int]]:
        """The next step's proposals per sampled request (none for the others); ``model_s`` is the step's pass."""
        k = self._next_k(sched, inputs, verified, model_s)
        start = time.perf_counter()
        drafts = self.proposer.propose(ProposalStep(sched, inputs, batch, hidden, verified, k))
        if self.auto_k is not None:
            self.auto_k.observe_proposal(len(inputs.sampled_req_ids), k, time.perf_counter() - start)
        proposals = {}
        for req_id, ids, q in zip(inputs.sampled_req_ids, drafts.token_ids, drafts.probs):
            self._asked[req_id] = k
            if ids:
                proposals[req_id] = ids
                if q is not None:
                    self._draft_probs[req_id] = q
        return proposals

    def _next_k(self, sched: SchedulerOutput, inputs: ModelInputs, verified: VerifiedTokens, model_s: float) -> int:
        if self.auto_k is None:
            return self.config.max_num_speculative_tokens
        outcomes = [(self._asked.pop(r, 0), len(ids) - 1) for r, ids in zip(inputs.sampled_req_ids, verified.token_ids)]
        # Only a pass whose every row is sampled (decode and verify rows) measures what K changes: a prefill
        # chunk's tokens skip the LM head and attend causally, and cost far less than a verify row each, so they
        # would price verifying far too low.
        all_sampled = len(inputs.logits_indices) == sched.total_num_scheduled_tokens
        self.auto_k.observe_step(sched.total_num_scheduled_tokens if all_sampled else None, model_s, outcomes)
        return self.auto_k.choose(len(inputs.sampled_req_ids)).k if inputs.sampled_req_ids else 0
