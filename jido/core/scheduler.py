"""Scheduler: batching (continuous, dynamic or static) with chunked prefill, prefix-cache hits and preemption."""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

from jido.core.batching_mode import make_batching_mode
from jido.core.block_pool import KVCacheBlock
from jido.core.blend_sources import ChunkBlends
from jido.core.kv_blend import BlendPlan
from jido.core.kv_cache_manager import KVCacheManager
from jido.core.kv_connector import KVConnectorScheduler
from jido.core.kv_loading import ExternalKVLoads
from jido.core.outputs import (CachedRequestData, EngineCoreOutput, Logprobs, ModelRunnerOutput, NewRequestData,
                               SchedulerOutput)
from jido.core.pinned_prefixes import PinnedPrefixes
from jido.core.request import Request, RequestStatus
from jido.core.scheduling_policy import order_waiting, preemption_victim
from jido.core.structured_output import fill_bitmasks
from jido.metrics.stats import SchedulerStats, SpecDecodingStats


@dataclass(frozen=True)
class SchedulerLimits:
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    num_lookahead_tokens: int = 0  # slots kept free after each running request for next step's proposals
    policy: str = "fcfs"  # fcfs | lpm | priority (jido.core.scheduling_policy)
    enable_chunked_prefill: bool = True  # off: a prompt is admitted only when it fits the budget whole
    scheduling_mode: str = "continuous"  # continuous | dynamic | static (jido.core.batching_mode)
    max_batch_wait_s: float = 0.1  # dynamic: how long a batch waits to fill
    # Prompt tokens per step while any request decodes in it (the stall a long prompt adds to their next token).
    max_num_prefill_tokens_while_decoding: int | None = None


