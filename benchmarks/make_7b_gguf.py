"""A Qwen2.5-7B-shaped GGUF with seeded random weights, quantized to Q4_K_M by llama.cpp's own llama-quantize.

jido and llama.cpp then run the same bytes at a size where weight streaming dominates (issue 52 item 4), without
downloading 7B weights. The file has Qwen2.5-7B's shape (architecture qwen2: 28 layers, hidden 3584, FFN 18944,
28 query and 4 KV heads of 128, q/k/v biases, an untied output head) and the vocabulary, tokenizer and chat template
of the Qwen2.5-Coder-0.5B-Instruct GGUF that jido already has (151936 tokens, which sizes the embedding and the head;
Qwen2.5-7B's own has 152064, 128 more rows in each).

Speed and memory do not depend on the values, so timings and resident sizes measured on this file stand for the
real 7B model's; perplexity, agreement or any other quality figure from it means nothing. Random weights may emit
an end-of-sequence token anywhere, so measure with fixed output lengths (ignore EOS).

The F16 file (15.2 GB) is written tensor by tensor, so the model never sits in memory (1.4 GB resident at the peak,
one embedding-sized tensor), then llama-quantize makes the Q4_K_M file (4.7 GB) and the F16 file is deleted. On a
2-core Xeon (2026-12-07) writing took 3 minutes and quantizing 9. llama-quantize comes from
`benchmarks/compare.py --peers llama.cpp --setup-only`.

    flock /tmp/jido-bench.lock .venv/bin/python benchmarks/make_7b_gguf.py [--seed 0] [--keep-f16] \\
        [--out ~/.cache/jido/gguf/qwen2.5-7b-shape-random-q4_k_m.gguf]
"""
from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGUFReader, GGUFValueType, GGUFWriter, LlamaFileType

from compare import llama_build_dir
from jido.models import gguf as jido_gguf
from jido.models.named import cache_root

TOKENIZER_SOURCE = cache_root() / "gguf" / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
DEFAULT_OUT = cache_root() / "gguf" / "qwen2.5-7b-shape-random-q4_k_m.gguf"
MATRIX_STD = 0.02
BIAS_STD = 0.001
CHUNK_ELEMENTS = 1 << 24  # random values drawn per call: 64 MiB of float32


@dataclass(frozen=True)
class Shape:
    """Qwen2.5-7B's config.json, in the terms of llama.cpp's qwen2 keys."""

    num_layers: int = 28
    hidden_size: int = 3584
    intermediate_size: int = 18944
    num_heads: int = 28
    num_kv_heads: int = 4
    context_length: int = 32768
    rope_theta: float = 1e6
    rms_norm_eps: float = 1e-6

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_heads or self.num_heads % self.num_kv_heads:
            raise ValueError(f"hidden_size {self.hidden_size} must split into {self.num_heads} heads, and those into "
                             f"{self.num_kv_heads} KV groups")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]  # numpy order, [out_features, in_features]; GGUF stores it innermost-first
    kind: str  # "matrix" (F16, normal), "bias" (F32, small normal) or "norm" (F32, ones)

    @property
    def dtype(self) -> type:
        return np.float16 if self.kind == "matrix" else np.float32

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape)) * np.dtype(self.dtype).itemsize


def tensor_specs(shape: Shape, vocab_size: int) -> list[TensorSpec]:
    """Every tensor under the names llama.cpp's qwen2 loader looks up, in the order they are written."""
    hidden, kv_width, ffn = shape.hidden_size, shape.num_kv_heads * shape.head_dim, shape.intermediate_size
    specs = [TensorSpec("token_embd.weight", (vocab_size, hidden), "matrix")]
    for layer in range(shape.num_layers):
        block = f"blk.{layer}."
        specs += [TensorSpec(block + "attn_norm.weight", (hidden,), "norm"),
                  TensorSpec(block + "attn_q.weight", (hidden, hidden), "matrix"),
                  TensorSpec(block + "attn_q.bias", (hidden,), "bias"),
                  TensorSpec(block + "attn_k.weight", (kv_width, hidden), "matrix"),
                  TensorSpec(block + "attn_k.bias", (kv_width,), "bias"),
                  TensorSpec(block + "attn_v.weight", (kv_width, hidden), "matrix"),
                  TensorSpec(block + "attn_v.bias", (kv_width,), "bias"),
                  TensorSpec(block + "attn_output.weight", (hidden, hidden), "matrix"),
                  TensorSpec(block + "ffn_norm.weight", (hidden,), "norm"),
                  TensorSpec(block + "ffn_gate.weight", (ffn, hidden), "matrix"),
                  TensorSpec(block + "ffn_up.weight", (ffn, hidden), "matrix"),
                  TensorSpec(block + "ffn_down.weight", (hidden, ffn), "matrix")]
    # Untied, as in Qwen2.5-7B: the head is its own matrix, read on every decode step.
    return specs + [TensorSpec("output_norm.weight", (hidden,), "norm"),
                    TensorSpec("output.weight", (vocab_size, hidden), "matrix")]


