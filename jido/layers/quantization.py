"""The quantization seam: a config picks each linear layer's method, which owns its weights and its matmul."""
from __future__ import annotations

import functools
import importlib
from abc import ABC, abstractmethod

import torch
import torch.nn.functional as F
from torch import nn

from jido.layers.parameter import WeightLoader, empty_parameter
from jido.layers.weight_plan import LayoutCosts, WeightPlan
from jido.utils.cpu import cpu_info

_FEW_ROWS = 16  # up to this many rows, the LM head multiplies in the weight-major orientation


class LinearMethod(ABC):
    """How a linear layer stores ``W`` (``[out_features, in_features]``) and computes ``x W^T + b``.

    A method keeps no tensors of its own: :meth:`create_weights` registers them on the layer and the other
    methods read them back from it, so one instance may serve many layers. A quantized scheme registers
    its packed weights and scales instead of ``weight``; the layer and the model code do not change.
    """

    @abstractmethod
    def create_weights(
        self, layer: nn.Module, in_features: int, out_features: int, weight_loader: WeightLoader
    ) -> None:
        """Register the layer's weight parameters, uninitialised, on the default device and dtype.

        Every parameter registered carries ``weight_loader`` (the layer's, which knows its shards), so that
        checkpoint loading fills it.
        """

    @abstractmethod
    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """``x W^T (+ bias)``: ``[num_tokens, in_features]`` -> ``[num_tokens, out_features]``."""

    def apply_logits(self, layer: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
        """The LM head: ``[N, hidden]`` -> logits ``[N, vocab]`` in the model's dtype or float32, for the rows sampled.

        ``layer`` is the model's head; with tied embeddings that is the embedding, whose ``weight`` is
        ``[vocab, hidden]`` like a linear layer's. Override to pick a faster kernel for a few rows.
        """
        return self.apply(layer, hidden)

    def apply_gated(self, layer: nn.Module, x: torch.Tensor, activation: str,
                    bias: torch.Tensor | None = None) -> torch.Tensor | None:
        """``act(gate) * up`` of a merged gate/up layer's product (``[N, out_features / 2]``, ``activation`` an HF
        ``hidden_act`` name) where a kernel applies the activation as it stores the products; None (the default)
        where the caller runs :meth:`apply` and then the activation."""
        return None

    def greedy_token_ids(self, layer: nn.Module, hidden: torch.Tensor,
                         allowed: torch.Tensor | None = None) -> torch.Tensor | None:
        """Each row's argmax of :meth:`apply_logits` ([N] int64, the first of equals) where a kernel gives it without
        making the logits; None (the default) where the caller must make them. With ``allowed`` (int32 ``[N, words]``,
        each row's grammar bitmask), the argmax over the columns it allows, or None where the kernel takes no masks."""
        return None

    def layout_costs(self, layer: nn.Module, head: bool = False) -> LayoutCosts:
        """What ``layer`` (``head``: the LM head) would hold once processed, read before it processes its weights:
        the bytes of its codes and of each extra layout the weight plan may admit (:mod:`jido.layers.weight_plan`).
        Nothing by default: a dense weight has no extra layouts."""
        return LayoutCosts()

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        """Turn the loaded checkpoint tensors into the form :meth:`apply` runs fastest on (vLLM's hook).

        Called once per layer after every weight is loaded; the default keeps them as they are.
        """

    def process_logits_weights_after_loading(self, layer: nn.Module) -> None:
        """The same for the LM head: the tied embedding (whose table must stay dense), or an untied head's linear
        layer (:func:`is_untied_head`)."""


class UnquantizedLinearMethod(LinearMethod):
    """A dense ``weight`` in the model dtype; on CPU repacked for oneDNN once loaded.

    oneDNN's matmul wants the weight in a blocked layout. Given a plain ``[out, in]`` tensor, every
    ``F.linear`` call reorders it first; packing once after loading removes that per-call copy, which at batch-1
    decode cost about as much as the matmul itself, in bf16 and fp32 alike.

    ``batch_invariant``: every step runs on the packed weight, a one-row step as two rows. oneDNN's float32 matmul
    sums one row in another order than a step of two or more, and gave each row the same bits at every count from
    two (tests/layers/test_batch_invariance.py checks it on the CPU at hand); torch's unpacked matmul changes its
    order at several counts, so a weight oneDNN cannot pack here is refused at load.
    """

    def __init__(self, batch_invariant: bool = False) -> None:
        self.batch_invariant = batch_invariant

    def create_weights(
        self, layer: nn.Module, in_features: int, out_features: int, weight_loader: WeightLoader
    ) -> None:
        layer.weight = empty_parameter(out_features, in_features, weight_loader=weight_loader)

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        if layer.weight.is_mkldnn:
            return self._packed_linear(x, layer.weight, bias)
        return F.linear(x, layer.weight, bias)

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        if packable(layer.weight):
            layer.weight = nn.Parameter(pack_dense(layer.weight), requires_grad=False)
        else:
            self._refuse_unpacked(layer.weight)

    def process_logits_weights_after_loading(self, layer: nn.Module) -> None:
        if is_untied_head(layer):
            self.process_weights_after_loading(layer)
        elif packable(layer.weight):  # the embedding's lookups need the dense table: the packed copy sits beside it
            layer.packed_logits_weight = pack_dense(layer.weight)
        else:
            self._refuse_unpacked(layer.weight)

    def apply_logits(self, layer: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
        packed = getattr(layer, "packed_logits_weight", None)
        if packed is not None or layer.weight.is_mkldnn:
            return self._packed_linear(hidden, layer.weight if packed is None else packed)
        if hidden.shape[0] <= _FEW_ROWS:
            # [vocab, hidden] @ [hidden, N]: with a huge vocab and a few rows, BLAS runs this orientation
            # faster than hidden @ weight.T on CPU (Gemma 3's head at 8 rows).
            return torch.matmul(layer.weight, hidden.t()).t().contiguous()
        return F.linear(hidden, layer.weight)


    def _packed_linear(self, x: torch.Tensor, packed: torch.Tensor,
                       bias: torch.Tensor | None = None) -> torch.Tensor:
        if self.batch_invariant and x.shape[0] == 1:  # as a step of two rows (see the class docstring)
            return packed_linear(x.expand(2, -1).contiguous(), packed, bias)[:1]
        return packed_linear(x, packed, bias)

    def _refuse_unpacked(self, weight: torch.Tensor) -> None:
        if self.batch_invariant:
            raise ValueError(f"batch_invariant multiplies dense weights on oneDNN's packed matmul, which does not take "
                             f"{str(weight.dtype).removeprefix('torch.')} weights on {weight.device.type} here: use "
                             "dtype float32 (or a quantized model)")


def is_untied_head(layer: nn.Module) -> bool:
    """Whether an LM head is its own linear layer (an untied head) rather than the embedding it is tied to."""
    return getattr(layer, "linear_method", None) is not None


def packable(weight: torch.Tensor) -> bool:
    """Whether oneDNN takes this weight packed: a dense CPU float32 tensor, or bf16 where the CPU lets oneDNN
    reorder bf16 (on AVX2 + FMA it raises; the plain tensor still multiplies there, emulated)."""
    if weight.device.type != "cpu" or weight.is_mkldnn or not torch.backends.mkldnn.is_available():
        return False
    return weight.dtype == torch.float32 or (weight.dtype == torch.bfloat16 and cpu_info().has_onednn_bf16)


def pack_dense(weight: torch.Tensor, rows_hint: int = 1) -> torch.Tensor:
    """``weight`` reordered into oneDNN's blocked layout for steps of about ``rows_hint`` rows (an opaque
    ``torch._mkldnn`` tensor).

    The default hint of one row is the decode case, where the layout matters most (memory-bound); larger batches
    still run on it near full speed (float32: within noise of a layout packed for 32 or 256 rows). A weight that
    only serves steps of many rows is packed for them: bf16 on AMX, the default model's layer shapes ran faster from
    40 rows up packed for 2,000 rows than for one (at 16 rows and 1 the one-row layout stays faster).
    """
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), rows_hint)


