"""Each kind of the default model's quantized layers at a few step sizes: its int8 panels against its bf16 copy.

Loads the default model (Gemma 3 270M GGUF, ``dtype=auto``) and, for every kind of layer (qkv, o, gate/up, down),
times all of that kind's layers (one each per decoder layer) on random x of ``rows`` rows, by the panel kernel
(``int8_dot.panel_linear``) and by the bf16 copy (oneDNN, ``packed_linear``). The two alternate within each round, in
one process, so a host whose speed drifts slows both alike; figures are medians over rounds, with the median of the
per-round ratios. This is what ``quantized_linear.bf16_copy_min_rows`` is set from. Needs a CPU that keeps the copy
(native bf16: AVX-512 BF16 or AMX).

    .venv/bin/python benchmarks/panels_vs_copy.py --rows 8 16 24 32 48
"""
from __future__ import annotations

import argparse
import collections
import json
import statistics
import time
from pathlib import Path

import torch

from jido import LLM
from jido.bench.machine import cpu_kind, machine_info, now_iso
from jido.layers import int8_dot
from jido.layers.quantization import packed_linear
from jido.layers.quantized_layouts import layouts_of

RESULTS = Path(__file__).parent / "results"


def _time_ms(layers: list, xs: list[torch.Tensor], run) -> float:
    start = time.perf_counter()
    for layer, x in zip(layers, xs):
        run(layer, x)
    return 1e3 * (time.perf_counter() - start)


def compare(kinds: dict[str, list], rows: int, rounds: int) -> list[dict]:
    out = []
    for kind, layers in kinds.items():
        xs = [torch.randn(rows, layer.qweight.shape[1], dtype=torch.bfloat16) for layer in layers]
        panels, copy = [], []
        for r in range(rounds + 2):  # the first two warm both up
            order = ((panels, _panels), (copy, _copy)) if r % 2 else ((copy, _copy), (panels, _panels))
            for times, run in order:
                t = _time_ms(layers, xs, run)
                if r >= 2:
                    times.append(t)
        n, k = layers[0].qweight.shape
        out.append({"kind": kind, "layers": len(layers), "N": n, "K": k, "group_size": layers[0].qweight.group_size,
                    "rows": rows, "panels_ms": statistics.median(panels), "copy_ms": statistics.median(copy),
                    "panels_over_copy": statistics.median(p / c for p, c in zip(panels, copy))})
        row = out[-1]
        print(f"{rows:>3} rows {kind:>13} (K {k:>5}) x{len(layers)}: panels {row['panels_ms']:.2f} ms, "
              f"bf16 copy {row['copy_ms']:.2f} ms, ratio {row['panels_over_copy']:.2f}", flush=True)
    return out


def _panels(layer, x: torch.Tensor) -> None:
    int8_dot.panel_linear(x, layer.layouts.panels)


def _copy(layer, x: torch.Tensor) -> None:
    packed_linear(x, layer.layouts.bf16_copy, None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", nargs="+", type=int, default=[8, 16, 24, 32, 48], help="rows of x per step")
    parser.add_argument("--rounds", type=int, default=9, help="alternating rounds; figures are medians over them")
    parser.add_argument("--tag", default="", help="appended to the result file's name")
    args = parser.parse_args()
    llm = LLM(kv_cache_memory="256MiB", max_model_len=512)
    model = llm.llm_engine.core.executor.worker.runner.model
    kinds = collections.defaultdict(list)
    for name, module in model.named_modules():
        layouts = layouts_of(module)
        if layouts is not None and layouts.bf16_copy is not None and layouts.panels is not None:
            kinds[name.split(".")[-1]].append(module)
    if not kinds:
        raise SystemExit("no layer keeps a bf16 copy here (needs AVX-512 BF16 or AMX, and a bf16 model)")
    rows = [row for r in args.rows for row in compare(kinds, r, args.rounds)]
    result = {"date": now_iso(), "machine": machine_info() | {"torch": torch.__version__,
                                                              "torch_threads": torch.get_num_threads()},
              "amx": any(m.layouts.panels.amx for ms in kinds.values() for m in ms), "rounds": args.rounds,
              "rows": rows}
    path = RESULTS / f"panels_vs_copy-{result['date'][:10]}-{cpu_kind(result['machine'])}{args.tag}.json"
    path.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
