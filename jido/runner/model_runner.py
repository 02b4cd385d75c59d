"""ModelRunner: owns the model weights and the physical KV cache, and runs one scheduled step."""
from __future__ import annotations

import logging
import time
from pathlib import Path

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
from jido.layers.parameter import default_device_and_dtype
from jido.layers.quantization import get_quantization_config, process_weights_after_loading
from jido.models.config import ModelArchConfig
from jido.models.loader import gguf_source, iter_quantized_weights, iter_weights, load_config
from jido.models.registry import get_model_class
from jido.runner.input_batch import InputBatch
from jido.runner.prompt_logprobs import PromptLogprobsCollector
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
        # With a KV connector the model's attention calls its per-layer hooks (bound once the cache exists).
        self.layer_hooks = LayerwiseHooks(self.attn_backend, None) if connector_name(config) else None
        self.kv_connector: KVConnectorWorker | None = None
        self.model = self._load_model()
        self.sampler = Sampler(config.model_config.seed, self.device)
        self.prompt_logprobs = PromptLogprobsCollector(self.model.compute_logits, self.model_arch.vocab_size,
                                                       self.device)
        self.kv_caches: list[torch.Tensor] = []
        self.layer_groups: list[int] = []
        self.input_batch: InputBatch | None = None

    def _load_model(self) -> torch.nn.Module:
        start = time.perf_counter()
        model_class = get_model_class(self.model_arch.architecture)
        quant_config = get_quantization_config(self.quantization, self.config.model_config.quantization_group_size)
        # Built on its device in its dtype: no float32 (or CPU) copy of the whole model is ever made.
        with default_device_and_dtype(self.device, self.dtype):
            model = model_class(self.model_arch, self.layer_hooks or self.attn_backend, quant_config)
        gguf_native = self.quantization == "gguf"
        model.load_weights(iter_quantized_weights(self.model_folder) if gguf_native else iter_weights(self.model_folder))
        process_weights_after_loading(model)
        model.eval()
        logger.info("loaded %s (%s, %s, quantization %s) in %.1f s", self.model_folder.name, self.device, self.dtype,
                    self.quantization, time.perf_counter() - start)
        return model

    def get_kv_cache_spec(self) -> dict[int, KVCacheSpec]:
        """What each attention layer keeps per token: full context, or a sliding window."""
        arch = self.model_arch
        sizes = dict(dtype_bytes=self.kv_cache_dtype.itemsize,
                     scale_bytes=SCALE_BYTES if is_quantized(self.kv_cache_dtype) else 0)
        specs: dict[int, KVCacheSpec] = {}
        for layer_id, window in enumerate(arch.sliding_windows):
            if window is None:
                specs[layer_id] = FullAttentionSpec(self.block_size, arch.num_kv_heads, arch.head_dim, **sizes)
            else:
                specs[layer_id] = SlidingWindowSpec(self.block_size, arch.num_kv_heads, arch.head_dim, **sizes,
                                                    sliding_window=window)
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
        self.input_batch = InputBatch(self.config.scheduler_config.max_num_seqs, len(kv_cache_config.groups),
                                      self.block_size, arch.vocab_size, self.device)
        self.fingerprint = self._kv_fingerprint(kv_cache_config)
        self.kv_connector = make_worker_connector(self.config, self.fingerprint, arch.num_layers, self.kv_cache_dtype)
        if self.kv_connector is not None:
            self.kv_connector.register_kv_caches(self.kv_caches, kv_cache_config, self.attn_backend.block_token_dim)
            self.layer_hooks.connector = self.kv_connector

    def _kv_fingerprint(self, kv_cache_config: KVCacheConfig) -> str:
        """What another engine must match to reuse this one's stored KV blocks (see ``kv_fingerprint``)."""
        config_text = (self.model_folder / "config.json").read_text(encoding="utf-8")
        return kv_fingerprint({"model": self.model_folder.name, "config": config_text,
                               "quantization": self.quantization, "dtype": str(self.dtype),
                               "kv_cache_dtype": str(self.kv_cache_dtype), "layout": self.attn_backend.name,
                               "block_size": self.block_size,
                               "groups": [g.layer_ids for g in kv_cache_config.groups]})

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
        if sched.is_empty:
            return ModelRunnerOutput({})
        inputs = batch.prepare_inputs(sched)
        attn_metadata = build_step_metadata(self.attn_backend, inputs.group_metadata, self.layer_groups)
        start = time.perf_counter()
        hidden = self.model(inputs.input_ids, inputs.positions, self.kv_caches, attn_metadata)
        prompt_logprobs = self.prompt_logprobs.collect(sched, hidden)  # only ever due in a sampling step
        if not inputs.sampled_req_ids:  # only prefill chunks that have not reached their prompts' ends
            return ModelRunnerOutput({}, prepare_time_s=start - begin, model_time_s=time.perf_counter() - start)
        logits = self.model.compute_logits(hidden[inputs.logits_indices])
        model_done = time.perf_counter()
        token_ids, logprobs = self.sampler.sample(logits, batch.sampling.metadata(inputs.sampled_rows.tolist()))
        batch.append_sampled(inputs.sampled_rows, token_ids)
        return ModelRunnerOutput(
            {r: [t] for r, t in zip(inputs.sampled_req_ids, token_ids)},
            {r: [lp] for r, lp in zip(inputs.sampled_req_ids, logprobs) if lp is not None}, prompt_logprobs,
            prepare_time_s=start - begin, model_time_s=model_done - start,
            sample_time_s=time.perf_counter() - model_done)
