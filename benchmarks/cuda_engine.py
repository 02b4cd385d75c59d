"""The engine on a CUDA GPU: greedy agreement with the CPU, and speed per attention backend and quantization.

No checkpoint can be downloaded where the GPU is lent, so the models are random, written here in the shapes of
real ones (Gemma 3 270M, Qwen2.5 1.5B) with a word-level tokenizer over their vocabularies; speed does not
depend on the weights' values.

1. Agreement: a tiny random Gemma 3 in float32, greedy, on cuda with each backend against the same run on CPU
   (the engine's reference, made beforehand by ``--write-reference`` on a CPU machine): token ids must be equal.
2. For each model shape, backend (torch, triton), quantization (none, fp8), mode (CUDA graphs or eager) and layer
   ops (triton: jido.layers.triton_ops' fused kernels, as shipped; torch: PyTorch's ops), in bfloat16:
   - greedy agreement of 8 prompts x 32 tokens with the first combination's run (first divergence),
   - batch 1: one 128-token prompt, 256 greedy tokens: decode tok/s and median TPOT,
   - 64 streams: 64 prompts of 256 tokens, 128 tokens each, submitted together: output tok/s,
   - a 2,000-token prompt: TTFT (one output token), median of 3.

    python benchmarks/cuda_engine.py --write-reference     # here: .gpu-ref/ (tiny model, CPU greedy tokens)
    python benchmarks/cuda_engine.py --out results-dir     # on a machine with a CUDA GPU, .gpu-ref/ carried
"""
from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import statistics
import tempfile
import time
import traceback
from pathlib import Path
from unittest import mock

import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import AutoModelForCausalLM, Gemma3TextConfig, Qwen2Config

from jido import LLM, SamplingParams
from jido.layers import activation, rms_norm, rotary

SHAPES = {
    "gemma-3-270m-shape": lambda: Gemma3TextConfig(
        vocab_size=262144, hidden_size=640, intermediate_size=2048, num_hidden_layers=18, num_attention_heads=4,
        num_key_value_heads=1, head_dim=256, max_position_embeddings=32768, sliding_window=512,
        query_pre_attn_scalar=256, layer_types=(["sliding_attention"] * 5 + ["full_attention"]) * 3,
        rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}},
        tie_word_embeddings=True, bos_token_id=2, eos_token_id=1, pad_token_id=0),
    "qwen2.5-1.5b-shape": lambda: Qwen2Config(
        vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
        num_key_value_heads=2, max_position_embeddings=32768, rope_theta=1e6, tie_word_embeddings=True,
        bos_token_id=2, eos_token_id=1, pad_token_id=0),
}

REFERENCE_STD = 0.05  # weights of the tiny model: its greedy runs change token often, so agreement means something
TINY = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
            num_key_value_heads=1, head_dim=16, max_position_embeddings=512, query_pre_attn_scalar=24,
            sliding_window=8, layer_types=["sliding_attention", "full_attention", "sliding_attention"],
            final_logit_softcapping=3.0, bos_token_id=2, eos_token_id=1, pad_token_id=0)

def write_random_model(folder: Path, config, std: float, seed: int = 0) -> Path:
    """A random checkpoint of ``config``'s shape, made on the GPU, with a tokenizer of one word per id."""
    torch.manual_seed(seed)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):  # fast init of 1.5B weights
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16 if config.vocab_size > 1000
                                                 else torch.float32)
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.normal_(0.0, 0.1 if "norm" in name else std)
    model.save_pretrained(folder)
    vocab = {f"w{i}": i for i in range(config.vocab_size)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"bos_token": "w2", "eos_token": "w1"}))
    return folder

def prompts(count: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab, (count, length), generator=gen).tolist()

def greedy(llm: LLM, token_prompts: list[list[int]], tokens: int) -> list[list[int]]:
    params = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True)
    return [list(out.outputs[0].token_ids) for out in llm.generate(token_prompts, params, use_tqdm=False)]

def first_divergence(ours: list[list[int]], reference: list[list[int]]) -> list[int | None]:
    """Per prompt, the index of the first token that differs (None: all equal)."""
    return [next((i for i, (a, b) in enumerate(zip(x, y)) if a != b), None) for x, y in zip(ours, reference)]

def write_cpu_reference(folder: Path) -> None:
    """The tiny model and the CPU engine's greedy tokens on it (float32, torch backend), for ``--reference``.

    Made where the benchmark is prepared, so the GPU machine neither builds jido's CPU kernels nor runs on its CPU.
    """
    write_random_model(folder / "tiny", Gemma3TextConfig(**TINY), std=REFERENCE_STD)
    token_prompts = prompts(4, 40, TINY["vocab_size"], seed=1)
    llm = LLM(model=str(folder / "tiny"), device="cpu", dtype="float32", attention_backend="torch")
    (folder / "expected.json").write_text(json.dumps({"prompts": token_prompts,
                                                      "tokens": greedy(llm, token_prompts, 48)}))

def agreement_with_cpu(reference: Path, backends: list[str], modes: list[str]) -> dict:
    """Per backend and mode, the first token per prompt where cuda float32 differs from the CPU's run (None: none)."""
    expected = json.loads((reference / "expected.json").read_text())
    result = {}
    for backend, mode in itertools.product(backends, modes):
        try:
            llm = LLM(model=str(reference / "tiny"), device="cuda", dtype="float32", attention_backend=backend,
                      enforce_eager=mode == "eager")
            result[f"{backend} {mode}"] = first_divergence(greedy(llm, expected["prompts"], 48), expected["tokens"])
            del llm
        except Exception as error:
            result[f"{backend} {mode}"] = f"{type(error).__name__}: {error}"
            traceback.print_exc()
    return result

