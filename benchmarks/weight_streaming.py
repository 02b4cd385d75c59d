"""How the default model's weights stream through its linear layers, in one run: 4 KiB pages against transparent
huge pages at one row of x, and the int8 panels against the bf16 copy (AMX CPUs) at many rows.

- ``pages``: the 72 layer matmuls and the LM head at one row of x, weights cold (the head is read between runs of
  the layers and the layers between runs of the head), once with the model's weights copied back into plain torch
  tensors (4 KiB pages: what torch's allocator gives under THP ``madvise``) and once as jido holds them
  (``jido/utils/huge_pages.py``). Also the 27 layers whose codes fit five bits, on their bytes and their five-bit rows.
- ``rows``: the 72 layer matmuls at 4 to 2,000 rows on the int8 panels and, where the model keeps them
  (``keeps_bf16_copy``), on the bf16 copies by oneDNN.

Medians of ``--repeats`` runs of each.

    .venv/bin/python benchmarks/weight_streaming.py [--repeats 9] \\
        [--out benchmarks/results/weight_streaming-<date>-<cpu kind>.json]
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from jido.bench.machine import describe_machine, machine_info, now_iso
from jido.layers import int8_dot
from jido.layers.quantization import packed_linear
from jido.utils.huge_pages import thp_mode


def _median_ms(run: Callable[[], None], evict: Callable[[], None], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        evict()
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def _plain(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.clone()  # torch's allocator: 4 KiB pages unless THP is "always"


def pages(layers: list, head, repeats: int) -> dict:
    xs = [torch.randn(1, m.qweight.shape[1], dtype=torch.bfloat16) for m in layers]
    hx = torch.randn(1, head.qweight.shape[1])

    def run_layers(weights: list) -> None:
        for w, x in zip(weights, xs):
            int8_dot.int8_dot_linear(x, w)

    def nbytes(w) -> int:
        return sum(t.numel() * t.element_size() for t in (w.data, w.scales, w.mins) if t is not None)

    held = [m.qweight for m in layers]
    plain = [dataclasses.replace(w, data=_plain(w.data), scales=_plain(w.scales), mins=_plain(w.mins)) for w in held]
    head_held = head.qweight
    head_plain = dataclasses.replace(head_held, data=_plain(head_held.data), scales=_plain(head_held.scales))
    out = {"thp_mode": thp_mode(), "layers_mb": sum(map(nbytes, held)) / 1e6, "head_mb": nbytes(head_held) / 1e6}
    for name, weights, table in (("4k_pages", plain, head_plain), ("huge_pages", held, head_held)):
        out[f"layers_ms_{name}"] = _median_ms(lambda w=weights: run_layers(w),
                                              lambda t=table: int8_dot.int8_dot_linear(hx, t), repeats)
        out[f"head_ms_{name}"] = _median_ms(lambda t=table: int8_dot.int8_dot_linear(hx, t),
                                            lambda w=weights: run_layers(w), repeats)
    five = [(m, x) for m, x in zip(layers, xs) if m.layouts.five_bits is not None]
    out["five_bit_layers"] = len(five)
    out["five_bit_codes_mb"] = sum(m.qweight.data.numel() for m, _ in five) / 1e6
    out["five_bit_rows_mb"] = sum(m.layouts.five_bits.data.numel() for m, _ in five) / 1e6
    evict = lambda: int8_dot.int8_dot_linear(hx, head_held)  # noqa: E731
    out["five_bit_layers_ms_bytes"] = _median_ms(lambda: [int8_dot.int8_dot_linear(x, m.qweight) for m, x in five],
                                                 evict, repeats)
    out["five_bit_layers_ms_five_bits"] = _median_ms(
        lambda: [int8_dot.five_bit_linear(x, m.layouts.five_bits) for m, x in five], evict, repeats)
    return out


def rows(layers: list, head, repeats: int) -> list[dict]:
    hx = torch.randn(1, head.qweight.shape[1])
    results = []
    for num_rows in (4, 8, 16, 32, 48, 64, 128, 2000):
        xs = [torch.randn(num_rows, m.qweight.shape[1], dtype=torch.bfloat16) for m in layers]
        record = {"rows": num_rows}
        record["panels_ms"] = _median_ms(lambda: [int8_dot.panel_linear(x, m.layouts.panels)
                                                  for m, x in zip(layers, xs)],
                                         lambda: int8_dot.int8_dot_linear(hx, head.qweight), repeats)
        if all(m.layouts.bf16_copy is not None for m in layers):
            record["bf16_copy_ms"] = _median_ms(lambda: [packed_linear(x, m.layouts.bf16_copy)
                                                         for m, x in zip(layers, xs)],
                                                lambda: int8_dot.int8_dot_linear(hx, head.qweight), repeats)
        results.append(record)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    from jido import LLM

    llm = LLM()
    model = llm.llm_engine.core.executor.worker.runner.model
    layers = [m for layer in model.model.layers for m in (layer.self_attn.qkv_proj, layer.self_attn.o_proj,
                                                           layer.mlp.gate_up_proj, layer.mlp.down_proj)]
    with torch.inference_mode():
        result = {"date": now_iso(), "machine": machine_info(), "torch": torch.__version__,
                  "pages": pages(layers, model.lm_head, args.repeats), "rows": rows(layers, model.lm_head,
                                                                                     args.repeats)}
    print(describe_machine(result["machine"]))
    print(json.dumps(result["pages"], indent=1))
    for record in result["rows"]:
        print(record)
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
