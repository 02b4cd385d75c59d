"""ModelRunner: owns the model weights and the physical KV cache, and runs one scheduled step."""
from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path

import numpy as np
import torch

from jido.attention.backend import build_step_metadata
from jido.attention.kv_quant import SCALE_BYTES, is_quantized, resolve_kv_cache_dtype
from jido.attention.registry import default_attention_backend, get_attention_backend
from jido.config import EngineConfig
from jido.core.kv_cache_spec import FullAttentionSpec, KVCacheConfig, KVCacheSpec, SlidingWindowSpec
from jido.core.outputs import ModelRunnerOutput, SchedulerOutput
from jido.kvtransfer.base import KVConnectorWorker, kv_fingerprint
from jido.kvtransfer.factory import connector_name, make_worker_connector
from jido.kvtransfer.layerwise import LayerwiseHooks
from jido.models.config import ModelArchConfig
from jido.models.loader import gguf_source, load_config
from jido.models.tokenizer import Tokenizer
from jido.parallel.state import ModelParallel, layer_range, local_kv_heads
from jido.runner.cache_blend import CacheBlender
from jido.runner.cuda_graphs import DecodeGraphs
from jido.runner.input_batch import InputBatch, ModelInputs
from jido.runner.model_loading import (check_batch_invariant, load_model, mib_text, resolve_device, resolve_dtype,
                                       resolve_quantization, weight_bytes)
from jido.runner import smoothing
from jido.runner.prompt_logprobs import PromptLogprobsCollector
from jido.runner.spec_decode import ProposerContext, SpecDecoder, make_proposer
from jido.sampling.metadata import SamplingMetadata, with_grammar
from jido.sampling.rejection_sampler import VerifiedTokens
from jido.sampling.sampler import Sampler, argmax_under_grammar
from jido.utils.cpu import cpu_info
from jido.utils.host_memory import StepWorkspace
from jido.utils.huge_pages import zeros_in_huge_pages

logger = logging.getLogger("jido")

def layer_kv_specs(arch: ModelArchConfig, block_size: int, kv_cache_dtype: torch.dtype,
                   num_kv_heads: int | None = None, layer_ids: range | None = None) -> dict[int, KVCacheSpec]:
    """The KV spec of each attention layer in ``layer_ids`` (default: all) holding ``num_kv_heads`` (default:
    all; fewer on a tensor-parallel rank), by layer index: full context, or a sliding window."""
    sizes = dict(dtype_bytes=kv_cache_dtype.itemsize, scale_bytes=SCALE_BYTES if is_quantized(kv_cache_dtype) else 0)
    heads = arch.num_kv_heads if num_kv_heads is None else num_kv_heads
    specs: dict[int, KVCacheSpec] = {}
    for layer_id in range(arch.num_layers) if layer_ids is None else layer_ids:
        window = arch.sliding_windows[layer_id]
        if window is None:
            specs[layer_id] = FullAttentionSpec(block_size, heads, arch.head_dim, **sizes)
        else:
            specs[layer_id] = SlidingWindowSpec(block_size, heads, arch.head_dim, **sizes, sliding_window=window)
    return specs


