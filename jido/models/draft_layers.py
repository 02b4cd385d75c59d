"""What jido's trained drafts (EAGLE, Medusa) are made of: trainable layers that propose on jido's kernels, and
their folders (a JSON config beside the safetensors weights).

A draft trains in plain autograd ops and proposes on jido's linear methods: the same module does both.
"""
from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn

from jido.layers import int8_dot
from jido.layers.quant_kernels import QuantizedWeight
from jido.layers.quantization import LinearMethod, UnquantizedLinearMethod
from jido.layers.quantized_linear import QuantizedLinearMethod
from jido.layers.rms_norm import load_norm_ops

CONFIG_FILE, WEIGHTS_FILE = "draft_config.json", "draft.safetensors"
QUANT_GROUP = 32  # columns per scale of a draft's int8 / int4 codes


class DraftNorm(nn.Module):
    """RMSNorm ``w * x``: in plain autograd ops while training (jido's fused kernel has no backward), on that kernel
    when proposing on a CPU (``F.rms_norm`` runs there as ~10 ATen ops, whose dispatch dominates a one-row norm
    and was a visible share of a proposal)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.is_cpu and not torch.is_grad_enabled() and x.dtype == self.weight.dtype and x.dim() == 2:
            ops = load_norm_ops()
            if ops is not None:
                return ops.rms_norm(x, self.weight, self.eps, None)
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


class DraftLinear(nn.Linear):
    """``nn.Linear`` for training; for proposing, its weight held by one of jido's linear methods (:meth:`prepare`).

    Dense: oneDNN's blocked copy (plain ``F.linear`` of one row reorders the weight each call, far below the
    memory's bandwidth). int8 / int4: jido's codes in
    groups of 32, as ``--quantization int8`` / ``int4``, on the int8 dot kernels with panels for steps of two rows or
    more (from one row where they run on AMX tiles): a quarter / an eighth of float32's bytes a proposal reads.
    """

    linear_method: LinearMethod | None = None
    qweight: QuantizedWeight | None = None  # set by the int8 method

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x) if self.linear_method is None else self.linear_method.apply(self, x, self.bias)

    def prepare(self, bits: int | None) -> None:
        """Hold the weight for proposing: dense (``bits`` None), or in int8 / int4 codes (8 / 4)."""
        if bits is not None:
            panel_min_rows = 1 if int8_dot.amx_runs() else int8_dot.PREPACKED_MIN_ROWS
            self.linear_method = QuantizedLinearMethod(bits=bits, group_size=QUANT_GROUP, panel_min_rows=panel_min_rows)
        else:
            self.linear_method = UnquantizedLinearMethod()
        self.linear_method.process_weights_after_loading(self)

    def argmax_columns(self, x: torch.Tensor) -> torch.Tensor | None:
        """Each row's argmax column of ``self(x.float())`` ([rows] int64: the float32 outputs, as the target's head
        compares them) where the linear method's kernel gives it without the outputs
        (``LinearMethod.greedy_token_ids``), else None."""
        return None if self.linear_method is None else self.linear_method.greedy_token_ids(self, x)


def softcapped(logits: torch.Tensor, cap: float | None) -> torch.Tensor:
    """The target's final soft-cap, applied to a draft's logits alike."""
    return logits if cap is None else torch.tanh(logits / cap) * cap


def save_draft(module: nn.Module, config: Any, folder: Path, training: dict[str, Any] | None = None) -> None:
    """Write the draft's ``config`` (a dataclass; with ``training``, what trained it, in place of its own record) and
    the module's weights to ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    record = {**asdict(config), **({"training": training} if training is not None else {})}
    (folder / CONFIG_FILE).write_text(json.dumps(record, indent=2) + "\n")
    save_file({name: t.detach().contiguous() for name, t in module.state_dict().items()}, str(folder / WEIGHTS_FILE))


def read_draft_config(folder: Path, method: str, name: str) -> dict[str, Any]:
    """The config of the ``method`` draft in ``folder`` (``name``: how errors call it).

    Raises:
        ValueError: the folder holds no draft, or one of another method.
    """
    if not (folder / CONFIG_FILE).is_file() or not (folder / WEIGHTS_FILE).is_file():
        raise ValueError(f"{folder} holds no {name} draft ({CONFIG_FILE} and {WEIGHTS_FILE}): train one with "
                         f"`jido train-draft --method {method} --out {folder}`")
    config = json.loads((folder / CONFIG_FILE).read_text())
    if config.get("method") != method:
        raise ValueError(f"{folder} holds a {config.get('method')!r} draft, not a {method!r} one")
    return config


def load_draft_weights(module: nn.Module, folder: Path, device: torch.device, dtype: torch.dtype,
                       bits: int | None) -> nn.Module:
    """``module`` with the folder's weights, in eval mode, its linear layers packed for proposing (in int8 / int4
    codes with ``bits`` 8 / 4, where the int8 kernels run: on a CPU; None: dense)."""
    module.load_state_dict(load_file(str(folder / WEIGHTS_FILE)))
    module = module.to(device=device, dtype=dtype).eval()
    for layer in module.modules():
        if isinstance(layer, DraftLinear):
            layer.prepare(bits if device.type == "cpu" else None)
    return module

