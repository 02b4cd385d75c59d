"""ModelConfig and DeviceConfig: which weights, in which precision, on which device."""
from __future__ import annotations

from dataclasses import dataclass

from jido.config.size import check_positive_int

DTYPES = ("auto", "float32", "bfloat16", "float16")


@dataclass(frozen=True)
class ModelConfig:
    """The model and how it computes.

    ``None`` means "derive it": ``dtype="auto"`` becomes bfloat16 on CUDA and on CPUs with native bf16
    (AVX-512 BF16 or AMX), float32 on other CPUs;
    ``max_model_len`` becomes the model's own limit, capped by what the KV cache can hold.
    """

    model: str | None = None
    dtype: str = "auto"
    max_model_len: int | None = None
    attention_backend: str = "torch"
    seed: int = 0

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.max_model_len is not None:
            check_positive_int("max_model_len", self.max_model_len)


@dataclass(frozen=True)
class DeviceConfig:
    """``device=None`` becomes ``cuda`` when one is present, else ``cpu``."""

    device: str | None = None

    def __post_init__(self) -> None:
        if self.device is not None and self.device.split(":")[0] not in ("cpu", "cuda"):
            raise ValueError(f"device must be 'cpu' or 'cuda[:N]', got {self.device!r}")
