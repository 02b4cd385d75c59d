"""The model in memory: device, dtype and quantization resolved from the config, a checkpoint loaded under its weight
plan, and the bytes its weights hold. The model runner, the draft model, the draft trainer and roofline load through
it."""
from __future__ import annotations

import logging
import time
from pathlib import Path

import torch

from jido.attention.backend import AttentionBackend
from jido.layers.fp8_linear import MIN_CAPABILITY as MIN_FP8_CAPABILITY
from jido.layers.parameter import default_device_and_dtype
from jido.layers.quantization import (GGUF_SCHEMES, get_quantization_config, layout_costs,
                                     process_weights_after_loading)
from jido.layers.quantized_layouts import QuantizedLayouts, layouts_of
from jido.layers.weight_plan import WeightPlan, choose_extras, format_table, held_layouts
from jido.models.config import ModelArchConfig
from jido.models.loader import iter_quantized_weights, iter_weights
from jido.models.registry import get_model_class
from jido.parallel.state import ModelParallel, building_for
from jido.utils.cpu import CpuInfo, cpu_info
from jido.utils.host_memory import mem_available_bytes
from jido.utils.huge_pages import move_weights_to_huge_pages, thp_mode

logger = logging.getLogger("jido")

DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(device: str | None) -> torch.device:
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} was asked for but no CUDA device is present; use device='cpu'")
    return torch.device(device)


def resolve_dtype(dtype: str, device: torch.device, cpu: CpuInfo | None = None) -> torch.dtype:
    """``auto``: bfloat16 on CUDA and on CPUs that compute it natively (AVX-512 BF16 or AMX), else float32.

    Where bf16 is emulated (AVX2 + FMA only) a bf16 matmul is hundreds of times slower than float32, so float32 is
    the fast choice there.
    """
    if dtype != "auto":
        return DTYPES[dtype]
    if device.type != "cpu":
        return torch.bfloat16
    return torch.bfloat16 if (cpu or cpu_info()).has_native_bf16 else torch.float32


def resolve_quantization(quantization: str | None, device: torch.device, from_gguf: bool) -> str:
    """The scheme to load with: as asked, else ``gguf`` for a GGUF model on CPU (the file's own codes, which keep
    float32 GGUF-native perplexity on every held-out domain:
    benchmarks/results/quality_gate-2026-12-07-xeon-vnni-gemma-3-270m.md) and ``none`` otherwise.

    ``gguf_w8a8`` is opt-in: its prefill-sized steps on int8 GEMMs are faster in a bf16 model, but rounding x per token
    cost several percent of perplexity on text outside its calibration (docs/quantization.md has the figures per
    domain). The GGUF kernels are CPU kernels; on CUDA a GGUF model is dequantized to dtype unless asked otherwise.

    Raises:
        ValueError: ``gguf`` or ``gguf_w8a8`` asked for a model that is not a GGUF file, a CPU scheme off the CPU, or
            ``fp8`` anywhere but on a GPU with FP8 tensor cores.
    """
    if quantization in GGUF_SCHEMES and not from_gguf:
        raise ValueError(f"quantization {quantization!r} needs a .gguf model; for other checkpoints use int8, int4, "
                         "w8a8 or none")
    if quantization == "fp8":
        check_fp8_device(device)
        return quantization
    if quantization not in (None, "none") and device.type != "cpu":
        raise ValueError(f"quantization {quantization!r} runs on CPU kernels; on {device.type} use quantization none")
    if quantization is not None:
        return quantization
    return "gguf" if from_gguf and device.type == "cpu" else "none"


def check_fp8_device(device: torch.device) -> None:
    """Raise unless ``device`` multiplies FP8 on tensor cores (CUDA compute capability 8.9 or newer)."""
    if device.type != "cuda":
        raise ValueError("quantization 'fp8' needs a GPU with FP8 tensor cores (CUDA compute capability 8.9 or "
                         "newer); on a CPU torch multiplies FP8 by a reference loop (200x slower than float32): "
                         "use w8a8 (int8 weights and activations) or int8 there")
    capability = torch.cuda.get_device_capability(device)
    if capability < MIN_FP8_CAPABILITY:
        raise ValueError(f"quantization 'fp8' needs CUDA compute capability {MIN_FP8_CAPABILITY[0]}."
                         f"{MIN_FP8_CAPABILITY[1]} or newer (Ada, Hopper); {torch.cuda.get_device_name(device)} "
                         f"is {capability[0]}.{capability[1]}: use quantization none")


