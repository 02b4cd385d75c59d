"""PipelineModelRunner: one pipeline stage; a step's requests pass through the stages in micro-batches."""
from __future__ import annotations

import dataclasses
import time

import numpy as np
import torch

from jido.attention.backend import build_step_metadata
from jido.core.outputs import Logprobs, ModelRunnerOutput, PromptLogprobsLists, SchedulerOutput
from jido.runner.input_batch import ModelInputs
from jido.runner.model_runner import ModelRunner
from jido.sampling.metadata import with_grammar


def split_micro_batches(sched: SchedulerOutput, num_micro_batches: int) -> list[SchedulerOutput]:
    """The step's requests in at most ``num_micro_batches`` consecutive groups of about equal token counts.

    Each part keeps the step's request data (new requests in full, cached ones as diffs) and only its own
    ``num_scheduled_tokens``; a request is never split, so one long prompt is one micro-batch.
    """
    items = list(sched.num_scheduled_tokens.items())
    num_parts = min(num_micro_batches, len(items))
    parts: list[dict[str, int]] = []
    current: dict[str, int] = {}
    done = 0
    for index, (req_id, num_tokens) in enumerate(items):
        current[req_id] = num_tokens
        done += num_tokens
        parts_left, items_left = num_parts - len(parts) - 1, len(items) - index - 1
        due = done >= sched.total_num_scheduled_tokens * (len(parts) + 1) / num_parts
        if parts_left and (due or items_left == parts_left):
            parts.append(current)
            current = {}
    parts.append(current)
    spec = sched.scheduled_spec_decode_tokens
    return [dataclasses.replace(sched, num_scheduled_tokens=part, total_num_scheduled_tokens=sum(part.values()),
                                scheduled_spec_decode_tokens={r: spec[r] for r in part if r in spec})
            for part in parts]


class PipelineModelRunner(ModelRunner):
    """A pipeline stage's runner: receive hidden states, run its layers, send them on (the last stage samples).

    Micro-batch ``i`` leaves a stage as soon as it is computed (a non-blocking send), so the stage computes
    ``i + 1`` while the next stage computes ``i``: with ``p`` stages and ``m`` micro-batches a stage idles
    ``(p - 1) / (m + p - 1)`` of a step in the ideal. The last stage then broadcasts the sampled tokens so
    that every stage's input batch appends the same ones. ``busy_s`` counts this stage's compute seconds.
    """

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.pp = self.parallel.pp
        self.num_micro_batches = self.config.parallel_config.num_micro_batches
        self.busy_s = 0.0

    @torch.inference_mode()
    def execute_model(self, sched: SchedulerOutput) -> ModelRunnerOutput:
        begin = time.perf_counter()
        batch = self.input_batch
        batch.update(sched)
        self.prompt_logprobs.update(sched)
        if sched.is_empty:
            return ModelRunnerOutput({})
        sampled: dict[str, int] = {}
        logprobs: dict[str, list[Logprobs]] = {}
        prompt_logprobs: dict[str, PromptLogprobsLists] = {}
        pending_sends = []
        for micro in split_micro_batches(sched, self.num_micro_batches):
            inputs, hidden = self._run_micro_batch(micro)
            if not self.pp.is_last:
                pending_sends.append((self.pp.send(hidden, self.pp.rank_in_group + 1), hidden))
            else:
                self._sample(micro, inputs, hidden, sampled, logprobs, prompt_logprobs)
        for work, _ in pending_sends:
            work.wait()
        sampled = self.pp.broadcast_object(sampled, src=self.pp.world_size - 1)
        if sampled:
            rows = np.fromiter((batch.req_index[r] for r in sampled), dtype=np.int64, count=len(sampled))
            batch.append_sampled(rows, [[t] for t in sampled.values()])
        # The stages' times overlap: the step's whole time counts as model time.
        return ModelRunnerOutput({r: [t] for r, t in sampled.items()}, logprobs, prompt_logprobs,
                                 model_time_s=time.perf_counter() - begin, expert_load=self.take_expert_load())

    def _run_micro_batch(self, micro: SchedulerOutput) -> tuple[ModelInputs, torch.Tensor]:
        inputs = self.input_batch.prepare_inputs(micro)
        attn_metadata = build_step_metadata(self.attn_backend, inputs.group_metadata, self.layer_groups)
        hidden = None
        if not self.pp.is_first:
            shape = (inputs.input_ids.shape[0], self.model_arch.hidden_size)
            hidden = self.pp.recv(shape, self.dtype, self.pp.rank_in_group - 1, self.device)
        start = time.perf_counter()
        hidden = self.model(inputs.input_ids, inputs.positions, self.kv_caches, attn_metadata, hidden)
        self.busy_s += time.perf_counter() - start
        return inputs, hidden

    def _sample(self, micro: SchedulerOutput, inputs: ModelInputs, hidden: torch.Tensor, sampled: dict[str, int],
                logprobs: dict[str, list[Logprobs]], prompt_logprobs: dict[str, PromptLogprobsLists]) -> None:
        """Sample the micro-batch's finished requests (the last stage only); results into the step's dicts."""
        start = time.perf_counter()
        prompt_logprobs.update(self.prompt_logprobs.collect(micro, hidden))
        if inputs.sampled_req_ids:
            logits = self.model.compute_logits(hidden[inputs.logits_indices])
            metadata = with_grammar(self.input_batch.sampling.metadata(inputs.sampled_rows.tolist()),
                                    inputs.sampled_req_ids, micro.grammar_bitmask)
            token_ids, row_logprobs = self.sampler.sample(logits, metadata)
            sampled.update(zip(inputs.sampled_req_ids, token_ids))
            logprobs.update((r, [lp]) for r, lp in zip(inputs.sampled_req_ids, row_logprobs) if lp is not None)
        self.busy_s += time.perf_counter() - start
