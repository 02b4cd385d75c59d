"""fp8 linear (jido.layers.fp8_linear) against bf16 F.linear on a CUDA GPU: time, TFLOP/s, error.

For layer shapes of Gemma 3 270M, Qwen2.5 1.5B and Llama 3 8B, and row counts from decode (1, 16) to prefill
(1,024, 8,192): the whole fp8 call (x rounded per token to e4m3, then ``torch._scaled_mm``), the matmul alone,
and bf16 ``F.linear``, each the median of CUDA-event timings after warm-up. Error: the relative Frobenius
distance of each output from float32 ``x @ W.T``.

    python benchmarks/fp8_gpu.py [--out FILE.md]
"""
from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from benchmarks.attention_triton_gpu import cuda_time
from jido.layers.fp8_linear import fp8_linear, quantize_rows, quantize_rows_reference

H200_BF16_DENSE_TFLOPS = 989.0  # the fp8 dense peak is twice this
LAYERS = {  # (out_features, in_features)
    "gemma-270m qkv": (1536, 640), "gemma-270m gate_up": (4096, 640), "gemma-270m down": (640, 2048),
    "gemma-270m head": (262144, 640), "qwen-1.5b gate_up": (17920, 1536), "qwen-1.5b down": (1536, 8960),
    "llama-8b qkv": (6144, 4096), "llama-8b gate_up": (28672, 4096), "llama-8b down": (4096, 14336),
}
ROWS = (1, 16, 1024, 8192)


def timed(fn) -> float:
    """Median seconds per call of 30, after 5 warm-up calls."""
    return cuda_time(fn, iters=30, warmup=5)


def check_kernel_bits(gen: torch.Generator) -> None:
    """How far the Triton kernel's codes and scales are from PyTorch's (rows of zeros and outliers too): codes that
    differ, the largest difference in e4m3 steps, and scales that differ in any bit."""
    for rows, cols, dtype in ((1, 640, torch.bfloat16), (33, 1536, torch.bfloat16), (300, 8960, torch.float32),
                              (7, 14336, torch.bfloat16), (5, 40, torch.float16)):
        x = (torch.randn(rows, cols, generator=gen, device="cuda") * 3).to(dtype)
        x[0, 0] = 1e4
        if rows > 2:
            x[2] = 0
        codes, scale = quantize_rows(x)
        ref_codes, ref_scale = quantize_rows_reference(x)
        differ = int((codes.view(torch.uint8) != ref_codes.view(torch.uint8)).sum())
        # Adjacent e4m3 values of one sign are adjacent bytes: the byte difference counts steps.
        steps = int((codes.view(torch.uint8).int() - ref_codes.view(torch.uint8).int()).abs().max())
        scales = int((scale != ref_scale).sum())
        print(f"kernel vs PyTorch {rows}x{cols} {dtype}: {differ} of {codes.numel()} codes differ (at most {steps} "
              f"step), {scales} of {rows} scales differ", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    gen = torch.Generator("cuda").manual_seed(0)
    check_kernel_bits(gen)
    lines = [f"# fp8 linear vs bf16 on {torch.cuda.get_device_name()}, torch {torch.__version__}", "",
             "| layer | rows | bf16 ms | bf16 TFLOP/s | fp8 ms (whole) | fp8 matmul ms | speed-up (whole) | "
             "bf16 err | fp8 err |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    print("\n".join(lines), flush=True)
    for name, (out_features, in_features) in LAYERS.items():
        w = torch.randn(out_features, in_features, generator=gen, device="cuda") * 0.02
        w_bf16 = w.bfloat16()
        codes, scale = quantize_rows(w)
        scale = scale.reshape(1, -1)
        for rows in ROWS:
            x = torch.randn(rows, in_features, generator=gen, device="cuda").bfloat16()
            exact = x.float() @ w.t()
            x_codes, x_scale = quantize_rows(x)
            bf16_s = timed(lambda: F.linear(x, w_bf16))
            fp8_s = timed(lambda: fp8_linear(x, codes, scale, None))
            mm_s = timed(lambda: torch._scaled_mm(x_codes, codes.t(), scale_a=x_scale, scale_b=scale,
                                                  out_dtype=torch.bfloat16))
            errors = [float((out.float() - exact).norm() / exact.norm())
                      for out in (F.linear(x, w_bf16), fp8_linear(x, codes, scale, None))]
            tflops = 2 * rows * in_features * out_features / bf16_s / 1e12
            line = (f"| {name} | {rows} | {bf16_s * 1e3:.4f} | {tflops:.1f} | {fp8_s * 1e3:.4f} | {mm_s * 1e3:.4f} "
                    f"| {bf16_s / fp8_s:.2f}x | {errors[0]:.1e} | {errors[1]:.1e} |")
            print(line, flush=True)
            lines.append(line)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
