"""ExternalKVLoads: the requests waiting for a KV connector to fill their blocks, and what happens when it has."""
from __future__ import annotations

import time

from jido.core.kv_cache_manager import BlockTable, KVCacheManager, owes_prompt_logprobs
from jido.core.kv_connector import KVConnectorOutput, KVConnectorScheduler
from jido.core.request import Request, RequestStatus


class ExternalKVLoads:
    """Starts asynchronous loads for waiting requests and takes them back once the workers report.

    A loading request holds its blocks (so nothing evicts or reuses them while bytes arrive) but is in
    neither the waiting queue nor the running set, so it never holds up a step. When its load is reported
    it returns to the front of the waiting queue: with its tokens counted computed if every block arrived,
    else at its device hit, to compute the rest itself (its blocks are overwritten then).
    NOTE: a request aborted while loading keeps its blocks until the report: a worker may still write them.
    """

    def __init__(self, connector: KVConnectorScheduler, kv: KVCacheManager) -> None:
        self.connector = connector
        self.kv = kv
        self.loading: dict[str, tuple[Request, int, float]] = {}  # request id -> (request, external tokens, start)
        self._free_when_loaded: set[str] = set()

    def __len__(self) -> int:
        return len(self.loading)

    def try_start(self, request: Request, hits: list[BlockTable], num_hit_tokens: int) -> bool | None:
        """Start a load for a waiting request if the connector has more than the device hit.

        Returns True when the load started (the request now holds its blocks and waits), False when there
        is nothing to load, None when the pool cannot hold the blocks to load into.
        """
        if owes_prompt_logprobs(request):
            return False
        num_external = self.connector.get_num_new_matched_tokens(request, num_hit_tokens)
        if num_external <= 0:
            return False
        if self.kv.allocate_slots(request, num_external, hits) is None:
            return None
        request.status = RequestStatus.WAITING_FOR_REMOTE_KVS
        request.num_computed_tokens = num_hit_tokens
        self.connector.update_state_after_alloc(request, self.kv.get_block_ids(request.request_id), num_hit_tokens,
                                                num_external)
        self.loading[request.request_id] = (request, num_external, time.monotonic())
        return True

    def finish(self, output: KVConnectorOutput) -> list[Request]:
        """Apply the workers' report; returns the requests ready to be scheduled again, in report order."""
        self.connector.update_connector_output(output)
        ready = []
        for req_id, ok in output.finished_loading.items():
            if req_id not in self.loading:
                continue
            request, num_external, start = self.loading.pop(req_id)
            request.kv_load_s += time.monotonic() - start
            if req_id in self._free_when_loaded:
                self._free_when_loaded.discard(req_id)
                self.kv.free(request)
                continue
            if ok:
                request.num_computed_tokens += num_external
                self.kv.release_dead_blocks(request)
                self.kv.cache_full_blocks(request)
            request.status = RequestStatus.WAITING
            ready.append(request)
        return ready

    def abandon(self, request: Request) -> bool:
        """A loading request ended: free its blocks once its load is reported. False if it was not loading."""
        if request.request_id not in self.loading:
            return False
        self._free_when_loaded.add(request.request_id)
        return True
