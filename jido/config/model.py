"""ModelConfig and DeviceConfig: which weights, in which precision, on which device."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from jido.config.size import check_positive_int

DType = Literal["auto", "float32", "bfloat16", "float16"]
DTYPES: tuple[str, ...] = get_args(DType)


@dataclass(frozen=True)
class ModelConfig:
    """The model and how it computes; ``None`` means "derive it"."""

    model: str | None = None
    """A .gguf file, an HF checkpoint folder, or a model name from `jido models` (gemma-3-270m,
    qwen2.5-coder-0.5b-instruct, qwen2.5-coder-1.5b-instruct; default: the embedded Gemma 3 270M)."""
    dtype: DType = "auto"
    """Weights' and activations' precision; auto is bfloat16 on CUDA and on CPUs with native bf16 (AVX-512 BF16 or
    AMX), float32 on other CPUs."""
    max_model_len: int | None = None
    """Prompt plus output tokens per request (default: the model's limit, capped by what the KV cache holds)."""
    attention_backend: str | None = None
    """The attention backend by registry name (torch, tiled, triton); it owns the KV cache layout (default: the
    fastest measured for the device, tiled on CPU and torch on CUDA)."""
    seed: int = 0
    """Seed of the engine's random state (requests seed their own sampling)."""

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.max_model_len is not None:
            check_positive_int("max_model_len", self.max_model_len)


@dataclass(frozen=True)
class DeviceConfig:
    """Where the model runs."""

    device: str | None = None
    """cpu, cuda or cuda:N (default: cuda when one is present, else cpu)."""

    def __post_init__(self) -> None:
        if self.device is not None and self.device.split(":")[0] not in ("cpu", "cuda"):
            raise ValueError(f"device must be 'cpu' or 'cuda[:N]', got {self.device!r}")