def packed_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


def layout_costs(model: nn.Module) -> LayoutCosts:
    """The model's :meth:`LinearMethod.layout_costs` summed over its linear layers and its head, read after the
    checkpoint is loaded and before :func:`process_weights_after_loading`."""
    head = getattr(model, "lm_head", None)
    total = LayoutCosts()
    for module in model.modules():
        method = getattr(module, "linear_method", None)
        if method is not None and module is not head:
            total = total + method.layout_costs(module)
    logits_method = getattr(model, "logits_method", None)
    if logits_method is not None:
        total = total + logits_method.layout_costs(model.lm_head, head=True)
    return total


def process_weights_after_loading(model: nn.Module) -> None:
    """Give every linear layer's method, and the LM head's, its chance to repack the loaded weights. An untied head
    is a linear layer too, but only its logits method processes it (``process_logits_weights_after_loading``): no
    copy that serves a layer's prefill steps is made for it."""
    head = getattr(model, "lm_head", None)
    for module in model.modules():
        method = getattr(module, "linear_method", None)
        if method is not None and module is not head:
            method.process_weights_after_loading(module)
    logits_method = getattr(model, "logits_method", None)
    if logits_method is not None:
        logits_method.process_logits_weights_after_loading(model.lm_head)
    for module in model.modules():
        # Layers without a linear method (the embedding) process their own weights, after the tied head.
        hook = getattr(module, "process_weights_after_loading", None)
        if hook is not None and getattr(module, "linear_method", None) is None:
            hook()


