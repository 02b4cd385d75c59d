"""LLMEngine: prompts in, RequestOutputs out — validation, n-way fan-out, detokenization and stop strings."""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any
import time
from dataclasses import dataclass, field

from jido.config import EngineConfig
from jido.core.kv_blend import BlendSpec
from jido.core.outputs import EngineCoreOutput, Logprobs, PromptLogprobsLists
from jido.core.request import Request
from jido.core.sampling_params import SamplingParams
from jido.core.structured_output import Grammar, GrammarCompiler
from jido.engine.blend_prompts import ChunkWarmups, blend_prompt, parse_kv_blend, split_on_separator
from jido.engine.detokenizer import IncrementalDetokenizer
from jido.engine.engine_core import EngineCore
from jido.engine.outputs import CompletionOutput, Logprob, PromptLogprobs, RequestOutput
from jido.kvtransfer.handoff import ProduceRequest, parse_transfer_params
from jido.executor.abstract import Executor
from jido.metrics.stats import IterationStats, SchedulerStats
from jido.models.config import ModelArchConfig
from jido.models.loader import load_config, resolve_model
from jido.models.tokenizer import Tokenizer, check_encodable

@dataclass(frozen=True)
class ProcessedPrompt:
    """A prompt already validated and tokenized by :meth:`LLMEngine.prepare_prompt`; taken as it is."""

    text: str | None
    token_ids: list[int]
    kv_blend: BlendSpec | None = None  # a prompt of cached chunks to blend (CacheBlend)


PromptType = str | list[int] | dict | ProcessedPrompt


@dataclass
class _Sequence:
    """One completion being generated: a child request of a parent with ``n`` completions."""

    index: int
    detokenizer: IncrementalDetokenizer
    new_token_ids: list[int] = field(default_factory=list)  # since the last output: the next delta
    new_logprobs: list[Logprobs] = field(default_factory=list)
    cumulative_logprob: float = 0.0
    num_text_sent: int = 0  # characters of the text already in earlier deltas
    finish_reason: str | None = None
    stop_reason: int | str | None = None


@dataclass
class _Parent:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    sequences: list[_Sequence]
    arrival_time: float
    first_token_time: float | None = None
    first_scheduled_time: float | None = None
    kv_load_s: float = 0.0
    num_cached_tokens: int = 0
    kv_transfer_params: dict | None = None  # for the next delta
    has_prompt_logprobs: bool = False  # every child computes them; the first to report is kept
    new_prompt_logprobs: PromptLogprobs | None = None  # for the next delta

    @property
    def finished(self) -> bool:
        return all(s.finish_reason is not None for s in self.sequences)


