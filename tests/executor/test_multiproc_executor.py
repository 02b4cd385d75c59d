"""The mp executor: workers in their own processes serve exactly what the in-process executor serves, and a
dead worker fails the engine with a clear error instead of hanging it."""
from __future__ import annotations

import os
import signal

import pytest

from jido import LLM, SamplingParams
from jido.executor.abstract import WorkerError

GREEDY = SamplingParams(temperature=0, max_tokens=12)
PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time"]


def worker_pid(worker: object) -> int:
    return os.getpid()


@pytest.fixture(scope="module")
def mp_llm() -> LLM:
    llm = LLM(kv_cache_memory="64MiB", distributed_executor_backend="mp", dtype="float32", quantization="none")
    yield llm
    llm.shutdown()


def test_worker_process_gives_the_same_tokens_as_in_process(llm, mp_llm):
    expected = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]
    got = [o.outputs[0].token_ids for o in mp_llm.generate(PROMPTS, GREEDY, use_tqdm=False)]
    assert got == expected
    assert mp_llm.collective_rpc(worker_pid) != [os.getpid()]


def test_a_killed_worker_fails_the_request_and_the_health_check():
    llm = LLM(kv_cache_memory="64MiB", distributed_executor_backend="mp", dtype="float32")
    [pid] = llm.collective_rpc(worker_pid)
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(WorkerError, match=r"worker 0 \(pid \d+\) exited with code -9"):
        llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    with pytest.raises(WorkerError, match="exited with code -9"):
        llm.llm_engine.check_health()
    assert not llm.llm_engine.has_unfinished_requests()  # the failed generate aborted what it queued
    llm.shutdown()


def test_an_llm_used_as_a_context_manager_stops_its_worker_processes_when_the_block_ends(tiny_model_folder):
    with LLM(str(tiny_model_folder), kv_cache_memory="4MiB", distributed_executor_backend="mp") as llm:
        (pid,) = llm.collective_rpc(worker_pid)
        assert llm.generate(["w3 w4"], GREEDY, use_tqdm=False)[0].outputs[0].token_ids
        os.kill(pid, 0)  # alive inside the block
    with pytest.raises(ProcessLookupError):  # stopped and joined by the block's end
        os.kill(pid, 0)