class Scheduler:
    """Decides, every step, which requests compute how many tokens.

    Each step first serves running requests (decodes before prefill chunks), preempting the newest
    running request when blocks run out, then admits waiting requests in arrival order while the token
    budget, ``max_num_seqs``, free blocks and the batching mode allow. Prompts longer than the budget are
    prefilled in chunks. With a KV connector, a waiting request whose prefix the connector holds beyond the
    device's cache first waits for it to be loaded (``ExternalKVLoads``), outside the step; and a finished
    request whose KV the connector hands to another instance keeps its blocks (``held``) until the workers
    let them go.
    """

    def __init__(self, limits: SchedulerLimits, kv_cache_manager: KVCacheManager,
                 connector: KVConnectorScheduler | None = None) -> None:
        self.limits = limits
        self.kv = kv_cache_manager
        self.connector = connector
        self.loads = ExternalKVLoads(connector, kv_cache_manager) if connector is not None else None
        self.pins = PinnedPrefixes(kv_cache_manager)
        self.blends = ChunkBlends(kv_cache_manager)
        if connector is not None:
            kv_cache_manager.set_release_listener(lambda block: connector.on_blocks_released([block]))
        self.batching = make_batching_mode(limits.scheduling_mode, limits.max_num_seqs, limits.max_batch_wait_s)
        self.requests: dict[str, Request] = {}
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.num_preemptions = 0
        self._preempted_this_step = False  # no admissions in a step that had to preempt
        self._runner_has: set[str] = set()  # requests whose state the runner holds
        self._dropped: set[str] = set()  # to tell the runner next step
        self._queue_times: list[float] = []  # arrival -> first scheduled, for requests first scheduled now
        self.held: dict[str, Request] = {}  # finished requests whose blocks the connector still needs
        self.spec_decoding_stats = SpecDecodingStats()

    # -- requests in and out -------------------------------------------------------------------
    def add_request(self, request: Request) -> None:
        if request.request_id in self.requests:
            raise ValueError(f"request id {request.request_id!r} is already in use")
        self.requests[request.request_id] = request
        self.waiting.append(request)

    def finish_requests(self, req_ids: list[str], status: RequestStatus) -> None:
        """End requests from outside the step (abort, or a stop string the detokenizer found)."""
        for req_id in req_ids:
            request = self.requests.get(req_id)
            if request is not None and not request.is_finished:
                self._finish(request, status)

    def has_unfinished_requests(self) -> bool:
        """Requests, or KV work the engine keeps stepping for: loads, held blocks, saves not yet handed over."""
        return bool(self.waiting or self.running or self.loads or self.held) or self.has_pending_kv_work()

    def has_pending_kv_work(self) -> bool:
        """Whether the connector has instructions (saves of blocks the last step released) only a next step carries."""
        return self.connector is not None and self.connector.has_pending_work()

    @property
    def kv_cache_usage(self) -> float:
        """Fraction of KV blocks held by requests now."""
        return self.kv.usage

    def stats(self) -> SchedulerStats:
        return SchedulerStats(len(self.running), len(self.waiting) + len(self.loads or ()), self.kv_cache_usage,
                              self.kv.prefix_cache_queries, self.kv.prefix_cache_hits, self.num_preemptions,
                              self.connector.stats() if self.connector is not None else (), self.pins.stats(),
                              self.spec_decoding_stats,
                              admission_wait_s=self.batching.wait_s(len(self.running), self.waiting,
                                                                    time.monotonic()))

    def take_queue_times(self) -> tuple[float, ...]:
        """Queue times of the requests first scheduled since the last call."""
        times, self._queue_times = tuple(self._queue_times), []
        return times

    # -- one step ------------------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        num_scheduled: dict[str, int] = {}
        new_block_ids: dict[str, list[list[int]]] = {}
        blend_plans: dict[str, BlendPlan] = {}
        budget = self._schedule_running(num_scheduled, new_block_ids)
        if not self._preempted_this_step:
            self._schedule_waiting(num_scheduled, new_block_ids, budget, blend_plans)
        return self._make_output(num_scheduled, new_block_ids, blend_plans)

    def _schedule_running(self, num_scheduled: dict[str, int], new_block_ids: dict[str, list[list[int]]]) -> int:
        """Schedule the running requests; returns the prompt tokens waiting requests may still take this step."""
        budget = self.limits.max_num_batched_tokens
        self._preempted_this_step = False
        decodes: set[str] = set()
        # Decodes first, then prefill chunks; sorted() is stable, so each group keeps admission order.
        for request in sorted(self.running, key=_is_prefilling):
            if request.status != RequestStatus.RUNNING:
                continue  # preempted earlier in this loop
            room = self._prefill_room(num_scheduled, decodes) if _is_prefilling(request) else budget
            if room == 0:
                break
            # Never past max_model_len: a proposal beyond the last position has nowhere to go.
            num_new = min(request.num_tokens_with_spec, self.limits.max_model_len) - request.num_computed_tokens
            num_new = min(num_new, room)
            blocks = self._allocate_or_preempt(request, num_new, num_scheduled, new_block_ids)
            if blocks is None:
                continue
            num_scheduled[request.request_id] = num_new
            new_block_ids[request.request_id] = _ids(blocks)
            budget -= num_new
            if not _is_prefilling(request):
                decodes.add(request.request_id)
        return self._prefill_room(num_scheduled, decodes)

    def _prefill_room(self, num_scheduled: dict[str, int], decodes: set[str]) -> int:
        """Prompt tokens this step may still take: what is left of the budget, and while requests decode in the
        step (of ``decodes``, those still scheduled: a preemption may have dropped some) at most
        ``max_num_prefill_tokens_while_decoding`` prompt tokens in all, so a long prompt stalls them little. Without
        chunked prefill a prompt is computed whole, so the cap would hold it back for as long as anything decodes."""
        room = self.limits.max_num_batched_tokens - sum(num_scheduled.values())
        cap = self.limits.max_num_prefill_tokens_while_decoding
        if cap is None or not self.limits.enable_chunked_prefill or not decodes.intersection(num_scheduled):
            return room
        num_prefill = sum(n for request_id, n in num_scheduled.items() if request_id not in decodes)
        return max(0, min(room, cap - num_prefill))

    def _allocate_or_preempt(self, request: Request, num_new: int, num_scheduled: dict[str, int],
                             new_block_ids: dict[str, list[list[int]]]) -> list[list[KVCacheBlock]] | None:
        """Allocate for ``request``, preempting the newest running requests until it fits or is itself preempted."""
        while True:
            blocks = self.kv.allocate_slots(request, num_new, num_lookahead_tokens=self.limits.num_lookahead_tokens)
            if blocks is not None:
                return blocks
            victim = preemption_victim(self.running, self.limits.policy)
            num_scheduled.pop(victim.request_id, None)
            new_block_ids.pop(victim.request_id, None)
            self._preempt(victim)
            if victim is request:
                return None

    def _schedule_waiting(self, num_scheduled: dict[str, int], new_block_ids: dict[str, list[list[int]]],
                          budget: int, blend_plans: dict[str, BlendPlan]) -> None:
        self.waiting = order_waiting(self.waiting, self.limits.policy, self._cached_len)
        num_admissible = self.batching.num_admissible(len(self.running), self.waiting, time.monotonic())
        while self.waiting and budget > 0 and len(self.running) < self.limits.max_num_seqs and num_admissible > 0:
            request = self.waiting[0]
            if self.kv.has_blocks(request.request_id):  # back from an external load: its blocks are attached
                hits, num_hit_tokens = None, request.num_computed_tokens
            else:
                hits, num_hit_tokens = self.kv.get_computed_blocks(request)
                if self.loads is not None:
                    started = self.loads.try_start(request, hits, num_hit_tokens)
                    if started is None:
                        break
                    if started:
                        self.waiting.popleft()
                        continue
            if not self.limits.enable_chunked_prefill and request.num_tokens - num_hit_tokens > budget:
                break
            plan = self._plan_blend(request, num_hit_tokens)
            # A blended prefill is one step whole: the cap on prompt tokens beside decodes would hold it back forever.
            room = self.limits.max_num_batched_tokens - sum(num_scheduled.values()) if plan is not None else budget
            num_new = min(request.num_tokens - num_hit_tokens, room)
            if plan is not None and num_new < request.num_tokens - num_hit_tokens:
                self.blends.release(request.request_id)
                break  # a blended prefill is one step: wait for a step with room for all of it
            blocks = self.kv.allocate_slots(request, num_new, hits, self.limits.num_lookahead_tokens)
            if blocks is None:
                self.blends.release(request.request_id)
                break
            if plan is not None:
                blend_plans[request.request_id] = plan
            self.waiting.popleft()
            self._start_running(request, num_hit_tokens)
            num_admissible -= 1
            num_scheduled[request.request_id] = num_new
            new_block_ids[request.request_id] = _ids(blocks)
            budget -= num_new

    def _plan_blend(self, request: Request, num_hit_tokens: int) -> BlendPlan | None:
        """Hold a blend request's chunk sources for this step; None for other requests and when nothing is left to blend."""
        if request.kv_blend is None:
            return None
        if request.num_tokens - num_hit_tokens > self.limits.max_num_batched_tokens:
            # Grown past one step's budget since it was accepted (outputs, then a preemption): computed in full.
            request.kv_blend = None
            return None
        return self.blends.plan(request, num_hit_tokens)

    def _start_running(self, request: Request, num_hit_tokens: int) -> None:
        self.running.append(request)
        self.batching.admitted()
        request.status = RequestStatus.RUNNING
        request.num_computed_tokens = num_hit_tokens
        if request.num_cached_tokens < 0:
            request.num_cached_tokens = num_hit_tokens
            self.pins.count_hit(request, num_hit_tokens)
            request.first_scheduled_time = time.monotonic()
            # Waiting for external KV is the transfer's time, not the queue's.
            self._queue_times.append(request.first_scheduled_time - request.arrival_time - request.kv_load_s)

    def _cached_len(self, request: Request) -> int:
        return request.num_computed_tokens if self.kv.has_blocks(request.request_id) \
            else self.kv.get_computed_blocks(request)[1]

    def _make_output(self, num_scheduled: dict[str, int], new_block_ids: dict[str, list[list[int]]],
                     blend_plans: dict[str, BlendPlan]) -> SchedulerOutput:
        new_reqs, cached_reqs, spec_tokens, grammars = [], [], {}, {}
        for req_id, num_new in num_scheduled.items():
            request = self.requests[req_id]
            num_spec = request.num_computed_tokens + num_new - request.num_tokens
            if num_spec > 0:
                spec_tokens[req_id] = request.spec_token_ids[:num_spec]
            if request.grammar is not None and num_spec >= 0:  # samples this step (not a chunk short of the end)
                grammars[req_id] = request.grammar
            if req_id in self._runner_has:
                cached_reqs.append(CachedRequestData(req_id, new_block_ids[req_id], request.num_computed_tokens))
                continue
            self._runner_has.add(req_id)
            new_reqs.append(NewRequestData(
                req_id, list(request.all_token_ids), request.num_prompt_tokens, request.sampling_params,
                request.eos_token_ids, self.kv.get_block_ids(req_id), request.num_computed_tokens))
        dropped, self._dropped = self._dropped, set()
        output = SchedulerOutput(new_reqs, cached_reqs, num_scheduled, sum(num_scheduled.values()), dropped,
                                 spec_tokens, kv_blend_plans=blend_plans,
                                 grammar_bitmask=fill_bitmasks(grammars, spec_tokens))
        if self.connector is not None:
            output.kv_connector_metadata = self.connector.build_connector_meta(output, self.kv.get_block_ids)
        return output

    def update_from_output(self, scheduler_output: SchedulerOutput,
                           runner_output: ModelRunnerOutput) -> list[EngineCoreOutput]:
        """Advance each scheduled request by its computed tokens, append sampled tokens, check stops.

        Proposed tokens the runner rejected are taken back from ``num_computed_tokens``: a request that
        verified ``k`` proposals gets between 1 and ``k + 1`` tokens, the first of which replaces the
        first rejected proposal.
        """
        outputs = []
        for req_id in scheduler_output.kv_blend_plans:
            self.blends.release(req_id)
        if self.loads is not None and runner_output.kv_connector_output is not None:
            # Requests whose loads ended go back to the front of the queue, in the order they arrived.
            self.waiting.extendleft(reversed(self.loads.finish(runner_output.kv_connector_output)))
            for req_id in runner_output.kv_connector_output.finished_saving:
                if req_id in self.held:
                    self.kv.free(self.held.pop(req_id))
        for req_id, num_tokens in scheduler_output.num_scheduled_tokens.items():
            request = self.requests.get(req_id)
            if request is None or request.status != RequestStatus.RUNNING:
                continue  # finished or preempted while the step ran
            token_ids = runner_output.sampled_token_ids.get(req_id, [])
            num_spec = len(scheduler_output.scheduled_spec_decode_tokens.get(req_id, ()))
            # Rejected proposals were computed but are not tokens: take them back. (Extra tokens beyond
            # proposals, as in multi-step decoding, are not computed yet: the next step computes them.)
            num_rejected = max(num_spec + 1 - len(token_ids), 0) if num_spec and token_ids else 0
            request.num_computed_tokens += num_tokens - num_rejected
            request.spec_token_ids = []
            if num_spec and token_ids:
                self.spec_decoding_stats = self.spec_decoding_stats.observed(num_spec, num_spec - num_rejected)
            self.kv.cache_full_blocks(request)  # before a stop below frees the blocks
            if token_ids:  # else a prefill chunk that has not reached the end of the prompt yet
                output = self._append_tokens(request, token_ids, runner_output.logprobs.get(req_id, []))
                output.prompt_logprobs = runner_output.prompt_logprobs.get(req_id)
                outputs.append(output)
                if num_spec and not request.is_finished:
                    # Accepted proposals are computed tokens the request only has after the append.
                    self.kv.cache_full_blocks(request)
                if not request.is_finished:
                    request.spec_token_ids = self._useful_proposals(request, runner_output.spec_token_ids.get(req_id))
        return outputs

    def _useful_proposals(self, request: Request, proposals: list[int] | None) -> list[int]:
        """The runner's proposals that could still become tokens: a step that verifies k gives up to k + 1, and
        under a grammar only as many as it accepts (a proposal it refuses could never be verified)."""
        if not proposals:
            return []
        if request.grammar is not None:
            proposals = proposals[:request.grammar.validate_tokens(list(proposals))]
        room = self.limits.max_model_len - request.num_tokens
        max_tokens = request.sampling_params.max_tokens
        if max_tokens is not None:
            room = min(room, max_tokens - request.num_output_tokens)
        return list(proposals[:max(room - 1, 0)])

    def _append_tokens(self, request: Request, token_ids: list[int], logprobs: list[Logprobs]) -> EngineCoreOutput:
        """Append tokens one by one; a stop ends the request there and drops the tokens after it."""
        if request.sampling_params.max_tokens == 0:
            # Only the prompt (its logprobs) was asked for: the token sampled after it is no output.
            self._finish(request, RequestStatus.FINISHED_LENGTH)
            return EngineCoreOutput(request.request_id, [], finish_reason=RequestStatus.FINISHED_LENGTH.value,
                                    num_cached_tokens=request.num_cached_tokens)
        finish, params = None, None
        first = not request.output_token_ids
        for num_new, token_id in enumerate(token_ids, start=1):
            request.append_output_token(token_id)
            if request.grammar is not None:
                request.grammar.accept_token(token_id)
            finish = self._check_stop(request)
            if finish is not None:
                params = self._finish(request, finish)
                break
        output = EngineCoreOutput(request.request_id, token_ids[:num_new], logprobs[:num_new],
                                  finish.value if finish else None, request.stop_reason, request.num_cached_tokens,
                                  kv_transfer_params=params)
        if first:
            output.first_scheduled_time, output.kv_load_s = request.first_scheduled_time, request.kv_load_s
        return output

    # -- helpers -------------------------------------------------------------------------------
    def _check_stop(self, request: Request) -> RequestStatus | None:
        params = request.sampling_params
        token_id = request.output_token_ids[-1]
        if request.num_output_tokens >= params.min_tokens:
            if not params.ignore_eos and token_id in request.eos_token_ids:
                return RequestStatus.FINISHED_STOPPED
            if token_id in params.stop_token_ids:
                request.stop_reason = token_id
                return RequestStatus.FINISHED_STOPPED
        if params.max_tokens is not None and request.num_output_tokens >= params.max_tokens:
            return RequestStatus.FINISHED_LENGTH
        if request.num_tokens >= self.limits.max_model_len:
            return RequestStatus.FINISHED_LENGTH
        if request.grammar is not None and request.grammar.is_terminated():
            return RequestStatus.FINISHED_STOPPED  # its constraint is complete: nothing may follow
        return None

    def _preempt(self, request: Request) -> None:
        self.running.remove(request)
        self.kv.free(request)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        request.spec_token_ids = []
        self.num_preemptions += 1
        self.batching.preempted()
        self._preempted_this_step = True
        self._forget_in_runner(request.request_id)
        self.waiting.appendleft(request)

    def _finish(self, request: Request, status: RequestStatus) -> object:
        """End a request and free (or, for its connector, hold) its blocks; returns the connector's params."""
        if request in self.running:
            self.running.remove(request)
        elif request in self.waiting:
            self.waiting.remove(request)
        request.status = status
        hold, params = False, None
        if self.connector is not None:
            hold, params = self.connector.request_finished(request, self.kv.get_block_ids(request.request_id))
        if hold:
            self.held[request.request_id] = request
        elif self.loads is None or not self.loads.abandon(request):
            self.kv.free(request)
        self._forget_in_runner(request.request_id)
        del self.requests[request.request_id]
        return params

    def _forget_in_runner(self, req_id: str) -> None:
        if req_id in self._runner_has:
            self._runner_has.discard(req_id)
            self._dropped.add(req_id)


def _ids(blocks: list[list[KVCacheBlock]]) -> list[list[int]]:
    return [[b.block_id for b in group] for group in blocks]


def _is_prefilling(request: Request) -> bool:
    """More than one token to compute: a prompt chunk (or a preempted request's recompute), not a decode."""
    return request.num_tokens - request.num_computed_tokens > 1
