"""Request: one sequence's tokens, progress counter and state as the scheduler sees it."""
from __future__ import annotations

import enum
import time
from typing import Any

from jido.core.kv_blend import BlendSpec
from jido.core.sampling_params import SamplingParams
from jido.core.structured_output import Grammar
from jido.utils.hashing import BlockHash


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    WAITING_FOR_REMOTE_KVS = "waiting_for_remote_kvs"  # holds blocks a connector is loading into
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED_STOPPED = "stop"
    FINISHED_LENGTH = "length"
    FINISHED_ABORTED = "abort"

    @property
    def is_finished(self) -> bool:
        return self in (RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH,
                        RequestStatus.FINISHED_ABORTED)


class Request:
    """A prompt and the tokens generated so far.

    NOTE: ``num_computed_tokens`` (tokens whose K/V are in the cache) catching up with ``num_tokens``
    drives everything: prefill, chunked prefill, prefix-cache hits and decode are all "compute the
    tokens between the two".
    """

    def __init__(self, request_id: str, prompt_token_ids: list[int], sampling_params: SamplingParams,
                 eos_token_ids: tuple[int, ...] = (), arrival_time: float | None = None, priority: int = 0,
                 kv_transfer_params: Any = None, kv_blend: BlendSpec | None = None) -> None:
        self.request_id = request_id
        self.prompt_token_ids = list(prompt_token_ids)
        self.sampling_params = sampling_params
        self.eos_token_ids = tuple(eos_token_ids)
        self.arrival_time = time.monotonic() if arrival_time is None else arrival_time
        self.output_token_ids: list[int] = []
        self.all_token_ids: list[int] = list(prompt_token_ids)
        self.num_computed_tokens = 0
        self.num_cached_tokens = -1  # prefix-cache hit at first scheduling; -1 until then
        self.num_preemptions = 0
        self.status = RequestStatus.WAITING
        self.stop_reason: int | str | None = None
        self.block_hashes: list[BlockHash] = []
        self.first_scheduled_time: float | None = None
        self.spec_token_ids: list[int] = []  # proposed next tokens, verified in the next step
        self.priority = priority  # vLLM's: lower is served first under the priority policy
        self.num_bypasses = 0  # under lpm, scheduling passes spent ranked behind later arrivals
        # What a KV connector is asked to do with this request (a producer's hold, a consumer's handle);
        # opaque to the core, read only by the connector.
        self.kv_transfer_params = kv_transfer_params
        self.kv_load_s = 0.0  # time spent waiting for an external load (WAITING_FOR_REMOTE_KVS)
        self.kv_blend = kv_blend  # a prompt of cached chunks to blend (CacheBlend); None: an ordinary prompt
        # The request's structured-output constraint (jido.core.structured_output.Grammar), advanced by the
        # scheduler with each appended token; None: unconstrained.
        self.grammar: Grammar | None = None

    @property
    def num_tokens_with_spec(self) -> int:
        return len(self.all_token_ids) + len(self.spec_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def is_finished(self) -> bool:
        return self.status.is_finished

    def append_output_token(self, token_id: int) -> None:
        self.output_token_ids.append(token_id)
        self.all_token_ids.append(token_id)

    def __repr__(self) -> str:
        return (f"Request({self.request_id!r}, status={self.status.value}, tokens={self.num_tokens}, "
                f"computed={self.num_computed_tokens})")
