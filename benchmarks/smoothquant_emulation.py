"""What SmoothQuant's smoothing would buy w8a8's perplexity on the default model, emulated in float32.

w8a8 rounds every linear's input to int8 per token, and Gemma 3's activations have outlier channels that per-token
rounding crushes the other channels under (`--quantization w8a8`: +4.0% perplexity, `perplexity-2026-12-03-avx2-epyc-w8a8.md`).
SmoothQuant (Xiao et al., 2023) moves part of each input channel's range into the weight: ``x W^T = (x / s)(W s)^T``
with ``s_j = max|x_j|^alpha / max|W_j|^(1 - alpha)``, the activation maxima taken on calibration text. This script
measures that before any kernel is written: the model runs dense in float32 (``quantization=none``: the GGUF's
codes dequantized), and each layer linear of the chosen kinds is replaced by its emulation: x (divided by s) rounded
to int8 per token, W (times s) rounded to int8 per output channel, both dequantized, multiplied in float32. The LM
head stays float. Calibration: ``--calibration-chunks`` chunks of the pydoc text from token ``--calibration-offset``
on (disjoint from the chunks scored, which start at token 0).

    .venv/bin/python benchmarks/smoothquant_emulation.py --alphas 0.5 0.75 --kinds qkv o gate_up down \
        --out benchmarks/results/smoothquant_emulation-<date>-<cpu kind>.json

NOTE: the emulation wraps ``UnquantizedLinearMethod.apply`` in this process; it is a measurement, not a scheme.
"""
from __future__ import annotations

import argparse
import json
from collections.abc import Callable

import torch

from jido.utils.reference_text import reference_text
from jido.bench.machine import describe_machine, machine_info, now_iso
from jido.core.sampling_params import SamplingParams
from jido.layers import quantization
from jido.tools.perplexity import PerplexityConfig, evaluate

KINDS = ("qkv", "o", "gate_up", "down")


# The default model's (Gemma 3 270M) layer linears by weight shape [out, in]: q/k/v merged, o, gate/up merged, down.
KIND_OF_SHAPE = {(1536, 640): "qkv", (640, 1024): "o", (4096, 640): "gate_up", (640, 2048): "down"}


def layer_kind(weight: torch.Tensor) -> str | None:
    """Which of a decoder layer's linears ``weight`` is, or None (the LM head, another model's shapes)."""
    return KIND_OF_SHAPE.get(tuple(weight.shape))


def rounded_rows(t: torch.Tensor) -> torch.Tensor:
    """``t`` rounded to symmetric int8 per row and dequantized (jido's per-token and per-channel rounding)."""
    scale = t.abs().amax(dim=1, keepdim=True).clamp_min(1e-12) / 127
    return (t / scale).round().clamp(-127, 127) * scale


class Emulation:
    """The wrapped ``apply``: float, collecting activation maxima, or w8a8 with smoothing exponent ``alpha``."""

    def __init__(self, dense_apply: Callable) -> None:
        self.dense_apply = dense_apply
        self.mode, self.alpha, self.kinds = "float", 0.0, set(KINDS)
        self.maxima: dict[int, torch.Tensor] = {}
        self.weights: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}

    def __call__(self, method, layer, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        kind = layer_kind(layer.weight) if x.dim() == 2 else None
        if self.mode == "collect" and kind is not None:
            seen = x.detach().abs().amax(dim=0).float()
            self.maxima[id(layer)] = torch.maximum(self.maxima.get(id(layer), seen), seen)
        if self.mode not in ("w8a8", "smooth") or kind not in self.kinds:
            return self.dense_apply(method, layer, x, bias)
        weight, s = self._weight(layer)
        y = rounded_rows(x.float() / s) @ weight.t()
        return (y if bias is None else y + bias.float()).to(x.dtype)

    def _weight(self, layer) -> tuple[torch.Tensor, torch.Tensor]:
        key = (id(layer), self.mode, self.alpha)
        if key not in self.weights:
            w = layer.weight
            w = (w.to_dense() if w.is_mkldnn else w).detach().float()
            s = torch.ones(w.shape[1])
            if self.mode == "smooth":
                x_max = self.maxima[id(layer)].clamp_min(1e-5)
                s = (x_max**self.alpha / w.abs().amax(dim=0).clamp_min(1e-5) ** (1 - self.alpha)).clamp_min(1e-5)
            self.weights[key] = (rounded_rows(w * s), s)
        return self.weights[key]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--alphas", type=float, nargs="+", default=[0.5, 0.75])
    parser.add_argument("--kinds", nargs="+", choices=KINDS, default=list(KINDS),
                        help="the layer linears rounded to int8 (default: all four)")
    parser.add_argument("--each-kind", action="store_true",
                        help="also run each kind alone, smoothed with the first alpha")
    parser.add_argument("--context-length", type=int, default=512)
    parser.add_argument("--max-chunks", type=int, default=20)
    parser.add_argument("--calibration-offset", type=int, default=60000)
    parser.add_argument("--calibration-chunks", type=int, default=8)
    parser.add_argument("--out", default=None, help="write the records here as JSON")
    args = parser.parse_args()

    from jido.engine.llm import LLM

    emulation = Emulation(quantization.UnquantizedLinearMethod.apply)
    # A function, not the object: a class attribute that is a function binds the method's instance as its first argument.
    def apply(method, layer, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        return emulation(method, layer, x, bias)

    quantization.UnquantizedLinearMethod.apply = apply
    llm = LLM(quantization="none", dtype="float32", enable_prefix_caching=False)
    text = reference_text()
    ids = llm.get_tokenizer().encode(text)
    size, start = args.context_length, args.calibration_offset
    calibration = [{"prompt_token_ids": ids[start + i * size: start + (i + 1) * size]}
                   for i in range(args.calibration_chunks)]
    emulation.mode = "collect"
    llm.generate(calibration, SamplingParams(max_tokens=1), use_tqdm=False)
    config = PerplexityConfig(context_length=size, max_chunks=args.max_chunks)
    runs = [("float", 0.0, ()), ("w8a8", 0.0, tuple(args.kinds))]
    runs += [("smooth", alpha, tuple(args.kinds)) for alpha in args.alphas]
    if args.each_kind:
        runs += [(mode, args.alphas[0], (kind,)) for kind in args.kinds for mode in ("w8a8", "smooth")]
    records = []
    for mode, alpha, kinds in runs:
        emulation.mode, emulation.alpha, emulation.kinds = mode, alpha, set(kinds)
        result = evaluate(llm, text, config)
        records.append({"mode": mode, "alpha": alpha if mode == "smooth" else None, "kinds": list(kinds),
                        "perplexity": result.perplexity, "stderr": result.stderr,
                        "ratio": result.perplexity / records[0]["perplexity"] if records else 1.0})
        print(json.dumps(records[-1]), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"date": now_iso(), "machine": describe_machine(machine_info()), "args": vars(args),
                       "scored_tokens": result.num_scored_tokens, "runs": records}, f, indent=1)


if __name__ == "__main__":
    main()