class LLMEngine:
    """The engine as seen by the offline ``LLM`` and by servers: add requests, step, read outputs."""

    def __init__(self, config: EngineConfig, executor_class: type[Executor] | None = None) -> None:
        self.config = config
        # The model is resolved once, here; the executor and its workers get the folder.
        self.model_folder = resolve_model(config.model_config.model)
        self.model_arch = ModelArchConfig.from_hf_config(load_config(self.model_folder))
        self.tokenizer = Tokenizer.from_folder(self.model_folder)
        self.core = EngineCore(config, self.model_folder, self.model_arch, executor_class)
        self.max_model_len = self.core.kv_plan.max_model_len
        self.vocab_size = self.model_arch.vocab_size
        self.eos_token_ids = tuple(self.tokenizer.eos_token_ids)
        self.grammar_compiler = GrammarCompiler(self.model_folder / "tokenizer.json",
                                                self.vocab_size, list(self.eos_token_ids))
        self.last_iteration_stats: IterationStats | None = None
        self._parents: dict[str, _Parent] = {}
        self._child_to_parent: dict[str, tuple[str, int]] = {}
        self._pending_pins: dict[str, tuple[list[int], int]] = {}  # pin id -> (prompt ids, blocks reserved)
        self._warmups = ChunkWarmups()
        self.kv_block_bytes = self.core.kv_plan.kv_cache_config.block_bytes
        self.kernel_fallbacks = self.core.kernel_fallbacks  # library -> what runs instead (and why)

    # -- input ----------------------------------------------------------------------------------
    def process_prompt(self, prompt: PromptType) -> tuple[str | None, list[int]]:
        """Turn a prompt into token ids, or raise ValueError saying what is wrong with it."""
        if isinstance(prompt, dict):
            if "prompt_token_ids" in prompt:
                # Already tokenized: the ids are checked, the text (if given) is kept for the output.
                text = prompt.get("prompt")
                if text is not None and not isinstance(text, str):
                    raise ValueError(f"a dict prompt's 'prompt' must be a string, got {type(text).__name__}")
                ids = prompt["prompt_token_ids"]
                if isinstance(ids, (str, dict)):
                    raise ValueError(f"a dict prompt's 'prompt_token_ids' must be a list of token ids, "
                                     f"got {type(ids).__name__}")
                return text, self.process_prompt(ids)[1]
            if "prompt" in prompt:
                prompt = prompt["prompt"]
            else:
                raise ValueError("a dict prompt needs a 'prompt' (text) or 'prompt_token_ids' (list of ints) key")
        if isinstance(prompt, str):
            if not prompt:
                raise ValueError("prompt is empty: give a non-empty string or at least one token id")
            check_encodable(prompt, "prompt")
            return prompt, self.tokenizer.encode(prompt)
        if not isinstance(prompt, (list, tuple)) or not all(isinstance(t, int) and not isinstance(t, bool)
                                                            for t in prompt):
            raise ValueError(f"a prompt must be a string or a list of token ids, got {type(prompt).__name__}")
        self._check_token_ids(list(prompt))
        return None, list(prompt)

    def _check_token_ids(self, ids: list[int]) -> None:
        if not ids:
            raise ValueError("prompt is empty: give a non-empty string or at least one token id")
        for position, token_id in enumerate(ids):
            if not 0 <= token_id < self.vocab_size:
                raise ValueError(f"prompt token id {token_id} at position {position} is outside the "
                                 f"vocabulary: ids must be in [0, {self.vocab_size})")

    def prepare_prompt(self, prompt: PromptType) -> ProcessedPrompt:
        """Validate and tokenize a prompt once (length checked too); raise ValueError saying what is wrong.

        A dict with ``kv_blend`` (``{"chunks": [...]}``), or a text split by ``kv_blend_separator``, is a blend
        prompt: its chunks are tokenized one by one after the head (BOS), then the question.
        """
        blend = None
        if isinstance(prompt, dict) and "kv_blend" in prompt:
            question = prompt.get("prompt_token_ids", prompt.get("prompt", ""))
            text = prompt.get("prompt") if isinstance(prompt.get("prompt"), str) else None
            ids, blend = parse_kv_blend(prompt["kv_blend"], question, self.tokenizer, self._blend_ratio)
            self._check_token_ids(ids)
        else:
            text, ids = self.process_prompt(prompt)
            split = split_on_separator(text, self._blend_separator) if text and self._blend_separator else None
            if split is not None:
                ids, blend = blend_prompt(self.tokenizer, *split, self._blend_ratio)
        self.check_prompt_length(ids)
        return ProcessedPrompt(text, ids, blend)

    @property
    def _blend_ratio(self) -> float:
        return self.config.cache_config.kv_blend_recompute_ratio

    @property
    def _blend_separator(self) -> str | None:
        return self.config.cache_config.kv_blend_separator

    def _check_blend(self, num_tokens: int, params: SamplingParams, transfer: object) -> None:
        if transfer is not None:
            raise ValueError("kv_blend and kv_transfer_params cannot be combined: a blend prefills from local chunks")
        if self.config.speculative_config is not None:
            raise ValueError("kv_blend is not supported with speculative decoding (speculative_config)")
        if self.config.parallel_config.world_size > 1:
            raise ValueError("kv_blend needs a single-worker engine (tensor/pipeline parallel size 1)")
        if not self.config.cache_config.enable_prefix_caching:
            raise ValueError("kv_blend reuses chunks from the prefix cache: it needs enable_prefix_caching")
        if params.prompt_logprobs is not None:
            raise ValueError("kv_blend computes only some prompt tokens past its check layer: it cannot give "
                             "prompt_logprobs")
        budget = self.config.scheduler_config.max_num_batched_tokens
        if num_tokens > budget:
            raise ValueError(f"a kv_blend prompt is prefilled in one step: its {num_tokens} tokens exceed "
                             f"max_num_batched_tokens={budget}; raise it or send fewer chunks")

    def check_prompt_length(self, prompt_token_ids: list[int]) -> None:
        if len(prompt_token_ids) >= self.max_model_len:
            raise ValueError(f"prompt has {len(prompt_token_ids)} tokens but max_model_len is "
                             f"{self.max_model_len}: a prompt may have at most {self.max_model_len - 1} "
                             "tokens, leaving room for one generated token")

    def add_request(self, request_id: str, prompt: PromptType, params: SamplingParams,
                    arrival_time: float | None = None, priority: int = 0,
                    kv_transfer_params: dict | None = None) -> None:
        """Validate and queue a request; on ValueError nothing was queued.

        ``priority`` orders admission under ``scheduling_policy="priority"`` (lower first), as in vLLM.
        ``kv_transfer_params`` (vLLM's) asks a KV producer to prefill and hold the KV for a consumer
        (``{"do_remote_decode": true}``), or brings a consumer the handle a producer returned.
        """
        if not isinstance(priority, int) or isinstance(priority, bool):
            raise ValueError(f"priority must be an integer, got {priority!r}")
        transfer = self.check_transfer_params(kv_transfer_params, params)
        if request_id in self._parents:
            raise ValueError(f"request id {request_id!r} is already in use")
        if not isinstance(params, SamplingParams):
            raise ValueError(f"sampling params must be a SamplingParams, got {type(params).__name__}")
        if not isinstance(prompt, ProcessedPrompt):
            prompt = self.prepare_prompt(prompt)
        text, ids, blend = prompt.text, prompt.token_ids, prompt.kv_blend
        if blend is not None:
            self._check_blend(len(ids), params, transfer)
        arrival = time.monotonic() if arrival_time is None else arrival_time
        children = self._child_params(params)
        grammars = [self.compile_grammar(params) for _ in children]  # each child advances its own
        sequences = [_Sequence(i, IncrementalDetokenizer(self.tokenizer, ids, p)) for i, p in enumerate(children)]
        self._parents[request_id] = _Parent(request_id, text, ids, params, sequences, arrival)
        requests = []
        for i, child_params in enumerate(children):
            child_id = request_id if params.n == 1 else f"{i}_{request_id}"
            self._child_to_parent[child_id] = (request_id, i)
            request = Request(child_id, ids, child_params, self.eos_token_ids, arrival, priority, transfer, blend)
            request.grammar = grammars[i]
            requests.append(request)
        missing = self._uncached_chunks(ids, blend) if blend is not None else []
        if missing:  # held back until its chunks are cached on their own
            for warmup in self._warmups.hold(request_id, requests, missing):
                self.core.add_request(warmup)
            return
        for request in requests:
            self.core.add_request(request)

    def _uncached_chunks(self, ids: list[int], blend: BlendSpec) -> list[list[int]]:
        """The chunk prompts (head + chunk) whose whole blocks the prefix cache does not all hold."""
        size = self.config.cache_config.block_size
        prompts = [blend.standalone(ids, i) for i in range(len(blend.chunk_ends))]
        return [p for p in prompts if self.core.num_cached_tokens(p) < len(p) // size * size]

    def compile_grammar(self, params: SamplingParams) -> Grammar | None:
        """The grammar of ``params``' structured outputs (None without); raises ValueError naming the field when
        they are invalid or this engine cannot enforce them. Safe from any thread (the server checks first)."""
        if params.structured_outputs is None:
            return None
        return self.grammar_compiler.compile(params.structured_outputs)

    def check_transfer_params(self, params: dict | None, sampling: SamplingParams | None = None) -> object:
        """A request's ``kv_transfer_params`` parsed and checked against this engine's role (and ``sampling``).

        Raises ValueError saying why this engine cannot serve them; read-only, safe from any thread.
        """
        if params is None:
            return None
        config = self.config.kv_transfer_config
        if config is None:
            raise ValueError("kv_transfer_params needs an engine with a kv_transfer_config (a KV producer or consumer)")
        parsed = parse_transfer_params(params, config.is_producer, config.is_consumer)
        if isinstance(parsed, ProduceRequest) and sampling is not None and (sampling.max_tokens != 1 or sampling.n != 1):
            # Its blocks are exported once its prompt is computed: they must not change (decode, preemption) after.
            raise ValueError("a do_remote_decode request prefills for a consumer: it needs max_tokens 1 and n 1")
        return parsed

    @property
    def kv_connector_info(self) -> dict:
        """The KV connector's worker-side facts: the KV endpoint's address and format (empty without one)."""
        return self.core.kv_connector_info

    def has_engine_work(self) -> bool:
        """Requests, or KV transfers the engine keeps stepping for: held for a consumer, or loading."""
        return bool(self._parents) or self.core.has_unfinished_requests()

    @staticmethod
    def _child_params(params: SamplingParams) -> list[SamplingParams]:
        if params.n == 1:
            return [params]
        # Distinct seeds per child, so n seeded completions differ yet stay reproducible; they wrap around
        # within int64 (seed 2**63 - 1 is valid, its second child's seed + 1 would not be).
        return [dataclasses.replace(params, n=1, seed=None if params.seed is None else _wrap_int64(params.seed + i))
                for i in range(params.n)]

    def add_pin_request(self, pin_id: str, prompt: PromptType, arrival_time: float | None = None) -> None:
        """Prefill ``prompt`` and pin its KV blocks once done (cache-augmented generation), as request ``pin_id``.

        Later prompts that start with it reuse its blocks, which the pool never evicts until
        :meth:`unpin`. Raises ValueError for a bad prompt or a used id, and ``PinTooLargeError`` (a
        ValueError) when pins may not hold that many blocks; then nothing was queued.
        """
        if pin_id in self._pending_pins or pin_id in self.core.scheduler.pins:
            raise ValueError(f"pinned prefix id {pin_id!r} is already in use")
        if not isinstance(prompt, ProcessedPrompt):
            prompt = self.prepare_prompt(prompt)
        reserved = sum(blocks for _, blocks in self._pending_pins.values())
        needed = self.core.check_pin_fits(len(prompt.token_ids), reserved, len(self._pending_pins))
        self.add_request(pin_id, prompt, SamplingParams(max_tokens=1, temperature=0), arrival_time)
        self._pending_pins[pin_id] = (prompt.token_ids, needed)

    def unpin(self, pin_id: str) -> None:
        """Release a pinned prefix's blocks to the cache. Raises KeyError for an id that is not pinned."""
        self.core.unpin_prefix(pin_id)

    def abort_request(self, request_ids: list[str]) -> None:
        child_ids = [c for c, (parent, _) in self._child_to_parent.items() if parent in request_ids]
        self.core.abort_requests(child_ids)
        for child_id in child_ids:
            del self._child_to_parent[child_id]
        for request_id in request_ids:
            self._parents.pop(request_id, None)
            self._pending_pins.pop(request_id, None)
            self.core.abort_requests(self._warmups.abort(request_id))

    def has_unfinished_requests(self) -> bool:
        """Requests not yet finished, or KV saves that the next step hands to the offload tiers (so the blocks a
        generate's last request released are on their way to the tiers when it returns)."""
        return bool(self._parents) or self.core.has_pending_kv_work()

    def get_scheduler_stats(self) -> SchedulerStats:
        return self.core.get_scheduler_stats()

    def reset_prefix_cache(self) -> None:
        self.core.reset_prefix_cache()

    def check_health(self) -> None:
        """Raise if the engine's workers cannot serve (a worker process died)."""
        self.core.check_health()

    def collective_rpc(self, method: str | Callable[..., Any], args: tuple = (),
                       kwargs: dict[str, Any] | None = None) -> list[Any]:
        return self.core.collective_rpc(method, args, kwargs)

    def shutdown(self) -> None:
        self.core.shutdown()

    def __enter__(self) -> LLMEngine:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.shutdown()

    # -- one step ---------------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Run one engine step; returns a delta for every request that advanced.

        Each delta carries only what its request gained in this step, so a step's work does not grow with
        what was generated before; merge them with :meth:`RequestOutput.add` (the first one starts the
        cumulative output).

        The step's records (queue times, where the time went) are kept in ``last_iteration_stats``.
        While dynamic batching holds waiting requests back for its batch to fill and nothing runs, the step
        first sleeps until it would form the batch: no request can arrive meanwhile from the caller's thread.
        (``AsyncEngine`` waits for arrivals instead, and steps once the scheduler would admit.)
        """
        wait_s = self.core.get_scheduler_stats().admission_wait_s
        if wait_s > 0:
            time.sleep(wait_s)
        touched: dict[str, _Parent] = {}
        core_outputs = self.core.step()
        now = time.monotonic()  # the tokens exist once the step has run: their time, and the first token's
        self.last_iteration_stats = core_outputs.iteration_stats
        for out in core_outputs.outputs:
            if self._warmups.is_warmup(out.req_id):
                if out.finish_reason is not None:
                    for request in self._warmups.finished(out.req_id):
                        self.core.add_request(request)
                continue
            parent_id, index = self._child_to_parent[out.req_id]
            parent = self._parents[parent_id]
            self._apply(parent, parent.sequences[index], out, now)
            touched[parent_id] = parent
            if parent.sequences[index].finish_reason is not None:
                del self._child_to_parent[out.req_id]
        results = []
        for parent_id, parent in touched.items():
            results.append(self._make_output(parent))
            if parent.finished:
                del self._parents[parent_id]
                if parent_id in self._pending_pins:  # its blocks are cached and free: hold them before any step
                    self.core.pin_prefix(parent_id, self._pending_pins.pop(parent_id)[0])
        return results

    def _apply(self, parent: _Parent, seq: _Sequence, out: EngineCoreOutput, now: float) -> None:
        if parent.first_token_time is None:
            parent.first_token_time = now
            parent.num_cached_tokens = out.num_cached_tokens
            parent.first_scheduled_time, parent.kv_load_s = out.first_scheduled_time, out.kv_load_s
        if out.kv_transfer_params is not None:
            parent.kv_transfer_params = out.kv_transfer_params
        if out.prompt_logprobs is not None and not parent.has_prompt_logprobs:
            parent.has_prompt_logprobs = True
            parent.new_prompt_logprobs = self._prompt_logprob_list(parent.prompt_token_ids, out.prompt_logprobs)
        stop, num_used = seq.detokenizer.update(out.new_token_ids)
        # Tokens after the one that completed a stop string are not part of the output.
        seq.new_token_ids.extend(out.new_token_ids[:num_used])
        seq.new_logprobs.extend(out.logprobs[:num_used])
        seq.cumulative_logprob += sum(lp.sampled_logprob for lp in out.logprobs[:num_used])
        if stop is not None:
            seq.finish_reason, seq.stop_reason = "stop", stop
            if out.finish_reason is None:
                self.core.finish_requests([out.req_id])
        elif out.finish_reason is not None:
            seq.finish_reason, seq.stop_reason = out.finish_reason, out.stop_reason

    def _make_output(self, parent: _Parent) -> RequestOutput:
        """The request's delta: what each completion gained since its last output (see ``RequestOutput.add``)."""
        completions = [self._delta(s, parent.params.logprobs is not None) for s in parent.sequences]
        metrics = {"arrival_time": parent.arrival_time, "first_token_time": parent.first_token_time or 0.0,
                   "first_scheduled_time": parent.first_scheduled_time or 0.0, "kv_transfer_time": parent.kv_load_s}
        output = RequestOutput(parent.request_id, parent.prompt, parent.prompt_token_ids, completions,
                               parent.finished, parent.num_cached_tokens, metrics, parent.new_prompt_logprobs,
                               parent.kv_transfer_params)
        parent.new_prompt_logprobs = parent.kv_transfer_params = None
        return output

    def _prompt_logprob_list(self, prompt_token_ids: list[int], scores: PromptLogprobsLists) -> PromptLogprobs:
        """The core's per-position lists as vLLM's shape: None, then {token id: Logprob} per later position."""
        texts: dict[int, str] = {}

        def entry(token_id: int, logprob: float, rank: int) -> Logprob:
            if token_id not in texts:
                texts[token_id] = self.tokenizer.decode([token_id], skip_special_tokens=False)
            return Logprob(logprob, rank, texts[token_id])

        result: PromptLogprobs = [None]
        for i, token_id in enumerate(prompt_token_ids[1:]):
            position = {token_id: entry(token_id, scores.logprobs[i], scores.ranks[i])}
            for rank, (top_id, top_logprob) in enumerate(zip(scores.top_token_ids[i], scores.top_logprobs[i]), 1):
                if top_id not in position:
                    position[top_id] = entry(top_id, top_logprob, rank)
            result.append(position)
        return result

    @staticmethod
    def _delta(seq: _Sequence, want_logprobs: bool) -> CompletionOutput:
        text = seq.detokenizer.text
        offset = min(seq.num_text_sent, len(text))  # a stop string found now may cut into sent text
        delta = CompletionOutput(seq.index, text[offset:], seq.new_token_ids,
                                 seq.cumulative_logprob if want_logprobs else None,
                                 seq.new_logprobs if want_logprobs else None, seq.finish_reason, seq.stop_reason,
                                 text_offset=offset)
        seq.new_token_ids, seq.new_logprobs, seq.num_text_sent = [], [], len(text)
        return delta


def _wrap_int64(value: int) -> int:
    return (value + 2**63) % 2**64 - 2**63