class ModelRunner:
    """Loads a model onto one device and executes :class:`SchedulerOutput` steps on it.

    Under tensor or pipeline parallelism (``parallel``) it holds this rank's shard: its layers, its heads
    and its slice of every weight, and KV cache tensors for its layers and KV heads only.
    """

    def __init__(self, config: EngineConfig, model_folder: Path, parallel: ModelParallel | None = None) -> None:
        self.config = config
        self.parallel = parallel or ModelParallel.single()
        self.device = resolve_device(config.device_config.device)
        self.dtype = resolve_dtype(config.model_config.dtype, self.device)
        if self.device.type == "cpu":
            logger.info("CPU: %s; computing in %s", cpu_info().describe(), str(self.dtype).removeprefix("torch."))
        self.model_folder = Path(model_folder)
        self.model_arch = ModelArchConfig.from_hf_config(load_config(self.model_folder))
        self.block_size = config.cache_config.block_size
        if config.model_config.batch_invariant:
            check_batch_invariant(self.device, self.model_arch)
        self.attn_backend = get_attention_backend(config.model_config.attention_backend
                                                  or default_attention_backend(self.device.type),
                                                  config.model_config.batch_invariant)
        self.quantization = resolve_quantization(config.model_config.quantization, self.device,
                                                 gguf_source(self.model_folder) is not None)
        self.kv_cache_dtype = resolve_kv_cache_dtype(config.cache_config.kv_cache_dtype, self.dtype)
        # With a KV connector the model's attention calls its per-layer hooks (bound once the cache exists).
        self.layer_hooks = LayerwiseHooks(self.attn_backend, None) if connector_name(config) else None
        self.kv_connector: KVConnectorWorker | None = None
        self.num_kv_heads = local_kv_heads(self.model_arch.num_kv_heads, self.parallel.tp.world_size)
        self.layer_ids = range(*layer_range(self.model_arch.num_layers, self.parallel.pp))
        self.model = self._load_model()
        self.sampler = Sampler(config.model_config.seed, self.device)
        self.prompt_logprobs = PromptLogprobsCollector(self.model.compute_logits, self.model_arch.vocab_size,
                                                       self.device)
        self.kv_caches: list[torch.Tensor] = []
        self.layer_groups: list[int] = []
        self.input_batch: InputBatch | None = None
        spec = config.speculative_config
        self.spec_decoder = None
        if spec is not None:
            context = ProposerContext(self.model, self.model_arch, self.attn_backend, self.device, self.dtype,
                                      self.kv_cache_dtype, self.block_size, self.sampler,
                                      config.model_config.quantization_group_size, self.quantization)
            self.spec_decoder = SpecDecoder(spec, self.sampler, make_proposer(spec, context))
        self.blender: CacheBlender | None = None
        self.decode_graphs: DecodeGraphs | None = None

    def _load_model(self) -> torch.nn.Module:
        model = load_model(self.model_folder, self.model_arch, self.layer_hooks or self.attn_backend, self.device,
                           self.dtype, self.quantization, self.config.model_config.quantization_group_size,
                           self.parallel, self.config.model_config.weights_memory,
                           self.config.cache_config.kv_cache_bytes + self.step_workspace().bytes,
                           self.config.model_config.batch_invariant)
        if self.parallel.world_size > 1:
            logger.info("rank %d holds %s of weights: layers %d-%d of %d, %d of %d query heads and %d of %d KV heads "
                        "per layer", self.parallel.rank, mib_text(weight_bytes(model)), self.layer_ids.start,
                        self.layer_ids.stop - 1, self.model_arch.num_layers,
                        self.model_arch.num_heads // self.parallel.tp.world_size, self.model_arch.num_heads,
                        self.num_kv_heads, self.model_arch.num_kv_heads)
        return model

    def step_workspace(self) -> StepWorkspace:
        """What a step of this engine's largest size allocates beside the weights and the KV cache."""
        arch, sched = self.model_arch, self.config.scheduler_config
        return StepWorkspace(sched.max_num_seqs, sched.max_num_batched_tokens, arch.vocab_size, arch.hidden_size,
                             arch.intermediate_size)

    def get_kv_cache_spec(self) -> dict[int, KVCacheSpec]:
        """What each of this stage's attention layers keeps per token (its KV heads): full context, or a window;
        a draft model's layers follow the target's."""
        specs = layer_kv_specs(self.model_arch, self.block_size, self.kv_cache_dtype, self.num_kv_heads,
                               self.layer_ids)
        if self.spec_decoder is not None:
            specs.update(self.spec_decoder.kv_cache_spec(self.model_arch.num_layers))
        return specs

    def initialize_kv_cache(self, kv_cache_config: KVCacheConfig) -> None:
        """Allocate the cache tensors (one per layer slot of a group this stage uses) and the persistent input batch."""
        arch = self.model_arch
        shape = self.attn_backend.get_kv_cache_shape(kv_cache_config.num_blocks, self.block_size,
                                                     self.num_kv_heads, arch.head_dim, self.kv_cache_dtype)
        # Zeros, not empty: padded lanes of batched attention multiply unused slots by zero weights,
        # and 0 * NaN from uninitialised memory would poison the result.
        # On CPU in huge pages, as the weights: attention streams the cache (jido/utils/huge_pages.py).
        tensors = {index: zeros_in_huge_pages(shape, self.kv_cache_dtype) if self.device.type == "cpu"
                   else torch.zeros(shape, dtype=self.kv_cache_dtype, device=self.device)
                   for index in sorted({kv_cache_config.tensor_index(i) for i in self.layer_ids})}
        layers = range(arch.num_layers)
        self.kv_caches = [tensors[kv_cache_config.tensor_index(i)] if i in self.layer_ids else None for i in layers]
        self.layer_groups = [kv_cache_config.group_index(i) for i in layers]
        self.num_kv_groups = len(kv_cache_config.groups)
        self._smooth_quantized_layers(kv_cache_config.num_blocks)
        if self.parallel.world_size > 1:
            logger.info("rank %d holds %s of KV cache (%d tensors of %d blocks, %d of %d KV heads)",
                        self.parallel.rank, mib_text(sum(t.numel() * t.element_size() for t in tensors.values())),
                        len(tensors), kv_cache_config.num_blocks, self.num_kv_heads, arch.num_kv_heads)
        if self.spec_decoder is not None:
            self.spec_decoder.bind_kv_cache(kv_cache_config, tensors, self.kv_caches, self.layer_groups)
        if self.parallel.world_size == 1:  # the engine refuses kv_blend with several workers (a stage lacks layers)
            self.blender = CacheBlender(self.model, self.attn_backend, self.kv_caches, self.layer_groups,
                                        self.block_size, self.attn_backend.block_token_dim,
                                        self.config.cache_config.kv_blend_check_layer,
                                        self.layer_hooks.begin_step if self.layer_hooks is not None else None)
        self.input_batch = InputBatch(self.config.scheduler_config.max_num_seqs, len(kv_cache_config.groups),
                                      self.block_size, arch.vocab_size, self.device)
        self.fingerprint = self._kv_fingerprint(kv_cache_config)
        fingerprints = {"kv": self.fingerprint, "model": self._model_fingerprint(kv_cache_config)}
        self.kv_connector = make_worker_connector(self.config, fingerprints, arch.num_layers, self.kv_cache_dtype)
        if self.kv_connector is not None:
            self.kv_connector.register_kv_caches(self.kv_caches, kv_cache_config, self.attn_backend.block_token_dim)
            self.layer_hooks.connector = self.kv_connector

    def _smooth_quantized_layers(self, num_blocks: int) -> None:
        """Calibrate w8a8's smoothing (:mod:`jido.runner.smoothing`) once the cache exists: a few chunks of text
        through the model, written to the cache's first blocks (nothing is allocated yet; they are written again
        before any request reads them). Not under pipeline parallelism, whose stages cannot run a forward alone:
        there the layers stay unsmoothed, with a warning."""
        pending = smoothing.pending_layers(self.model)
        if not pending:
            return
        if self.parallel.pp.world_size > 1:
            smoothing.discard(self.model)
            logger.warning("w8a8 under pipeline parallelism: activations rounded per token without smoothing "
                           "(a calibration forward needs every stage)")
            return
        start = time.perf_counter()
        chunks = smoothing.calibration_chunks(Tokenizer.from_folder(self.model_folder), self.model_arch.vocab_size,
                                              num_blocks * self.block_size)

        def forward(chunk: list[int]) -> None:
            ids, positions, metadata = smoothing.chunk_forward_inputs(chunk, self.block_size, self.device)
            groups = [metadata] * self.num_kv_groups
            with torch.inference_mode():
                self.model(ids, positions, self.kv_caches, build_step_metadata(self.attn_backend, groups,
                                                                               self.layer_groups))

        # NOTE: the new codes and packings stay in ordinary pages. Moving them into huge pages as load_model does took
        # several times as long as the calibration itself.
        smoothed = smoothing.calibrate(self.model, forward, chunks)
        logger.info("w8a8: smoothed %d of %d linears (SmoothQuant, alpha %.2f) on %d tokens in %.1f s", len(smoothed),
                    len(pending), smoothing.ALPHA, sum(map(len, chunks)), time.perf_counter() - start)

    def capture_model(self, max_model_len: int) -> None:
        """Capture decode steps in CUDA graphs where they can run (vLLM's name), once the KV cache exists.

        Only on CUDA, with a backend that supports them, on one worker, without speculative decoding (verify steps
        are not one token a request) or a KV connector (its per-layer hooks run Python between layers), and not
        under ``enforce_eager``.
        """
        if (self.device.type != "cuda" or self.config.model_config.enforce_eager
                or not self.attn_backend.supports_cuda_graphs or self.spec_decoder is not None
                or self.layer_hooks is not None or self.parallel.world_size > 1):
            return
        graphs = DecodeGraphs(self.model, self.attn_backend, self.kv_caches, self.layer_groups, self.num_kv_groups,
                              self.config.scheduler_config.max_num_seqs, max_model_len, self.block_size, self.device)
        try:
            with torch.inference_mode():
                graphs.capture()
        except RuntimeError as exc:  # a kernel or op that cannot be captured: serve eager rather than not at all
            logger.warning("CUDA graph capture failed (%s); decode steps run eager", exc)
            return
        self.decode_graphs = graphs

    def _kv_fingerprint(self, kv_cache_config: KVCacheConfig) -> str:
        """What another engine must match to reuse this one's stored KV blocks (see ``kv_fingerprint``)."""
        config_text = (self.model_folder / "config.json").read_text(encoding="utf-8")
        return kv_fingerprint({"model": self.model_folder.name, "config": config_text,
                               "quantization": self.quantization, "dtype": str(self.dtype),
                               "kv_cache_dtype": str(self.kv_cache_dtype), "layout": self.attn_backend.name,
                               "block_size": self.block_size,
                               "groups": [g.layer_ids for g in kv_cache_config.groups]})

    def take_expert_load(self) -> list[int]:
        """A mixture-of-experts model's routed pairs per expert-parallel rank since the last call ([] if dense)."""
        take = getattr(self.model, "take_expert_load", None)
        return take() if take is not None else []

    def _model_fingerprint(self, kv_cache_config: KVCacheConfig) -> str:
        """What another engine must match to load this one's KV in its own dtype and layout: the model (config and
        weight files), block size and layer groups; dtype, KV dtype, quantization and backend may differ."""
        folder = self.model_folder
        weights = [(p.name, p.stat().st_size) for p in sorted(folder.glob("*.safetensors"))]
        return kv_fingerprint({"config": (folder / "config.json").read_text(encoding="utf-8"), "weights": weights,
                               "block_size": self.block_size, "groups": [g.layer_ids for g in kv_cache_config.groups]})

    def kv_connector_info(self) -> dict:
        """The KV fingerprint and what the connector's worker half reports (its endpoint, its KV format)."""
        info = self.kv_connector.info() if self.kv_connector is not None else {}
        return {"fingerprint": self.fingerprint, **info}

    @torch.inference_mode()
    def execute_model(self, sched: SchedulerOutput) -> ModelRunnerOutput:
        connector = self.kv_connector
        if connector is None:
            return self._execute(sched)
        connector.bind_connector_metadata(sched.kv_connector_metadata)
        connector.start_load_kv()  # NOTE: before the forward writes blocks evicted this step
        self.layer_hooks.begin_step()
        output = self._execute(sched)
        connector.wait_for_save()
        output.kv_connector_output = connector.get_finished(idle=sched.is_empty)
        return output

    def shutdown(self) -> None:
        if self.kv_connector is not None:
            self.kv_connector.shutdown()

    def _execute(self, sched: SchedulerOutput) -> ModelRunnerOutput:
        begin = time.perf_counter()
        batch = self.input_batch
        batch.update(sched)
        self.prompt_logprobs.update(sched)
        if self.spec_decoder is not None:
            self.spec_decoder.update(sched)
        if sched.is_empty:
            return ModelRunnerOutput({})
        if sched.kv_blend_plans:  # CacheBlend prefills change their tokens between layers: not one flat batch
            return self._execute_with_blends(sched, begin)
        inputs, hidden, start = self._forward(sched)
        prompt_logprobs = self.prompt_logprobs.collect(sched, hidden)  # only ever due in a sampling step
        verified = VerifiedTokens([], [])
        model_done = time.perf_counter()
        if inputs.sampled_req_ids:  # else only prefill chunks that have not reached their prompts' ends
            rows = hidden[inputs.logits_indices]
            metadata = with_grammar(self._row_metadata(inputs), inputs.sampled_req_ids, sched.grammar_bitmask,
                                    [len(d) + 1 for d in inputs.draft_token_ids] if inputs.draft_token_ids else None)
            verified = self._greedy_tokens(rows, inputs, metadata)
            logits = None if verified is not None else self.model.compute_logits(rows)
            model_done = time.perf_counter()  # the LM head, kernel or logits, is the model's time
            if logits is not None:
                verified = self._sample(logits, inputs, metadata)
            batch.append_sampled(inputs.sampled_rows, verified.token_ids)
        sample_done = time.perf_counter()
        spec_token_ids = {}
        if self.spec_decoder is not None:  # a draft model computes prefill chunks too, to hold their KV
            spec_token_ids = self.spec_decoder.propose(sched, inputs, batch, hidden, verified, model_done - start)
        req_ids = inputs.sampled_req_ids
        return ModelRunnerOutput(
            dict(zip(req_ids, verified.token_ids)), {r: lps for r, lps in zip(req_ids, verified.logprobs) if lps},
            prompt_logprobs, spec_token_ids=spec_token_ids, prepare_time_s=start - begin,
            model_time_s=model_done - start,
            sample_time_s=sample_done - model_done, propose_time_s=time.perf_counter() - sample_done,
            expert_load=self.take_expert_load())

    def _forward(self, sched: SchedulerOutput) -> tuple[ModelInputs, torch.Tensor, float]:
        """The step's flat batch and its hidden states, from a CUDA graph where one runs the step; and when the
        model's part of the step began."""
        graphs, batch = self.decode_graphs, self.input_batch
        if graphs is not None and graphs.takes(list(sched.num_scheduled_tokens.values())):
            inputs = batch.prepare_inputs(sched, torch.device("cpu"))  # the graphs send it in two copies
            start = time.perf_counter()
            hidden, logits_indices = graphs.run(inputs)
            return dataclasses.replace(inputs, logits_indices=logits_indices), hidden, start
        inputs = batch.prepare_inputs(sched)
        attn_metadata = build_step_metadata(self.attn_backend, inputs.group_metadata, self.layer_groups)
        start = time.perf_counter()
        return inputs, self.model(inputs.input_ids, inputs.positions, self.kv_caches, attn_metadata), start

    def _execute_with_blends(self, sched: SchedulerOutput, begin: float) -> ModelRunnerOutput:
        """A step with CacheBlend prefills: the other requests as one flat forward, then each blend on its own.

        The engine refuses kv_blend with speculative decoding and with several workers, so this step only samples.
        """
        batch = self.input_batch
        rest = {r: n for r, n in sched.num_scheduled_tokens.items() if r not in sched.kv_blend_plans}
        flat = dataclasses.replace(sched, num_scheduled_tokens=rest, total_num_scheduled_tokens=sum(rest.values()))
        hidden_rows, req_ids, rows, prompt_logprobs = [], [], [], {}
        start = time.perf_counter()
        if rest:
            inputs = batch.prepare_inputs(flat)
            attn_metadata = build_step_metadata(self.attn_backend, inputs.group_metadata, self.layer_groups)
            start = time.perf_counter()
            hidden = self.model(inputs.input_ids, inputs.positions, self.kv_caches, attn_metadata)
            prompt_logprobs = self.prompt_logprobs.collect(flat, hidden)  # only ever due in a sampling step
            hidden_rows.append(hidden[inputs.logits_indices])
            req_ids += inputs.sampled_req_ids
            rows += inputs.sampled_rows.tolist()
        for req_id, plan in sched.kv_blend_plans.items():
            hidden_rows.append(self.blender.prefill(plan, *batch.request_view(req_id)))
            req_ids.append(req_id)
            rows.append(batch.req_index[req_id])
        logits = self.model.compute_logits(torch.cat(hidden_rows))
        model_done = time.perf_counter()
        metadata = with_grammar(batch.sampling.metadata(rows), req_ids, sched.grammar_bitmask)
        token_ids, logprobs = self.sampler.sample(logits, metadata)
        batch.append_sampled(np.asarray(rows, dtype=np.int64), [[t] for t in token_ids])
        return ModelRunnerOutput(
            {r: [t] for r, t in zip(req_ids, token_ids)},
            {r: [lp] for r, lp in zip(req_ids, logprobs) if lp is not None}, prompt_logprobs,
            prepare_time_s=start - begin, model_time_s=model_done - start,
            sample_time_s=time.perf_counter() - model_done)

    def _row_metadata(self, inputs: ModelInputs) -> SamplingMetadata:
        """The sampling settings of the rows at ``inputs.logits_indices`` (with speculation, one row per proposal
        verified and one more per request)."""
        if self.spec_decoder is not None:
            return self.spec_decoder.metadata(inputs, self.input_batch)
        return self.input_batch.sampling.metadata(inputs.sampled_rows.tolist())

    def _greedy_tokens(self, hidden: torch.Tensor, inputs: ModelInputs,
                       metadata: SamplingMetadata) -> VerifiedTokens | None:
        """Each sampled request's new tokens from the rows' argmax straight from the LM head's kernel (the rows'
        final hidden states), where every row needs only that (``argmax_only``) and the model gives it; else None.
        With speculation, a step verifying K proposals then reads the head once for its K + 1 rows, as a plain step
        does for its one, and makes no [K + 1, vocab] logits. Under grammars, the kernel skips the columns each row's
        mask bans; where it takes no masks, only the rows whose argmax a grammar bans make logits."""
        token_ids = self._argmax_token_ids(hidden, metadata)
        if token_ids is None:
            return None
        if self.spec_decoder is not None:
            return self.spec_decoder.verify_argmax(token_ids, inputs)
        ids = token_ids.tolist()
        return VerifiedTokens([[t] for t in ids], [[] for _ in ids])

    def _argmax_token_ids(self, hidden: torch.Tensor, metadata: SamplingMetadata) -> torch.Tensor | None:
        if metadata.argmax_only:
            return self.model.greedy_token_ids(hidden)
        if not metadata.argmax_under_grammar:
            return None
        # Masks in the head's one pass; else the plain argmax, and logits (a second pass) for the rows it got wrong.
        token_ids = self.model.greedy_token_ids(hidden, allowed=metadata.row_bitmasks(hidden.shape[0]))
        if token_ids is not None:
            return token_ids
        token_ids = self.model.greedy_token_ids(hidden)
        if token_ids is None:
            return None
        return argmax_under_grammar(token_ids, metadata, lambda rows: self.model.compute_logits(hidden[rows]))

    def _sample(self, logits: torch.Tensor, inputs: ModelInputs, metadata: SamplingMetadata) -> VerifiedTokens:
        """Each sampled request's new tokens: one drawn by the sampler (with the rows' ``metadata``), or its verified
        proposals and one more."""
        if self.spec_decoder is not None:
            return self.spec_decoder.verify(logits, inputs, metadata)
        token_ids, logprobs = self.sampler.sample(logits, metadata)
        return VerifiedTokens([[t] for t in token_ids], [[] if lp is None else [lp] for lp in logprobs])
