"""Engine configuration: one frozen dataclass, validated on creation, from which the CLI is generated."""
from __future__ import annotations

import re
from dataclasses import dataclass

_SIZE_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
               "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
DTYPES = ("auto", "float32", "bfloat16", "float16")


def parse_size(value: int | str) -> int:
    """Turn 2147483648, "2GiB", "512MB" or "1.5 gib" into bytes."""
    if isinstance(value, int) and not isinstance(value, bool):
        size = value
    else:
        match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(value))
        unit = match.group(2).lower() if match else None
        if match is None or unit not in _SIZE_UNITS:
            raise ValueError(f"cannot read size {value!r}: give bytes or a number with a unit like '2GiB' or '512MB'")
        size = int(float(match.group(1)) * _SIZE_UNITS[unit])
    if size <= 0:
        raise ValueError(f"size must be positive, got {value!r}")
    return size


@dataclass(frozen=True)
class EngineConfig:
    """Everything the engine needs to start: model, device, KV cache and scheduler limits.

    ``None`` means "derive it": ``device`` becomes ``cuda`` when one is present, else ``cpu``;
    ``dtype="auto"`` becomes float32 on CPU and bfloat16 on CUDA; ``max_model_len`` becomes the model's
    own limit, capped by what the KV cache can hold.
    """

    model: str | None = None
    device: str | None = None
    dtype: str = "auto"
    max_model_len: int | None = None
    block_size: int = 16
    kv_cache_memory: int | str = "2GiB"
    max_num_seqs: int = 128
    max_num_batched_tokens: int = 2048
    enable_prefix_caching: bool = True
    attention_backend: str = "torch"
    seed: int = 0

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.device is not None and self.device.split(":")[0] not in ("cpu", "cuda"):
            raise ValueError(f"device must be 'cpu' or 'cuda[:N]', got {self.device!r}")
        check_positive_int("block_size", self.block_size)
        check_positive_int("max_num_seqs", self.max_num_seqs)
        check_positive_int("max_num_batched_tokens", self.max_num_batched_tokens)
        if self.max_model_len is not None:
            check_positive_int("max_model_len", self.max_model_len)
        parse_size(self.kv_cache_memory)

    @property
    def kv_cache_bytes(self) -> int:
        return parse_size(self.kv_cache_memory)


def check_positive_int(name: str, value: int) -> None:
    """Raise ValueError unless ``value`` is an int >= 1 (bools are not ints here)."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
