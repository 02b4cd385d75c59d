"""The scheduler with a KV connector: async loads park a request outside the step, failures recompute, evictions
are reported with their block ids — checked with a scripted connector (pure Python, no torch)."""
from __future__ import annotations

from jido.core.kv_cache_manager import KVCacheManager
from jido.core.kv_connector import ReleasedBlock, KVConnectorOutput, KVConnectorScheduler
from jido.core.outputs import ModelRunnerOutput
from jido.core.request import Request, RequestStatus
from jido.core.sampling_params import SamplingParams
from jido.core.scheduler import Scheduler, SchedulerLimits
from jido.utils.hashing import hash_block_tokens


class ScriptedConnector(KVConnectorScheduler):
    """Offers ``offers[req_id]`` tokens past the device hit and records every call."""

    def __init__(self, offers: dict[str, int]) -> None:
        self.offers = offers
        self.allocated: list[tuple[str, list[list[int]], int, int]] = []
        self.evicted: list[ReleasedBlock] = []
        self.finished: list[str] = []
        self.num_metas = 0

    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int) -> int:
        return self.offers.get(request.request_id, 0)

    def update_state_after_alloc(self, request, block_ids, num_computed_tokens, num_external_tokens) -> None:
        self.allocated.append((request.request_id, block_ids, num_computed_tokens, num_external_tokens))

    def on_blocks_released(self, blocks: list[ReleasedBlock]) -> None:
        self.evicted.extend(blocks)

    def build_connector_meta(self, scheduler_output, block_ids) -> str:
        self.num_metas += 1
        return f"meta-{self.num_metas}"

    def update_connector_output(self, output: KVConnectorOutput) -> None:
        pass

    def request_finished(self, request: Request, block_ids) -> tuple[bool, None]:
        self.finished.append(request.request_id)
        return False, None


def make(offers: dict[str, int], num_blocks: int = 16) -> tuple[Scheduler, ScriptedConnector]:
    connector = ScriptedConnector(offers)
    return Scheduler(SchedulerLimits(8, 64, 256), KVCacheManager(num_blocks, 4), connector), connector


def add(scheduler: Scheduler, req_id: str, num_tokens: int, first: int = 0) -> Request:
    request = Request(req_id, list(range(first, first + num_tokens)), SamplingParams(max_tokens=4))
    scheduler.add_request(request)
    return request


def step(scheduler: Scheduler, loaded: dict[str, bool] | None = None):
    out = scheduler.schedule()
    sampled = {r: [7] for r, n in out.num_scheduled_tokens.items()
               if scheduler.requests[r].num_computed_tokens + n == scheduler.requests[r].num_tokens}
    report = KVConnectorOutput(finished_loading=loaded or {})
    scheduler.update_from_output(out, ModelRunnerOutput(sampled, kv_connector_output=report))
    return out


def test_a_loading_request_holds_its_blocks_outside_the_step_and_resumes_past_the_loaded_tokens():
    scheduler, connector = make({"a": 8})
    a = add(scheduler, "a", 12)
    b = add(scheduler, "b", 5, first=100)
    out = step(scheduler)
    assert out.num_scheduled_tokens == {"b": 5}  # a waits without holding up b
    assert out.kv_connector_metadata == "meta-1"
    # It holds the two blocks the load fills; b, scheduled after it, took the next ones.
    assert a.status == RequestStatus.WAITING_FOR_REMOTE_KVS and scheduler.kv.get_block_ids("a") == [[0, 1]]
    assert connector.allocated == [("a", [[0, 1]], 0, 8)] and scheduler.kv.get_block_ids("b") == [[2, 3]]
    assert scheduler.has_unfinished_requests() and scheduler.stats().num_waiting == 1
    step(scheduler, loaded={"a": True})  # the workers report the load in this step's output
    out = step(scheduler)
    assert out.num_scheduled_tokens == {"b": 1, "a": 4}
    assert out.scheduled_new_reqs[0].block_ids == [[0, 1, 4]] and out.scheduled_new_reqs[0].num_computed_tokens == 8
    assert a.num_cached_tokens == 8 and b.num_cached_tokens == 0


def test_a_failed_load_computes_every_token_itself_in_the_same_blocks():
    scheduler, _ = make({"a": 8})
    a = add(scheduler, "a", 12)
    step(scheduler)
    step(scheduler, loaded={"a": False})
    out = step(scheduler)
    assert out.num_scheduled_tokens == {"a": 12} and out.scheduled_new_reqs[0].block_ids == [[0, 1, 2]]
    assert a.num_cached_tokens == 0


def test_an_aborted_loading_request_frees_its_blocks_only_once_its_load_is_reported():
    scheduler, connector = make({"a": 8})
    add(scheduler, "a", 12)
    step(scheduler)
    scheduler.finish_requests(["a"], RequestStatus.FINISHED_ABORTED)
    assert connector.finished == ["a"] and scheduler.kv.pool.num_free_blocks == 14  # a worker may still write them
    step(scheduler, loaded={"a": True})
    assert scheduler.kv.pool.num_free_blocks == 16 and not scheduler.has_unfinished_requests()


def test_the_pool_reports_each_cached_block_its_last_holder_releases_with_its_id_key_and_tokens():
    scheduler, connector = make({}, num_blocks=6)
    add(scheduler, "a", 9)
    step(scheduler)
    assert connector.evicted == []  # held by a
    while scheduler.has_unfinished_requests():
        step(scheduler)  # a: 9 prompt + 4 output tokens in blocks 0..3, of which 0..2 full and cached
    h0 = hash_block_tokens(None, (0, 1, 2, 3))
    h1 = hash_block_tokens(h0, (4, 5, 6, 7))
    # Freed tail first, as the pool's LRU order has them; block 3 was never full, so never cached.
    assert [(e.block_id, e.key[0]) for e in connector.evicted] == [(2, 0), (1, 0), (0, 0)]
    assert connector.evicted[1] == ReleasedBlock(1, (0, h1), (4, 5, 6, 7))
    add(scheduler, "b", 9)  # hits a's blocks 0 and 1 (one token is left to compute), computes the third in 3
    while scheduler.has_unfinished_requests():
        step(scheduler)
    assert [e.block_id for e in connector.evicted] == [2, 1, 0, 3, 1, 0]
