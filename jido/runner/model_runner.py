"""ModelRunner: owns the model weights and the physical KV cache, and runs one scheduled step."""
from __future__ import annotations

import logging
import time
from pathlib import Path

import torch

from jido.attention.registry import get_attention_backend
from jido.config import EngineConfig
from jido.core.outputs import ModelRunnerOutput, SchedulerOutput
from jido.layers.parameter import default_device_and_dtype
from jido.models.config import ModelArchConfig
from jido.models.loader import iter_weights, load_config, resolve_model
from jido.models.registry import get_model_class
from jido.runner.input_batch import CachedRequestState, build_inputs, update_states
from jido.sampling.sampler import Sampler

logger = logging.getLogger("jido")

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(device: str | None) -> torch.device:
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} was asked for but no CUDA device is present; use device='cpu'")
    return torch.device(device)


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    if dtype == "auto":
        return torch.float32 if device.type == "cpu" else torch.bfloat16
    return _DTYPES[dtype]


class ModelRunner:
    """Loads a model onto one device and executes :class:`SchedulerOutput` steps on it."""

    def __init__(self, config: EngineConfig) -> None:
        self.device = resolve_device(config.device)
        self.dtype = resolve_dtype(config.dtype, self.device)
        self.model_folder: Path = resolve_model(config.model)
        self.model_config = ModelArchConfig.from_hf_config(load_config(self.model_folder))
        self.block_size = config.block_size
        self.model = self._load_model(config.attention_backend)
        self.sampler = Sampler(config.seed, self.device)
        self.kv_caches: list[torch.Tensor] = []
        self.states: dict[str, CachedRequestState] = {}

    def _load_model(self, backend_name: str) -> torch.nn.Module:
        start = time.perf_counter()
        model_class = get_model_class(self.model_config.architecture)
        self.attn_backend = get_attention_backend(backend_name)
        # Built on its device in its dtype: no float32 (or CPU) copy of the whole model is ever made.
        with default_device_and_dtype(self.device, self.dtype):
            model = model_class(self.model_config, self.attn_backend)
        model.load_weights(iter_weights(self.model_folder))
        model.eval()
        logger.info("loaded %s (%s, %s) in %.1f s", self.model_folder.name, self.device, self.dtype,
                    time.perf_counter() - start)
        return model

    @property
    def kv_bytes_per_token(self) -> int:
        cfg = self.model_config
        return 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * torch.finfo(self.dtype).bits // 8

    def initialize_kv_cache(self, num_blocks: int) -> None:
        # Zeros, not empty: padded lanes of batched attention multiply unused slots by zero weights,
        # and 0 * NaN from uninitialised memory would poison the result.
        self.kv_caches = [torch.zeros(self.model.kv_cache_shape(num_blocks, self.block_size),
                                      dtype=self.dtype, device=self.device)
                          for _ in range(self.model.num_layers)]

    @torch.inference_mode()
    def execute_model(self, sched: SchedulerOutput) -> ModelRunnerOutput:
        update_states(self.states, sched)
        if sched.is_empty:
            return ModelRunnerOutput({})
        start = time.perf_counter()
        inputs = build_inputs(self.states, sched, self.block_size, self.device)
        hidden = self.model(inputs.input_ids, inputs.positions, self.kv_caches, inputs.metadata)
        logits = self.model.compute_logits(hidden[inputs.logits_indices])
        model_done = time.perf_counter()
        rows = [self.states[r].sampling_row() for r in inputs.sampled_req_ids]
        token_ids, logprobs = self.sampler.sample(logits, rows)
        for req_id in sched.num_scheduled_tokens:
            state = self.states[req_id]
            state.num_computed_tokens += sched.num_scheduled_tokens[req_id]
        for req_id, token_id in zip(inputs.sampled_req_ids, token_ids):
            self.states[req_id].token_ids.append(token_id)
        return ModelRunnerOutput(
            dict(zip(inputs.sampled_req_ids, token_ids)),
            {r: lp for r, lp in zip(inputs.sampled_req_ids, logprobs) if lp is not None},
            model_time_s=model_done - start, sample_time_s=time.perf_counter() - model_done)