def layer_ops(kind: str) -> contextlib.AbstractContextManager:
    """``triton``: the layers as shipped; ``torch``: every layer op by PyTorch's ops (the fused kernels hidden)."""
    if kind == "triton":
        return contextlib.nullcontext()
    stack = contextlib.ExitStack()
    for module in (rms_norm, rotary, activation):
        stack.enter_context(mock.patch.object(module, "triton_ops_for", lambda x: None))
    return stack

def time_workloads(llm: LLM, vocab: int) -> dict:
    decode = SamplingParams(temperature=0.0, max_tokens=256, ignore_eos=True)
    # Warm-up: every kernel these workloads launch compiled first (Triton compiles a kernel per shape class, and
    # the first timed run of a process otherwise paid for them: 64 streams 3.5x slower than the next run).
    greedy(llm, prompts(2, 64, vocab, seed=9), 16)
    greedy(llm, prompts(64, 256, vocab, seed=8), 2)
    greedy(llm, prompts(1, 2000, vocab, seed=7), 1)
    start = time.perf_counter()
    out = llm.generate(prompts(1, 128, vocab, seed=2), decode, use_tqdm=False)[0]
    elapsed = time.perf_counter() - start
    stats = out.metrics
    batch = SamplingParams(temperature=0.0, max_tokens=128, ignore_eos=True)
    start = time.perf_counter()
    outs = llm.generate(prompts(64, 256, vocab, seed=3), batch, use_tqdm=False)
    batch_s = time.perf_counter() - start
    ttfts = []
    for seed in range(3):
        start = time.perf_counter()
        llm.generate(prompts(1, 2000, vocab, seed=10 + seed), SamplingParams(max_tokens=1), use_tqdm=False)
        ttfts.append(time.perf_counter() - start)
    return {"batch1_tok_s": 256 / elapsed, "batch1_metrics": stats,
            "streams64_out_tok_s": sum(len(o.outputs[0].token_ids) for o in outs) / batch_s,
            "prefill2k_ttft_ms": 1e3 * statistics.median(ttfts)}

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--reference", type=Path, default=Path(".gpu-ref"),
                        help="the CPU reference folder (made by --write-reference, here on a CPU machine)")
    parser.add_argument("--write-reference", action="store_true", help="write --reference and stop")
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--backends", nargs="+", default=["torch", "triton"])
    parser.add_argument("--quantizations", nargs="+", default=["none", "fp8"])
    parser.add_argument("--modes", nargs="+", default=["graphs", "eager"], choices=["graphs", "eager"],
                        help="decode from CUDA graphs (where the backend supports them) or enforce_eager")
    parser.add_argument("--layer-ops", nargs="+", default=["triton"], choices=["triton", "torch"],
                        help="the layers' norm, RoPE and activation by jido's Triton kernels or PyTorch's ops")
    parser.add_argument("--device", default="cuda", help="cpu only to try the script itself (tiny shapes are slow)")
    args = parser.parse_args()
    if args.write_reference:
        write_cpu_reference(args.reference)
        return
    args.out.mkdir(parents=True, exist_ok=True)
    report = {"device": torch.cuda.get_device_name() if args.device == "cuda" else args.device,
              "torch": torch.__version__, "runs": []}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        if args.device == "cuda" and (args.reference / "expected.json").exists():
            report["agreement_with_cpu_float32"] = agreement_with_cpu(args.reference, args.backends, args.modes)
            print("float32 first divergence from CPU per prompt:", report["agreement_with_cpu_float32"], flush=True)
        for shape in args.shapes:
            config = SHAPES[shape]()
            # Large enough that the logits are not near-uniform (their std ~1.3 at Gemma's width), so greedy
            # agreement between runs means something.
            folder = write_random_model(root / shape, config, std=0.05)
            check_prompts = prompts(8, 64, config.vocab_size, seed=4)
            reference = None
            for backend, quantization, mode, ops in itertools.product(args.backends, args.quantizations, args.modes,
                                                                     args.layer_ops):
                run = {"shape": shape, "backend": backend, "quantization": quantization, "mode": mode,
                       "layer_ops": ops}
                try:
                    with layer_ops(ops):
                        start = time.perf_counter()
                        llm = LLM(model=str(folder), device=args.device, dtype="bfloat16", attention_backend=backend,
                                  quantization=quantization, kv_cache_memory="16GiB", max_model_len=4096,
                                  max_num_seqs=64, max_num_batched_tokens=8192, enforce_eager=mode == "eager")
                        run["load_s"] = time.perf_counter() - start
                        run["graphs"] = llm.collective_rpc(lambda worker: worker.runner.decode_graphs is not None)[0]
                        tokens = greedy(llm, check_prompts, 32)
                        reference = reference or tokens
                        run["first_divergence_from_first_run"] = first_divergence(tokens, reference)
                        run.update(time_workloads(llm, config.vocab_size))
                        del llm
                    torch.cuda.empty_cache()
                except Exception as error:  # one failing combination must not hide the others' figures
                    run["error"] = f"{type(error).__name__}: {error}"
                    traceback.print_exc()
                print(json.dumps(run), flush=True)
                report["runs"].append(run)
            (args.out / "cuda_engine.json").write_text(json.dumps(report, indent=2))
    (args.out / "cuda_engine.json").write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
