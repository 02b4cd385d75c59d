"""ModelRunner: owns the model weights and the physical KV cache, and runs one scheduled step."""
from __future__ import annotations

import logging
import time
from pathlib import Path

import torch

from jido.attention.backend import AttentionBackend, build_step_metadata
from jido.attention.kv_quant import SCALE_BYTES, is_quantized, resolve_kv_cache_dtype
from jido.attention.registry import default_attention_backend, get_attention_backend
from jido.config import EngineConfig
from jido.core.kv_cache_spec import FullAttentionSpec, KVCacheConfig, KVCacheSpec, SlidingWindowSpec
from jido.core.outputs import ModelRunnerOutput, SchedulerOutput
from jido.layers.parameter import default_device_and_dtype
from jido.layers.quantization import get_quantization_config, process_weights_after_loading
from jido.models.config import ModelArchConfig
from jido.models.loader import gguf_source, iter_quantized_weights, iter_weights, load_config
from jido.models.registry import get_model_class
from jido.runner.input_batch import InputBatch, ModelInputs
from jido.runner.prompt_logprobs import PromptLogprobsCollector
from jido.runner.spec_decode import ProposerContext, SpecDecoder, make_proposer
from jido.sampling.rejection_sampler import VerifiedTokens
from jido.sampling.sampler import Sampler
from jido.utils.cpu import CpuInfo, cpu_info

logger = logging.getLogger("jido")

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(device: str | None) -> torch.device:
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} was asked for but no CUDA device is present; use device='cpu'")
    return torch.device(device)


def resolve_dtype(dtype: str, device: torch.device, cpu: CpuInfo | None = None) -> torch.dtype:
    """``auto``: bfloat16 on CUDA and on CPUs that compute it natively (AVX-512 BF16 or AMX), else float32.

    Where bf16 is emulated (AVX2 + FMA only) a bf16 matmul is hundreds of times slower than float32
    (measured: 59 s against 0.1 s for 2048^2), so float32 is the fast choice there.
    """
    if dtype != "auto":
        return _DTYPES[dtype]
    if device.type != "cpu":
        return torch.bfloat16
    return torch.bfloat16 if (cpu or cpu_info()).has_native_bf16 else torch.float32


def resolve_quantization(quantization: str | None, device: torch.device, from_gguf: bool) -> str:
    """The scheme to load with: as asked, else ``gguf`` for a GGUF model on CPU and ``none`` otherwise.

    The GGUF kernels are CPU kernels; on CUDA a GGUF model is dequantized to dtype unless asked otherwise.

    Raises:
        ValueError: ``gguf`` asked for a model that is not a GGUF file.
    """
    if quantization == "gguf" and not from_gguf:
        raise ValueError("quantization 'gguf' needs a .gguf model; for other checkpoints use int8, int4 or none")
    if quantization is not None:
        return quantization
    return "gguf" if from_gguf and device.type == "cpu" else "none"


def layer_kv_specs(arch: ModelArchConfig, block_size: int, kv_cache_dtype: torch.dtype) -> dict[int, KVCacheSpec]:
    """Each attention layer's KV spec by layer index: full context, or a sliding window."""
    sizes = dict(dtype_bytes=kv_cache_dtype.itemsize, scale_bytes=SCALE_BYTES if is_quantized(kv_cache_dtype) else 0)
    specs: dict[int, KVCacheSpec] = {}
    for layer_id, window in enumerate(arch.sliding_windows):
        if window is None:
            specs[layer_id] = FullAttentionSpec(block_size, arch.num_kv_heads, arch.head_dim, **sizes)
        else:
            specs[layer_id] = SlidingWindowSpec(block_size, arch.num_kv_heads, arch.head_dim, **sizes,
                                                sliding_window=window)
    return specs


def load_model(folder: Path, arch: ModelArchConfig, attn_backend: AttentionBackend, device: torch.device,
               dtype: torch.dtype, quantization: str, quantization_group_size: int | None) -> torch.nn.Module:
    """A model built on ``device`` in ``dtype`` from its checkpoint folder, weights processed, in eval mode."""
    start = time.perf_counter()
    model_class = get_model_class(arch.architecture)
    quant_config = get_quantization_config(quantization, quantization_group_size)
    # Built on its device in its dtype: no float32 (or CPU) copy of the whole model is ever made.
    with default_device_and_dtype(device, dtype):
        model = model_class(arch, attn_backend, quant_config)
    model.load_weights(iter_quantized_weights(folder) if quantization == "gguf" else iter_weights(folder))
    process_weights_after_loading(model)
    model.eval()
    logger.info("loaded %s (%s, %s, quantization %s) in %.1f s", folder.name, device, dtype, quantization,
                time.perf_counter() - start)
    return model


