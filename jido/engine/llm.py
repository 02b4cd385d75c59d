"""LLM: the offline API — ``LLM().generate(prompts, SamplingParams(...))``, as in vLLM."""
from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any

from tqdm import tqdm

from jido.config import EngineConfig
from jido.core.sampling_params import SamplingParams
from jido.engine.llm_engine import LLMEngine, ProcessedPrompt, PromptType
from jido.engine.outputs import RequestOutput
from jido.models.tokenizer import Tokenizer


class LLM:
    """Loads a model once and generates for batches of prompts with continuous batching.

    Keyword arguments are the engine settings of :mod:`jido.config` (``device``, ``dtype``,
    ``max_model_len``, ``block_size``, ``kv_cache_memory``, ``max_num_seqs``,
    ``max_num_batched_tokens``, ``enable_prefix_caching``, ``distributed_executor_backend``, ...),
    routed to the config that owns each by :meth:`EngineConfig.from_kwargs`.
    """

    def __init__(self, model: str | None = None, **kwargs) -> None:
        config = EngineConfig.from_kwargs(model=model, **kwargs)
        if config.parallel_config.data_parallel_size > 1:
            raise ValueError("data_parallel_size applies to `jido serve`, which routes requests between the "
                             "replicas; offline, start one LLM per replica (as with vLLM)")
        self.llm_engine = LLMEngine(config)
        self._request_counter = itertools.count()

    def get_tokenizer(self) -> Tokenizer:
        return self.llm_engine.tokenizer

    def reset_prefix_cache(self) -> None:
        """Forget every cached prefix (as vLLM's ``LLM.reset_prefix_cache``); running requests keep their blocks."""
        self.llm_engine.reset_prefix_cache()

    def pin_prefix(self, prompt: PromptType) -> dict:
        """Prefill ``prompt`` and pin its KV in the device pool (cache-augmented generation); later prompts that
        start with it reuse it until :meth:`unpin_prefix`. Returns ``{"id", "num_tokens", "num_pinned_tokens"}``.

        Raises ValueError for a prompt shorter than a KV block, ``PinTooLargeError`` (a ValueError) when pins may
        not hold that many blocks, and ``TooManyPinsError`` (a ValueError) past ``max_pinned_prefixes`` pins.
        """
        pin_id = f"pin-{next(self._request_counter)}"
        processed = self._tokenize(prompt)
        self.llm_engine.add_pin_request(pin_id, processed)
        self._run([pin_id], use_tqdm=False)
        pinned = next(p for p in self.llm_engine.get_scheduler_stats().pinned if p.pin_id == pin_id)
        return {"id": pin_id, "num_tokens": len(processed.token_ids), "num_pinned_tokens": pinned.num_tokens}

    def unpin_prefix(self, pin_id: str) -> None:
        """Release a pinned prefix (its blocks stay cached until evicted). Raises KeyError for an unknown id."""
        self.llm_engine.unpin(pin_id)

    def collective_rpc(self, method: str | Callable[..., Any], args: tuple = (),
                       kwargs: dict[str, Any] | None = None) -> list[Any]:
        """Call a worker method (or ``fn(worker, ...)``) on every worker, as vLLM's ``LLM.collective_rpc``."""
        return self.llm_engine.collective_rpc(method, args, kwargs)

    def shutdown(self) -> None:
        """Stop the engine's worker processes, if any (they also stop when the LLM is garbage-collected)."""
        self.llm_engine.shutdown()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc_info: object) -> None:
        """``with LLM(...) as llm:`` stops the workers when the block ends, however it ends."""
        self.shutdown()

    def generate(self, prompts: PromptType | Sequence[PromptType],
                 sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
                 use_tqdm: bool = True, priority: Sequence[int] | None = None) -> list[RequestOutput]:
        """Generate for every prompt; outputs come back in prompt order.

        ``priority`` (one per prompt, lower first) orders admission under ``scheduling_policy="priority"``.

        Every prompt is validated before any is queued, so a bad one raises ValueError and leaves the
        engine as it was.
        """
        prompt_list = _as_prompt_list(prompts)
        params_list = _as_params_list(sampling_params, len(prompt_list))
        priorities = list(priority) if priority is not None else [0] * len(prompt_list)
        if len(priorities) != len(prompt_list):
            raise ValueError(f"got {len(priorities)} priorities for {len(prompt_list)} prompts: give one per prompt")
        tokenized = [self._tokenize(prompt) for prompt in prompt_list]
        request_ids = [str(next(self._request_counter)) for _ in prompt_list]
        try:
            for request_id, prompt, params, rank in zip(request_ids, tokenized, params_list, priorities):
                self.llm_engine.add_request(request_id, prompt, params, priority=rank)
            return self._run(request_ids, use_tqdm)
        except BaseException:
            self.llm_engine.abort_request(request_ids)
            raise

    def _tokenize(self, prompt: PromptType) -> ProcessedPrompt:
        """Validate a prompt and tokenize it once; the engine takes the ids as they are."""
        return self.llm_engine.prepare_prompt(prompt)

    def _run(self, request_ids: list[str], use_tqdm: bool) -> list[RequestOutput]:
        merged: dict[str, RequestOutput] = {}  # the first delta of a request becomes its cumulative output
        bar = tqdm(total=len(request_ids), desc="generating", unit="req",
                   disable=not use_tqdm or len(request_ids) < 2)
        with bar:
            while self.llm_engine.has_unfinished_requests():
                for delta in self.llm_engine.step():
                    output = merged.setdefault(delta.request_id, delta)
                    if output is not delta:
                        output.add(delta)
                    if output.finished:
                        bar.update(1)
        return [merged[r] for r in request_ids]


def _as_prompt_list(prompts: PromptType | Sequence[PromptType]) -> list[PromptType]:
    if isinstance(prompts, (str, dict, ProcessedPrompt)):
        return [prompts]
    # NOTE: bytes are a sequence of ints: list(b"hi") would pass for the token ids [104, 105].
    if not isinstance(prompts, (list, tuple)):
        raise TypeError(f"prompts must be a string, a list of token ids, a dict or a list of those, "
                        f"got {type(prompts).__name__}")
    prompts = list(prompts)
    if prompts and all(isinstance(t, int) and not isinstance(t, bool) for t in prompts):
        return [prompts]  # one prompt given as token ids
    if not prompts:
        raise ValueError("no prompts given: pass a string, a list of token ids, or a list of prompts")
    return prompts


def _as_params_list(params: SamplingParams | Sequence[SamplingParams] | None, num: int) -> list[SamplingParams]:
    if params is None:
        return [SamplingParams()] * num
    if isinstance(params, SamplingParams):
        return [params] * num
    if not isinstance(params, (list, tuple)) or not all(isinstance(p, SamplingParams) for p in params):
        raise TypeError("sampling_params must be a SamplingParams or a list of them, got "
                        f"{type(params).__name__}" + (" holding other objects" if isinstance(params, (list, tuple))
                                                       else ""))
    params = list(params)
    if len(params) != num:
        raise ValueError(f"got {len(params)} SamplingParams for {num} prompts: give one, or one per prompt")
    return params
