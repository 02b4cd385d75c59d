"""ModelConfig and DeviceConfig: which weights, in which precision, on which device."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from jido.config.size import check_positive_int, parse_size

DType = Literal["auto", "float32", "bfloat16", "float16"]
DTYPES: tuple[str, ...] = get_args(DType)
Quantization = Literal["none", "gguf", "gguf_w8a8", "int8", "int4", "w8a8", "fp8"]
QUANTIZATIONS: tuple[str, ...] = get_args(Quantization)
WEIGHTS_MEMORY_MODES = ("auto", "lean")


def parse_weights_memory(value: int | str) -> int | str:
    """``auto``, ``lean``, or a size in bytes (from 2147483648, "3GiB", "512MB", ...).

    Raises:
        ValueError: anything else, naming the accepted forms.
    """
    if isinstance(value, str) and value.strip().lower() in WEIGHTS_MEMORY_MODES:
        return value.strip().lower()
    try:
        return parse_size(value)
    except ValueError as exc:
        raise ValueError(f"weights_memory must be auto, lean or a size like 3GiB, got {value!r}") from exc


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
    quantization: Quantization | None = None
    """How weights are stored and multiplied: gguf keeps a GGUF file's quantized tensors as stored (int8/int4 codes
    with the file's scales), gguf_w8a8 the same for decode with prefill-sized steps in w8a8 in a bf16 model (an int8
    copy of each layer, smoothed at load; opt-in), int8 quantizes weights per output channel at load,
    int4 in groups of quantization_group_size at load, w8a8 int8 weights per output channel with activations
    rounded to int8 per token, fp8 e4m3 weights per output channel and activations per token on a GPU with FP8
    tensor cores (CUDA compute capability 8.9 or newer), none computes with dense weights in dtype (default: gguf for a .gguf
    model on CPU, none for other models and on CUDA). The int8 and int4 schemes run CPU kernels that round activations to int8 (per block
    of 32 columns, per token under w8a8) where the CPU has AVX2."""
    quantization_group_size: int | None = None
    """Inputs per scale for int8 and int4 (default: a whole row for int8, 32 for int4)."""
    attention_backend: str | None = None
    """The attention backend by registry name (torch, tiled, triton); it owns the KV cache layout (default: the
    fastest measured for the device, tiled on CPU and triton on CUDA, or torch where triton is not installed)."""
    weights_memory: int | str = "auto"
    """Memory for quantized weights: lean holds each layer's codes alone (steps of 2+ rows pack panels per call), a
    size like 3GiB holds codes plus the faster copies that fit in it (prepacked panels, five-bit rows, int8 and bf16
    prefill copies), auto the copies that fit in the memory left once the KV cache and step workspace are set aside.
    The start-up log shows the table of what is held."""
    seed: int = 0
    """Seed of the engine's random state (requests seed their own sampling)."""
    enforce_eager: bool = False
    """Never replay CUDA graphs: on CUDA, decode steps otherwise run from graphs captured at start for batch sizes
    up to max_num_seqs (with an attention backend that supports them: triton)."""
    batch_invariant: bool = False
    """A request's logits (so its greedy tokens and logprobs) bit for bit the same alone or batched, in whole or
    chunked prefill, cold or after a cached prefix (vLLM's VLLM_BATCH_INVARIANT): every step size runs one kernel
    route, the int8 panels for quantized layers, oneDNN's packed matmul for dense float32 ones, the C++ paged decode
    kernel with fixed splits for every attention row. Slower; on CPU with the tiled attention backend only."""

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.quantization is not None and self.quantization not in QUANTIZATIONS:
            raise ValueError(f"quantization must be one of {', '.join(QUANTIZATIONS)}, got {self.quantization!r}")
        if self.quantization_group_size is not None:
            check_positive_int("quantization_group_size", self.quantization_group_size)
        if self.max_model_len is not None:
            check_positive_int("max_model_len", self.max_model_len)
        parse_weights_memory(self.weights_memory)
        if self.batch_invariant is not False:
            self._check_batch_invariant()

    def _check_batch_invariant(self) -> None:
        if not isinstance(self.batch_invariant, bool):
            raise ValueError(f"batch_invariant must be True or False, got {self.batch_invariant!r}")
        if self.attention_backend not in (None, "tiled"):
            raise ValueError(f"batch_invariant attends every row with the tiled backend's C++ kernel; "
                             f"attention_backend {self.attention_backend!r} has no batch-invariant route: leave it "
                             "unset or use tiled")
        if self.quantization == "gguf_w8a8":
            raise ValueError("batch_invariant runs every step on the codes, and gguf_w8a8's prefill copy would never "
                             "be used: use quantization gguf")


@dataclass(frozen=True)
class DeviceConfig:
    """Where the model runs."""

    device: str | None = None
    """cpu, cuda or cuda:N (default: cuda when one is present, else cpu)."""

    def __post_init__(self) -> None:
        if self.device is not None and self.device.split(":")[0] not in ("cpu", "cuda"):
            raise ValueError(f"device must be 'cpu' or 'cuda[:N]', got {self.device!r}")