def load_model(folder: Path, arch: ModelArchConfig, attn_backend: AttentionBackend, device: torch.device,
               dtype: torch.dtype, quantization: str, quantization_group_size: int | None,
               parallel: ModelParallel | None = None, weights_memory: int | str | None = None,
               reserved_bytes: int = 0, batch_invariant: bool = False) -> torch.nn.Module:
    """A model built on ``device`` in ``dtype`` from its checkpoint folder (``parallel``'s shard of it: its
    layers, its heads), weights processed, in eval mode.

    ``weights_memory`` (``auto``, ``lean`` or a size; None: every layout) settles the weight plan of a quantized
    model (:mod:`jido.layers.weight_plan`); under ``auto`` the copies get what the host has available less
    ``reserved_bytes`` (the KV cache and step workspace to come), shared among the ranks. ``batch_invariant``: its
    linear layers run every step size on one route (the plan's ``batch_invariant``)."""
    start = time.perf_counter()
    model_class = get_model_class(arch.architecture)
    quant_config = get_quantization_config(quantization, quantization_group_size, batch_invariant)
    # Built on its device in its dtype: no float32 (or CPU) copy of the whole model is ever made.
    with default_device_and_dtype(device, dtype), building_for(parallel or ModelParallel.single()):
        model = model_class(arch, attn_backend, quant_config)
    model.load_weights(iter_quantized_weights(folder) if quantization in GGUF_SCHEMES else iter_weights(folder))
    if weights_memory is not None:
        _settle_weight_plan(model, quant_config.plan, weights_memory, device, reserved_bytes,
                            (parallel or ModelParallel.single()).world_size)
    process_weights_after_loading(model)
    held = held_layouts(model)
    if held:
        logger.info("weights held (%s):\n%s", quant_config.plan.reason,
                    format_table(held, quant_config.plan.batch_invariant))
    if device.type == "cpu":
        moved = move_weights_to_huge_pages(model)
        logger.info("%s of weights in transparent huge pages (THP %s)", mib_text(moved), thp_mode())
    model.eval()
    logger.info("loaded %s (%s, %s, quantization %s) in %.1f s", folder.name, device, dtype, quantization,
                time.perf_counter() - start)
    return model


def check_batch_invariant(device: torch.device, arch: ModelArchConfig) -> None:
    """Log that ``batch_invariant`` is on, or raise where it has no route: off the CPU (its routes are jido's CPU
    kernels), or in a mixture-of-experts model (each expert multiplies the tokens routed to it with torch's matmul,
    whose sums change with their number)."""
    if device.type != "cpu":
        raise ValueError(f"batch_invariant runs jido's CPU kernels; on {device.type} it has no route (use device cpu)")
    if arch.num_experts:
        raise ValueError("batch_invariant has no route for mixture-of-experts layers (an expert's sums depend on how "
                         "many tokens it got); run this model without it")
    logger.info("batch_invariant: every step size on one route (quantized layers on the int8 panels, dense ones on "
                "oneDNN's packed matmul, every attention row on the C++ paged decode kernel with fixed splits), so a "
                "request's logits do not depend on its batch, its chunks or its cached prefix")


# Left to the process itself (Python, torch, the tokenizer) when weights_memory=auto sizes the copies.
RUNTIME_HEADROOM_BYTES = 1 << 30


def _settle_weight_plan(model: torch.nn.Module, plan: WeightPlan, weights_memory: int | str, device: torch.device,
                        reserved_bytes: int, ranks: int) -> None:
    """Settle ``plan`` from the model's layout costs (read before its layers process their weights) of the layouts it
    may hold."""
    costs = layout_costs(model).only(plan.allowed)
    if not costs.extras:
        return
    available = mem_available_bytes() if device.type == "cpu" else None
    if available is not None:
        available = max(0, (available - reserved_bytes - RUNTIME_HEADROOM_BYTES) // max(1, ranks))
    plan.settle(*choose_extras(weights_memory, costs, available))


def weight_bytes(model: torch.nn.Module, prepacked: bool = True) -> int:
    """Bytes of the model's weights as held: parameters, buffers, quantized codes and the packed copies beside them.

    Without ``prepacked``, what a one-row decode step reads: the codes (or their five-bit rows, where a layer has
    them), without the panels, int8 prefill copies and bf16 copies beside them (the other fields of a layer's
    :class:`~jido.layers.quantized_layouts.QuantizedLayouts`).
    """
    tensors = {id(t): t for t in [*model.parameters(), *model.buffers()]}
    for module in model.modules():
        tensors.update((id(t), t) for t in _held_beside(module, prepacked))
    return sum(t.numel() * t.element_size() for t in tensors.values())


def _held_beside(module: torch.nn.Module, prepacked: bool) -> list[torch.Tensor]:
    """Weight tensors a layer keeps outside its parameters (see jido/layers/quantized_linear.py)."""
    held = [getattr(module, name, None) for name in (
        "packed_logits_weight", "weight_scale", "logits_codes", "logits_scale")]  # (the last three: fp8_linear)
    qweight, layouts = getattr(module, "qweight", None), layouts_of(module)
    five = None if layouts is None else layouts.five_bits
    if qweight is not None:  # one-row decode reads the five-bit rows where a layer has them, else the codes
        held += [qweight.scales, qweight.mins, qweight.scale_supers, qweight.min_supers]
        held += [qweight.data] if prepacked or five is None else []
    if five is not None:
        held.append(five.data)
    if layouts is not None and prepacked:
        held += _prepacked(layouts)
    return [t for t in held if isinstance(t, torch.Tensor)]


def _prepacked(layouts: QuantizedLayouts) -> list[torch.Tensor | None]:
    """The tensors of a layer's layouts that no one-row decode step reads: its panels, int8 prefill copies (for the
    AMX GEMM, or ``torch._int_mm`` without AMX) and bf16 copy."""
    panels, gemm, int_mm = layouts.panels, layouts.amx_gemm, layouts.prefill_int_mm
    held = []
    if panels is not None:
        held += [panels.codes, panels.scales, panels.mins, panels.meta]
    if gemm is not None:
        held += [gemm.packed, gemm.scales]
    if int_mm is not None:
        held += [int_mm.data, int_mm.scales]
    return held + [layouts.bf16_copy]


def mib_text(num_bytes: int) -> str:
    """``num_bytes`` for a log line, in MiB."""
    return f"{num_bytes / 2**20:.1f} MiB"