class ModelRunner:
    """Loads a model onto one device and executes :class:`SchedulerOutput` steps on it."""

    def __init__(self, config: EngineConfig, model_folder: Path) -> None:
        self.config = config
        self.device = resolve_device(config.device_config.device)
        self.dtype = resolve_dtype(config.model_config.dtype, self.device)
        if self.device.type == "cpu":
            logger.info("CPU: %s; computing in %s", cpu_info().describe(), str(self.dtype).removeprefix("torch."))
        self.model_folder = Path(model_folder)
        self.model_arch = ModelArchConfig.from_hf_config(load_config(self.model_folder))
        self.block_size = config.cache_config.block_size
        self.attn_backend = get_attention_backend(config.model_config.attention_backend
                                                  or default_attention_backend(self.device.type))
        self.quantization = resolve_quantization(config.model_config.quantization, self.device,
                                                 gguf_source(self.model_folder) is not None)
        self.kv_cache_dtype = resolve_kv_cache_dtype(config.cache_config.kv_cache_dtype, self.dtype)
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
                                      config.model_config.quantization_group_size)
            self.spec_decoder = SpecDecoder(spec, self.sampler, make_proposer(spec, context))

    def _load_model(self) -> torch.nn.Module:
        return load_model(self.model_folder, self.model_arch, self.attn_backend, self.device, self.dtype,
                          self.quantization, self.config.model_config.quantization_group_size)

    def get_kv_cache_spec(self) -> dict[int, KVCacheSpec]:
        """What each attention layer keeps per token (full context, or a sliding window); a draft model's
        layers follow the target's."""
        specs = layer_kv_specs(self.model_arch, self.block_size, self.kv_cache_dtype)
        if self.spec_decoder is not None:
            specs.update(self.spec_decoder.kv_cache_spec(len(specs)))
        return specs

    def initialize_kv_cache(self, kv_cache_config: KVCacheConfig) -> None:
        """Allocate the cache tensors (one per layer slot of a group) and the persistent input batch."""
        arch = self.model_arch
        shape = self.attn_backend.get_kv_cache_shape(kv_cache_config.num_blocks, self.block_size,
                                                     arch.num_kv_heads, arch.head_dim, self.kv_cache_dtype)
        # Zeros, not empty: padded lanes of batched attention multiply unused slots by zero weights,
        # and 0 * NaN from uninitialised memory would poison the result.
        tensors = [torch.zeros(shape, dtype=self.kv_cache_dtype, device=self.device)
                   for _ in range(kv_cache_config.group_size)]
        layers = range(arch.num_layers)
        self.kv_caches = [tensors[kv_cache_config.tensor_index(i)] for i in layers]
        self.layer_groups = [kv_cache_config.group_index(i) for i in layers]
        if self.spec_decoder is not None:
            self.spec_decoder.bind_kv_cache(kv_cache_config, tensors, self.kv_caches, self.layer_groups)
        self.input_batch = InputBatch(self.config.scheduler_config.max_num_seqs, len(kv_cache_config.groups),
                                      self.block_size, arch.vocab_size, self.device)

    @torch.inference_mode()
    def execute_model(self, sched: SchedulerOutput) -> ModelRunnerOutput:
        begin = time.perf_counter()
        batch = self.input_batch
        batch.update(sched)
        self.prompt_logprobs.update(sched)
        if self.spec_decoder is not None:
            self.spec_decoder.update(sched)
        if sched.is_empty:
            return ModelRunnerOutput({})
        inputs = batch.prepare_inputs(sched)
        attn_metadata = build_step_metadata(self.attn_backend, inputs.group_metadata, self.layer_groups)
        start = time.perf_counter()
        hidden = self.model(inputs.input_ids, inputs.positions, self.kv_caches, attn_metadata)
        prompt_logprobs = self.prompt_logprobs.collect(sched, hidden)  # only ever due in a sampling step
        verified = VerifiedTokens([], [])
        model_done = time.perf_counter()
        if inputs.sampled_req_ids:  # else only prefill chunks that have not reached their prompts' ends
            logits = self.model.compute_logits(hidden[inputs.logits_indices])
            model_done = time.perf_counter()
            verified = self._sample(logits, inputs)
            batch.append_sampled(inputs.sampled_rows, verified.token_ids)
        sample_done = time.perf_counter()
        spec_token_ids = {}
        if self.spec_decoder is not None:  # a draft model computes prefill chunks too, to hold their KV
            spec_token_ids = self.spec_decoder.propose(sched, inputs, batch, hidden, verified, model_done - start)
        req_ids = inputs.sampled_req_ids
        return ModelRunnerOutput(
            dict(zip(req_ids, verified.token_ids)), {r: lps for r, lps in zip(req_ids, verified.logprobs) if lps},
            prompt_logprobs, spec_token_ids, prepare_time_s=start - begin, model_time_s=model_done - start,
            sample_time_s=sample_done - model_done, propose_time_s=time.perf_counter() - sample_done)

    def _sample(self, logits: torch.Tensor, inputs: ModelInputs) -> VerifiedTokens:
        """Each sampled request's new tokens: one drawn by the sampler, or its verified proposals and one more."""
        if self.spec_decoder is not None:
            return self.spec_decoder.verify(logits, inputs, self.input_batch)
        token_ids, logprobs = self.sampler.sample(logits, self.input_batch.sampling.metadata(inputs.sampled_rows.tolist()))
        return VerifiedTokens([[t] for t in token_ids], [[] if lp is None else [lp] for lp in logprobs])