def random_values(spec: TensorSpec, rng: np.random.Generator) -> np.ndarray:
    if spec.kind == "norm":
        return np.ones(spec.shape, dtype=np.float32)
    if spec.kind == "bias":
        return rng.standard_normal(spec.shape, dtype=np.float32) * BIAS_STD
    out = np.empty(spec.shape, dtype=np.float16)
    rows_per_chunk = max(1, CHUNK_ELEMENTS // spec.shape[1])
    for start in range(0, spec.shape[0], rows_per_chunk):
        chunk = rng.standard_normal((min(rows_per_chunk, spec.shape[0] - start), spec.shape[1]), dtype=np.float32)
        chunk *= MATRIX_STD
        out[start:start + len(chunk)] = chunk
    return out


def copy_tokenizer(writer: GGUFWriter, source: GGUFReader) -> int:
    """Copy every tokenizer.* key (vocabulary, merges, token types, special ids, chat template); returns the vocab size."""
    for key, field in source.fields.items():
        if not key.startswith("tokenizer."):
            continue
        if field.types[0] == GGUFValueType.ARRAY:
            writer.add_key_value(key, field.contents(), GGUFValueType.ARRAY, sub_type=field.types[-1])
        else:
            writer.add_key_value(key, field.contents(), field.types[0])
    return len(source.fields["tokenizer.ggml.tokens"].data)


def add_shape(writer: GGUFWriter, shape: Shape, seed: int) -> None:
    writer.add_type("model")
    writer.add_name(f"qwen2.5-7b-shape-random-seed{seed}")
    writer.add_file_type(LlamaFileType.MOSTLY_F16)
    writer.add_block_count(shape.num_layers)
    writer.add_context_length(shape.context_length)
    writer.add_embedding_length(shape.hidden_size)
    writer.add_feed_forward_length(shape.intermediate_size)
    writer.add_head_count(shape.num_heads)
    writer.add_head_count_kv(shape.num_kv_heads)
    writer.add_rope_freq_base(shape.rope_theta)
    writer.add_layer_norm_rms_eps(shape.rms_norm_eps)


def write_f16(path: Path, shape: Shape, seed: int) -> int:
    """Write the F16 GGUF tensor by tensor; returns the number of parameters."""
    writer = GGUFWriter(path, "qwen2")
    add_shape(writer, shape, seed)
    vocab_size = copy_tokenizer(writer, GGUFReader(TOKENIZER_SOURCE))
    specs = tensor_specs(shape, vocab_size)
    for spec in specs:
        writer.add_tensor_info(spec.name, spec.shape, np.dtype(spec.dtype), spec.nbytes)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    rng = np.random.default_rng(seed)
    # NOTE: write_tensor_data takes the tensors in add_tensor_info's order; it pops the next info and checks the size.
    for spec in specs:
        writer.write_tensor_data(random_values(spec, rng))
    writer.close()
    return sum(int(np.prod(spec.shape)) for spec in specs)


def llama_quantize() -> Path:
    binary = llama_build_dir() / "bin" / "llama-quantize"
    if not binary.exists():
        raise FileNotFoundError(f"{binary} is missing; build it with "
                                "`.venv/bin/python benchmarks/compare.py --peers llama.cpp --setup-only`")
    return binary


def quantize(f16: Path, out: Path, threads: int) -> None:
    """Q4_K_M by llama-quantize, written under a temporary name so that a cut-short run leaves no file at `out`."""
    partial = out.with_name(out.name + ".partial")
    done = subprocess.run([str(llama_quantize()), str(f16), str(partial), "Q4_K_M", str(threads)],
                          capture_output=True, text=True, check=False)
    if done.returncode:
        partial.unlink(missing_ok=True)
        raise RuntimeError(f"llama-quantize exited {done.returncode}:\n{done.stderr[-3000:]}")
    os.replace(partial, out)


def check_config(path: Path, shape: Shape) -> dict[str, Any]:
    """jido's config for the file, checked against the shape it was written with."""
    config = jido_gguf.hf_config(jido_gguf.open_gguf(path))
    expected = {"num_hidden_layers": shape.num_layers, "hidden_size": shape.hidden_size,
                "intermediate_size": shape.intermediate_size, "num_attention_heads": shape.num_heads,
                "num_key_value_heads": shape.num_kv_heads, "head_dim": shape.head_dim,
                "max_position_embeddings": shape.context_length, "rope_theta": shape.rope_theta,
                "tie_word_embeddings": False}
    wrong = {key: (config[key], value) for key, value in expected.items() if config[key] != value}
    if wrong:
        raise RuntimeError(f"jido reads {path} with the wrong config, (read, written): {wrong}")
    return config


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0, help="numpy generator seed for the weights")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="the Q4_K_M file")
    parser.add_argument("--keep-f16", action="store_true", help="keep the F16 file next to --out")
    parser.add_argument("--threads", type=int, default=2, help="llama-quantize threads")
    parser.add_argument("--num-layers", type=int, default=Shape.num_layers,
                        help="fewer layers for a quick check of the pipeline (widths stay 7B's)")
    args = parser.parse_args()
    shape = Shape(num_layers=args.num_layers)
    llama_quantize()  # fail before the 15 GB write, not after it
    args.out.parent.mkdir(parents=True, exist_ok=True)
    f16 = args.out.with_name(f"qwen2.5-7b-shape-random-seed{args.seed}-f16.gguf")
    free = shutil.disk_usage(args.out.parent).free
    if free < 20e9:
        raise OSError(f"{args.out.parent} has {free / 1e9:.1f} GB free; the F16 file and the Q4_K_M one need 20 GB")

    start = time.perf_counter()
    num_params = write_f16(f16, shape, args.seed)
    generate_s = time.perf_counter() - start
    peak_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6  # ru_maxrss is in KiB on Linux
    print(f"F16: {f16} {f16.stat().st_size / 1e9:.2f} GB, {num_params / 1e9:.2f}B parameters, {generate_s:.0f} s, "
          f"peak resident {peak_gb:.1f} GB", flush=True)
    start = time.perf_counter()
    quantize(f16, args.out, args.threads)
    quantize_s = time.perf_counter() - start
    print(f"Q4_K_M: {args.out} {args.out.stat().st_size / 1e9:.2f} GB, {quantize_s:.0f} s", flush=True)
    if not args.keep_f16:
        f16.unlink()
    print(f"jido config: {check_config(args.out, shape)}")


if __name__ == "__main__":
    main()
