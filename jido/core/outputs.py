"""The plain dataclasses that cross the scheduler ↔ model runner ↔ engine boundaries each step."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from jido.core.kv_blend import BlendPlan
from jido.core.kv_connector import KVConnectorOutput
from jido.core.sampling_params import SamplingParams
from jido.metrics.stats import IterationStats, SchedulerStats


@dataclass
class NewRequestData:
    """A request the runner has no state for: sent in full (first step, or resumed after preemption)."""

    req_id: str
    token_ids: list[int]  # prompt + outputs so far
    num_prompt_tokens: int
    sampling_params: SamplingParams
    eos_token_ids: tuple[int, ...]
    block_ids: list[list[int]]  # one block table per KV cache group
    num_computed_tokens: int


@dataclass
class CachedRequestData:
    """A request the runner already holds: only what changed since its last step."""

    req_id: str
    new_block_ids: list[list[int]]  # per KV cache group, appended to the group's table
    num_computed_tokens: int  # the scheduler's count; the runner takes it as it is and keeps none of its own


@dataclass
class SchedulerOutput:
    """What to compute this step: which requests, how many tokens each, and whose state to drop."""

    scheduled_new_reqs: list[NewRequestData]
    scheduled_cached_reqs: list[CachedRequestData]
    num_scheduled_tokens: dict[str, int]  # in batch order
    total_num_scheduled_tokens: int
    finished_req_ids: set[str] = field(default_factory=set)  # finished, aborted or preempted since last step
    # Proposed tokens to verify this step, after each request's last known token (speculative decoding).
    scheduled_spec_decode_tokens: dict[str, list[int]] = field(default_factory=dict)
    # The KV connector's instructions to the workers for this step (jido.core.kv_connector); None without one.
    kv_connector_metadata: Any = None
    # Requests whose whole prompt (past the prefix hit) this step blends from cached chunks (CacheBlend).
    kv_blend_plans: dict[str, BlendPlan] = field(default_factory=dict)
    # Structured outputs: the allowed next tokens of each request this step samples under a grammar, as
    # [1 + K, ceil(vocab / 32)] int32 bitmasks (bit t % 32 of word t // 32 allows token t), one row per position
    # it samples: its next token, and after each of the K proposals it verifies; absent: unconstrained.
    grammar_bitmask: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def is_empty(self) -> bool:
        return self.total_num_scheduled_tokens == 0


@dataclass
class Logprobs:
    """Log-probabilities at one sampled position: the sampled token's, and the top-N."""

    sampled_token_id: int
    sampled_logprob: float
    top_token_ids: list[int]
    top_logprobs: list[float]


@dataclass
class PromptLogprobsLists:
    """Each prompt token's log-probability given the tokens before it, for prompt tokens 1 to P-1.

    The first prompt token has none (nothing precedes it). Kept as plain lists, one entry per position,
    so that a long prompt crosses a process boundary as a handful of lists rather than one object each.
    """

    logprobs: list[float]  # [P - 1] of the prompt token at positions 1..P-1
    ranks: list[int]  # [P - 1] how many tokens were at least as likely, itself included (1: the most likely)
    top_token_ids: list[list[int]]  # [P - 1][N] the N most likely tokens there, most likely first
    top_logprobs: list[list[float]]  # [P - 1][N]


@dataclass
class ModelRunnerOutput:
    """Tokens sampled this step, for the requests whose known tokens are now all computed.

    A request may get several tokens in one step (accepted speculative tokens, multi-step decoding); the
    scheduler checks stops on each in order and drops what follows a stop. With speculative decoding the
    runner also proposes each sampled request's next tokens (vLLM v1's flow): the scheduler keeps them on
    the request and schedules them for verification in the next step.
    """

    sampled_token_ids: dict[str, list[int]]
    logprobs: dict[str, list[Logprobs]] = field(default_factory=dict)  # one per sampled token
    # For requests that asked, in the step that computed the end of their prompt.
    prompt_logprobs: dict[str, PromptLogprobsLists] = field(default_factory=dict)
    kv_connector_output: KVConnectorOutput | None = None  # the workers' transfers, with a KV connector
    # Speculative decoding: the tokens proposed to follow each request's new tokens, verified next step.
    spec_token_ids: dict[str, list[int]] = field(default_factory=dict)
    prepare_time_s: float = 0.0
    model_time_s: float = 0.0
    sample_time_s: float = 0.0
    propose_time_s: float = 0.0  # speculative decoding: the next step's proposals
    # A mixture-of-experts model: (token, expert) pairs routed to each expert-parallel rank since the last output.
    expert_load: list[int] = field(default_factory=list)


@dataclass
class EngineCoreOutput:
    """One request's news from one step: its new tokens, and whether and why it finished."""

    req_id: str
    new_token_ids: list[int]
    logprobs: list[Logprobs] = field(default_factory=list)
    finish_reason: str | None = None  # "stop" | "length" | "abort"
    stop_reason: int | str | None = None
    num_cached_tokens: int = 0
    prompt_logprobs: PromptLogprobsLists | None = None  # once, with the request's first output
    # With the first output: when the request was first scheduled, and how long it waited for external KV.
    first_scheduled_time: float | None = None
    kv_load_s: float = 0.0
    kv_transfer_params: Any = None  # with the last output: the connector's handle to the request's KV


@dataclass
class EngineCoreOutputs:
    """Everything one engine step reports: per-request news and the records metrics are made of."""

    outputs: list[EngineCoreOutput]
    scheduler_stats: SchedulerStats
    iteration_stats: IterationStats | None = None  # None when no step ran