class QuantizationConfig(ABC):
    """A checkpoint's quantization scheme: chooses the :class:`LinearMethod` of every linear layer."""

    name: str
    # Whether every step size runs one route, so that a row's result does not depend on its step (the engine's
    # batch_invariant; set by get_quantization_config before any method is made).
    batch_invariant: bool = False

    @functools.cached_property
    def plan(self) -> WeightPlan:
        """The layouts every layer of this config holds beside its codes: all of them (that a batch-invariant plan
        allows) until the loader settles it under ``weights_memory``; the methods this config makes share it."""
        return WeightPlan(batch_invariant=self.batch_invariant)

    @abstractmethod
    def get_linear_method(self, layer: nn.Module) -> LinearMethod:
        """The method for ``layer`` (a linear layer)."""

    def get_logits_method(self, head: nn.Module) -> LinearMethod:
        """The LM head's method (``head`` is the embedding when tied): the same as a linear layer's by default."""
        return self.get_linear_method(head)


class UnquantizedConfig(QuantizationConfig):
    """No quantization: every layer holds a dense weight in the model dtype."""

    name = "none"

    def __init__(self, group_size: int | None = None) -> None:
        if group_size is not None:
            raise ValueError("quantization_group_size needs a quantization scheme that takes one (int8, int4)")

    def get_linear_method(self, layer: nn.Module) -> LinearMethod:
        return UnquantizedLinearMethod(self.plan.batch_invariant)


# name -> "module:class" of each scheme, imported when asked for (the quantized ones need their kernels).
_CONFIGS: dict[str, str] = {
    "none": "jido.layers.quantization:UnquantizedConfig",
    "gguf": "jido.layers.quantized_linear:GGUFConfig",
    "gguf_w8a8": "jido.layers.quantized_linear:GGUFW8A8Config",
    "int8": "jido.layers.quantized_linear:Int8Config",
    "int4": "jido.layers.quantized_linear:Int4Config",
    "w8a8": "jido.layers.quantized_linear:W8A8Config",
    "fp8": "jido.layers.fp8_linear:Fp8Config",
}
QUANTIZATIONS: tuple[str, ...] = tuple(_CONFIGS)
# The schemes that serve a GGUF file's own codes (the loader hands them over still quantized).
GGUF_SCHEMES: tuple[str, ...] = ("gguf", "gguf_w8a8")


def get_quantization_config(name: str = "none", group_size: int | None = None,
                            batch_invariant: bool = False) -> QuantizationConfig:
    """A new config of the scheme registered as ``name`` (``group_size`` for the schemes that take one), whose layers
    run every step size on one route with ``batch_invariant`` (see :class:`~jido.layers.weight_plan.WeightPlan`).

    Raises:
        ValueError: no scheme has that name (the message lists the known ones), or a bad group size.
    """
    if name not in _CONFIGS:
        raise ValueError(f"unknown quantization {name!r}; available: {sorted(_CONFIGS)}")
    module_name, class_name = _CONFIGS[name].split(":")
    config = getattr(importlib.import_module(module_name), class_name)(group_size)
    config.batch_invariant = batch_invariant
    return config
