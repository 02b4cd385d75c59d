"""Steps that return several tokens per request give exactly what one token per step gives.

A scripted executor stands in for the model: the token at position ``p`` is a fixed function of ``p``, and it
returns ``k`` tokens per request each step. The engine's one rule (``num_computed_tokens`` catches up with
``num_tokens``) then computes the extra tokens next step, and stops (EOS, stop ids, max_tokens, min_tokens,
stop strings) must land on the same token whatever ``k`` is.
"""
from __future__ import annotations

import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest

from jido.config import EngineConfig
from jido.core.kv_cache_spec import FullAttentionSpec, SlidingWindowSpec
from jido.core.outputs import ModelRunnerOutput, SchedulerOutput
from jido.core.sampling_params import SamplingParams
from jido.engine.llm_engine import LLMEngine
from jido.executor.abstract import Executor

TEXT = ("one two three four five six seven eight nine ten. eleven twelve thirteen, fourteen fifteen "
        "sixteen! seventeen eighteen nineteen twenty")


class ScriptedExecutor(Executor):
    """Answers each request with its next ``tokens_per_step`` scripted tokens once its known tokens are computed."""

    script: list[int] = []
    tokens_per_step = 1

    def __init__(self, config: EngineConfig, model_folder: Path) -> None:
        super().__init__(config, model_folder)
        self.num_tokens: dict[str, int] = {}

    def get_kv_cache_spec(self) -> dict[int, Any]:
        return {0: FullAttentionSpec(16, 1, 8, 4), 1: SlidingWindowSpec(16, 1, 8, 4, sliding_window=32)}

    def determine_available_memory(self) -> int:
        return 2**20

    def initialize_kv_cache(self, kv_cache_config: Any) -> None:
        self.kv_cache_config = kv_cache_config

    def capture_model(self, max_model_len: int) -> None:
        pass  # no model: nothing to capture

    def kernel_fallbacks(self) -> dict[str, str]:
        return {}  # no kernels

    def collective_rpc(self, method: str, args: tuple = (), kwargs: dict | None = None) -> list[Any]:
        return [getattr(self, method)(*args, **(kwargs or {}))]

    def execute_model(self, sched: SchedulerOutput, non_block: bool = False) -> ModelRunnerOutput | Future:
        for req_id in sched.finished_req_ids:
            self.num_tokens.pop(req_id, None)
        computed = {new.req_id: new.num_computed_tokens for new in sched.scheduled_new_reqs}
        computed.update({c.req_id: c.num_computed_tokens for c in sched.scheduled_cached_reqs})
        for new in sched.scheduled_new_reqs:
            self.num_tokens[new.req_id] = len(new.token_ids)
        sampled = {}
        for req_id, num in sched.num_scheduled_tokens.items():
            if computed[req_id] + num == self.num_tokens[req_id]:
                start = self.num_tokens[req_id]
                sampled[req_id] = [self.script[p % len(self.script)] for p in range(start, start + self.tokens_per_step)]
                self.num_tokens[req_id] += self.tokens_per_step
        return ModelRunnerOutput(sampled)

    def check_health(self) -> None:
        """Nothing can die here."""

    def shutdown(self) -> None:
        """Nothing to stop."""


@pytest.fixture(scope="module")
def engines() -> dict[int, LLMEngine]:
    made = {}
    for k in (1, 2, 5):
        executor = type(f"Scripted{k}", (ScriptedExecutor,), {"tokens_per_step": k})
        made[k] = LLMEngine(EngineConfig.from_kwargs(max_num_batched_tokens=64, dtype="float32"), executor_class=executor)
        executor.script = made[k].tokenizer.encode(TEXT, add_special_tokens=False)
    return made


def run(engine: LLMEngine, prompts: list[str], params: list[SamplingParams]) -> list[tuple]:
    for i, (prompt, p) in enumerate(zip(prompts, params)):
        engine.add_request(str(i), prompt, p)
    finished = {}
    while engine.has_unfinished_requests():
        for delta in engine.step():
            output = finished.setdefault(delta.request_id, delta)
            if output is not delta:
                output.add(delta)
    return [(c.token_ids, c.text, c.finish_reason, c.stop_reason)
            for r in sorted(finished, key=int) for c in finished[r].outputs]


def test_one_two_or_five_tokens_per_step_give_the_same_outputs(engines):
    script = engines[1].tokenizer.encode(TEXT, add_special_tokens=False)
    prompts = ["Count: one two", "Numbers " * 40, "x"]
    params = [
        SamplingParams(max_tokens=7),
        SamplingParams(max_tokens=30, stop=["fifteen"]),  # a stop string: text trimmed before it
        SamplingParams(max_tokens=30, stop_token_ids=[script[12]]),  # a stop id in the middle of a run
        SamplingParams(max_tokens=30, stop_token_ids=[script[5]], min_tokens=9),  # ignored before 9 tokens
        SamplingParams(max_tokens=30, stop=["thirteen, four"], include_stop_str_in_output=True),  # mid-token
        SamplingParams(max_tokens=3, n=2, seed=1),
    ]
    expected = None
    for k, engine in engines.items():
        got = run(engine, [prompts[i % len(prompts)] for i in range(len(params))], params)
        if expected is None:
            expected = got
            assert [r[2] for r in got] == ["length", "stop", "stop", "stop", "stop", "length", "length"]
        assert got == expected, f"{k} tokens per step"


class SlowExecutor(ScriptedExecutor):
    """A scripted executor whose every step takes ``STEP_S`` seconds, like a model forward."""

    STEP_S = 0.05

    def execute_model(self, sched: SchedulerOutput, non_block: bool = False) -> ModelRunnerOutput | Future:
        time.sleep(self.STEP_S)
        return super().execute_model(sched, non_block)


def test_first_token_time_is_stamped_after_the_step_that_made_the_token():
    SlowExecutor.script = [5, 6, 7]
    engine = LLMEngine(EngineConfig.from_kwargs(max_num_batched_tokens=64, dtype="float32"), executor_class=SlowExecutor)
    engine.add_request("r", TEXT, SamplingParams(max_tokens=1, ignore_eos=True))
    before = time.monotonic()
    (output,) = engine.step()
    after = time.monotonic()
    scheduled, first = output.metrics["first_scheduled_time"], output.metrics["first_token_time"]
    assert before <= scheduled <= first <= after
    # The prefill step's model time lies between scheduling and the first token (what /metrics reports as
    # vllm:request_prefill_time_seconds); it was once stamped before the step ran and came out negative.
    assert first - scheduled >= SlowExecutor.STEP_S
