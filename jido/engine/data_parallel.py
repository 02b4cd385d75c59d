"""DataParallelEngine: several engine replicas behind one server, each request routed to one of them."""
from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Sequence

from jido.core.routing import ReplicaRouter, make_router
from jido.core.sampling_params import SamplingParams
from jido.engine.async_engine import AsyncEngine, EngineOverloadedError, EngineStoppedError, RequestStream, StepReport
from jido.engine.llm_engine import LLMEngine, ProcessedPrompt, PromptType
from jido.metrics.stats import merge_scheduler_stats


class DataParallelEngine:
    """N :class:`AsyncEngine` replicas (each its own workers and KV cache) with the AsyncEngine surface the
    server uses; ``data_parallel_routing`` picks each request's replica (prefix affinity plus load, or round
    robin) from its token ids and the replicas' unfinished sequences.

    Metrics see one engine: each replica's report is merged with the others' latest (queues and counters
    summed, KV usage averaged: the replicas' pools are equal). Health fails if any replica fails.
    """

    def __init__(self, llms: Sequence[LLMEngine], max_waiting_requests: int,
                 on_report: Callable[[StepReport], None] | None = None,
                 on_failure: Callable[[BaseException], None] | None = None,
                 router: ReplicaRouter | None = None) -> None:
        self.engine = llms[0]  # the tokenizer and prompt checks every replica shares
        self.max_num_seqs = sum(llm.config.scheduler_config.max_num_seqs for llm in llms)
        self._on_report = on_report
        self.replicas = [AsyncEngine(llm, max_waiting_requests, on_report=self._merge, on_failure=on_failure)
                         for llm in llms]
        kv = llms[0].core.kv_plan.kv_cache_config
        self.router = router or make_router(llms[0].config.parallel_config.data_parallel_routing, len(llms),
                                            kv.block_size, kv.num_blocks)
        self.last_report = self._merged()

    @property
    def accepting(self) -> bool:
        return all(replica.accepting for replica in self.replicas)

    @property
    def num_waiting(self) -> int:
        return sum(replica.num_waiting for replica in self.replicas)

    @property
    def max_num_unfinished(self) -> int:
        return sum(replica.max_num_unfinished for replica in self.replicas)

    def check_room(self, num_seqs: int) -> None:
        """EngineOverloadedError unless the replicas together have room for ``num_seqs`` more sequences now (each
        request still needs room on the replica it is routed to)."""
        room = sum(r.max_waiting_requests + r.num_free_slots - r.num_waiting for r in self.replicas)
        if num_seqs > room:
            raise EngineOverloadedError(f"this request needs {num_seqs} sequences and the {len(self.replicas)} "
                                        f"replicas have room for {max(0, room)} now; retry later")

    def loads(self) -> list[int]:
        """Each replica's sequences not finished: waiting (queued or not yet picked up) and running."""
        return [r.num_waiting + r.last_report.stats.num_running for r in self.replicas]

    def start(self) -> None:
        for replica in self.replicas:
            replica.start()

    def add_request(self, request_id: str, prompt: PromptType, params: SamplingParams,
                    arrival_time: float | None = None, priority: int = 0, pin: bool = False,
                    kv_transfer_params: dict | None = None) -> RequestStream:
        """Route the request to a replica and queue it there (see :meth:`AsyncEngine.add_request`).

        Raises:
            ValueError: ``pin``: a pinned prefix would live in one replica while the router may send its
                users to another, so cache-augmented generation needs one replica.
        """
        if pin:
            raise ValueError("pinning a prefix (POST /v1/cache) is not supported with data_parallel_size > 1: "
                             "serve one replica, or let the prefix cache and the router's affinity keep it")
        if not isinstance(prompt, ProcessedPrompt):
            prompt = self.engine.prepare_prompt(prompt)
        replica = self.replicas[self.router.route(prompt.token_ids, self.loads())]
        # The text is dropped (tokenized once); a kv_blend spec goes with the ids.
        return replica.add_request(request_id, ProcessedPrompt(None, prompt.token_ids, prompt.kv_blend), params,
                                   arrival_time, priority, kv_transfer_params=kv_transfer_params)

    def check_health(self) -> None:
        for index, replica in enumerate(self.replicas):
            try:
                replica.check_health()
            except EngineStoppedError as exc:
                raise EngineStoppedError(f"replica {index}: {exc}") from None

    def end_streams(self, message: str) -> None:
        for replica in self.replicas:
            replica.end_streams(message)

    async def shutdown(self) -> None:
        await asyncio.gather(*(replica.shutdown() for replica in self.replicas))

    def _merge(self, report: StepReport) -> None:
        """A replica's report (on the event loop): pass up the merged state of all replicas, with its step times."""
        self.last_report = dataclasses.replace(self._merged(), times=report.times)
        if self._on_report is not None:
            self._on_report(self.last_report)

    def _merged(self) -> StepReport:
        reports = [replica.last_report for replica in self.replicas]
        return StepReport(None, merge_scheduler_stats([r.stats for r in reports]), sum(r.num_added for r in reports))
