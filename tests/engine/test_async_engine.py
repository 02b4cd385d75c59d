"""AsyncEngine over a scripted fake engine: waiting-queue accounting, aborts on early exit, a dying loop."""
from __future__ import annotations

import asyncio
import threading
from types import SimpleNamespace

import pytest

from jido.core.sampling_params import SamplingParams
from jido.engine.async_engine import AsyncEngine, EngineOverloadedError, EngineStoppedError, RequestStream
from jido.engine.outputs import CompletionOutput, RequestOutput
from jido.metrics.stats import IterationStats, SchedulerStats


class FakeEngine:
    """Finishes each request one step after it is added; ``step`` blocks until the test allows it.

    ``num_running`` sequences of other requests hold running slots throughout; by default all of them.
    """

    def __init__(self, fail_step: bool = False, max_num_seqs: int = 4, num_running: int = 4) -> None:
        self.config = SimpleNamespace(scheduler_config=SimpleNamespace(max_num_seqs=max_num_seqs))
        self.num_running = num_running
        self.pending: list[str] = []
        self.aborted: list[str] = []
        self.fail_step = fail_step
        self.may_step = threading.Semaphore(0)
        self.last_iteration_stats = IterationStats()

    def get_scheduler_stats(self) -> SchedulerStats:
        return SchedulerStats(self.num_running, len(self.pending), 0.0, 0, 0, 0)

    def check_health(self) -> None:
        """A scripted engine has no workers to lose."""

    def add_request(self, request_id, prompt, params, arrival_time=None, priority=0, kv_transfer_params=None) -> None:
        if prompt == "bad":
            raise ValueError("prompt is bad")
        self.pending.append(request_id)

    def abort_request(self, request_ids) -> None:
        self.aborted += request_ids
        self.pending = [r for r in self.pending if r not in request_ids]

    def has_unfinished_requests(self) -> bool:
        return bool(self.pending)

    def has_engine_work(self) -> bool:
        return self.has_unfinished_requests()

    def step(self) -> list[RequestOutput]:
        self.may_step.acquire()
        if self.fail_step:
            raise RuntimeError("device lost")
        done, self.pending = self.pending, []
        return [RequestOutput(r, None, [1], [CompletionOutput(0, "ok", [7], None, None, "length")], True)
                for r in done]


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 30))


def test_requests_past_the_waiting_limit_are_refused_until_the_queue_moves():
    async def scenario():
        fake = FakeEngine()
        engine = AsyncEngine(fake, max_waiting_requests=2)
        engine.start()
        first = engine.add_request("a", "x", SamplingParams(n=2))
        with pytest.raises(EngineOverloadedError, match="limit is 2"):
            engine.add_request("b", "x", SamplingParams())
        fake.may_step.release()
        with first:
            outputs = [o async for o in first]
        assert [o.outputs[0].text for o in outputs] == ["ok"]
        assert engine.num_waiting == 0
        fake.may_step.release()
        with engine.add_request("c", "x", SamplingParams(n=2)) as again:  # room again
            assert [o.finished async for o in again] == [True]
        await engine.shutdown()
        with pytest.raises(EngineStoppedError, match="shutting down"):
            engine.add_request("d", "x", SamplingParams())

    run(scenario())


def test_free_running_slots_admit_requests_beyond_the_waiting_limit():
    # Not started: every request stays submitted and not yet picked up, as in a burst on an idle server.
    engine = AsyncEngine(FakeEngine(max_num_seqs=8, num_running=3), max_waiting_requests=2)  # 5 free slots
    for i, n in enumerate([1, 3, 2, 1]):
        engine.add_request(f"r{i}", "x", SamplingParams(n=n))
    assert (engine.num_waiting, engine.num_free_slots) == (7, 5)
    with pytest.raises(EngineOverloadedError, match="this request needs 1 sequences; 7 are already waiting and 5 of "
                                                    "8 running slots are free .the waiting limit is 2."):
        engine.add_request("over", "x", SamplingParams())


def test_room_for_a_batch_is_checked_whole_and_the_refusal_says_what_others_hold():
    engine = AsyncEngine(FakeEngine(max_num_seqs=8, num_running=0), max_waiting_requests=4)  # idle
    assert engine.max_num_unfinished == 12
    engine.check_room(12)  # every running slot and the whole waiting queue
    with pytest.raises(EngineOverloadedError, match="^this request needs 13 sequences; 0 are already waiting and 8 "
                                                    "of 8 running slots are free .the waiting limit is 4.; retry"):
        engine.check_room(13)


def test_leaving_a_stream_early_aborts_its_request_and_bad_input_raises_from_the_stream():
    async def scenario():
        fake = FakeEngine()
        engine = AsyncEngine(fake, max_waiting_requests=8)
        engine.start()
        with engine.add_request("left", "x", SamplingParams()):
            pass
        with engine.add_request("bad", "bad", SamplingParams()) as stream, pytest.raises(ValueError, match="is bad"):
            await anext(stream)
        await engine.shutdown()
        assert fake.aborted == ["left"]

    run(scenario())


def test_a_dying_engine_loop_fails_every_stream_and_refuses_new_requests():
    async def scenario():
        fake = FakeEngine(fail_step=True)
        engine = AsyncEngine(fake, max_waiting_requests=8)
        engine.start()
        fake.may_step.release()
        with engine.add_request("a", "x", SamplingParams()) as stream:
            with pytest.raises(EngineStoppedError, match="device lost"):
                await anext(stream)
        with pytest.raises(EngineStoppedError, match="loop failed"):
            engine.add_request("b", "x", SamplingParams())
        await engine.shutdown()

    run(scenario())


def delta(text: str, token_ids: list[int], finished: bool, offset: int) -> RequestOutput:
    reason = "stop" if finished else None
    return RequestOutput("r", None, [1], [CompletionOutput(0, text, token_ids, None, None, reason, None, offset)],
                         finished)


def test_a_stream_merges_deltas_a_slow_reader_missed():
    async def scenario():
        stream = RequestStream("r", AsyncEngine(FakeEngine(), max_waiting_requests=8))
        stream.put(delta("Hello", [5], False, 0))
        first = await anext(stream)
        assert (first.outputs[0].text, first.outputs[0].token_ids) == ("Hello", [5])
        stream.put(delta(" wor", [6], False, 5))
        stream.put(delta("", [7], True, 6))  # a stop string found now cuts " wor" back to " "
        last = await anext(stream)
        assert (last.outputs[0].text, last.outputs[0].token_ids, last.finished) == ("Hello ", [5, 6, 7], True)
        assert last.outputs[0].finish_reason == "stop"

    run(scenario())


def test_a_dead_worker_makes_the_engine_unhealthy_before_any_step():
    class DeadWorkers(FakeEngine):
        def check_health(self) -> None:
            raise RuntimeError("worker 0 (pid 7) exited with code -9")

    engine = AsyncEngine(DeadWorkers(), max_waiting_requests=8)
    with pytest.raises(EngineStoppedError, match="unhealthy: worker 0 .* exited with code -9"):
        engine.check_health()
    AsyncEngine(FakeEngine(), max_waiting_requests=8).check_health()
