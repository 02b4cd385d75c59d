"""KV offload tiers and codecs on the default model, long-doc-qa style, with documents that do not fit the pool.

Each setting (none, cpu, disk, remote Redis, and the cpu tier with each codec) runs the same requests in
one process: ``--num-documents`` documents of ``--document-len`` tokens of pydoc text, each asked two
questions, round-robin (every document's first question, then every second one), so the second round
finds its documents evicted from the device pool. Per setting: the cold round's and the warm round's wall
time and mean TTFT, greedy agreement with ``none``, and each tier's counters. Settings are interleaved per
repeat and medians are reported; the ratios divide by ``none`` of the same repeat. Codecs are also timed
alone on real KV blocks: bytes per token (all layers), encode and decode GB/s of the raw bytes.

    flock /tmp/jido-bench.lock .venv/bin/python benchmarks/kv_offload.py \\
        --out benchmarks/results/kv_offload-<date>-<cpu kind>.md
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from jido import LLM, SamplingParams
from jido.utils.reference_text import reference_text
from jido.bench.machine import describe_machine, machine_info, now_iso
from jido.kvtransfer.codecs import make_codec

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from redis_server import redis_server  # noqa: E402  (the tests' launcher of a loopback redis-server)

QUESTION = "\n\nQuestion: what does the passage above say about {topic}? Answer briefly:"
TOPICS = ("names", "errors", "the syntax", "objects", "the rules")


def _settings(folder: str, redis_url: str) -> dict[str, dict[str, Any] | None]:
    return {"none": None, "cpu": {"cpu": "2GiB"}, "cpu-int8": {"cpu": "2GiB", "codec": "int8"},
            "cpu-cachegen": {"cpu": "2GiB", "codec": "cachegen"},
            "disk": {"disk": {"path": folder, "size": "4GiB"}}, "remote": {"remote": redis_url}}


def _prompts(llm: LLM, num_documents: int, document_len: int) -> list[list[int]]:
    """Round-robin: every document's first question, then every document's second."""
    ids = llm.get_tokenizer().encode(reference_text())
    documents = [ids[i * document_len * 3: i * document_len * 3 + document_len] for i in range(num_documents)]
    tokenizer = llm.get_tokenizer()
    return [doc + tokenizer.encode(QUESTION.format(topic=TOPICS[(d + r) % len(TOPICS)]), add_special_tokens=False)
            for r in range(2) for d, doc in enumerate(documents)]


def _timed(llm: LLM, prompt: list[int], params: SamplingParams) -> tuple[float, list[int], int]:
    """One request alone, stepped here: its TTFT (arrival to the step that gave its first token), tokens, hit."""
    engine, request_id = llm.llm_engine, f"bench-{time.monotonic_ns()}"
    start = time.perf_counter()
    engine.add_request(request_id, prompt, params)
    ttft, merged = None, None
    while engine.has_unfinished_requests():
        for delta in engine.step():
            if ttft is None and delta.outputs[0].token_ids:
                ttft = time.perf_counter() - start
            if merged is None:
                merged = delta
            else:
                merged.add(delta)
    return ttft, merged.outputs[0].token_ids, merged.num_cached_tokens


def _run_setting(offload: dict | None, args: argparse.Namespace) -> dict[str, Any]:
    llm = LLM(kv_cache_memory=args.kv_cache_memory, kv_offload=offload, max_num_seqs=1)
    prompts = _prompts(llm, args.num_documents, args.document_len)
    params = SamplingParams(temperature=0, max_tokens=args.output_len, ignore_eos=True)
    _timed(llm, list(range(1000, 1100)), params)  # warm-up: kernels, allocator
    half = len(prompts) // 2
    rounds = []
    for part in (prompts[:half], prompts[half:]):
        start, runs = time.perf_counter(), [_timed(llm, prompt, params) for prompt in part]
        rounds.append({"wall_s": time.perf_counter() - start, "mean_ttft_s": statistics.mean(r[0] for r in runs),
                       "tokens": [r[1] for r in runs], "cached_tokens": [r[2] for r in runs]})
    stats = llm.llm_engine.get_scheduler_stats().kv_connector
    codec_rows = _codec_rows(llm, args) if offload is None else None
    llm.shutdown()
    return {"rounds": rounds, "tiers": [t.__dict__ for t in stats], "codecs": codec_rows}


def _blocks(worker) -> tuple[tuple[int, ...], list[torch.Tensor]]:
    """Real KV from the cache tensors of group 0's layers (pool blocks 1..64), in the connectors' layout."""
    runner = worker.runner
    layers = tuple(i for i, g in enumerate(runner.layer_groups) if g == 0)
    dim = runner.attn_backend.block_token_dim
    return layers, [torch.stack([runner.kv_caches[layer][:, b] for layer in layers]).movedim(dim + 1, 2).clone()
                    for b in range(1, 65)]


def _codec_rows(llm: LLM, args: argparse.Namespace) -> list[dict[str, Any]]:
    layer_ids, blocks = llm.collective_rpc(_blocks)[0]
    engine = llm.llm_engine
    num_layers, num_groups = engine.model_arch.num_layers, len(engine.core.kv_plan.kv_cache_config.groups)
    block_size = blocks[0].shape[2]
    raw_bytes = sum(b.numel() * b.element_size() for b in blocks)
    rows = []
    for name in ("raw", "int8", "cachegen"):
        codec = make_codec(name, num_layers, blocks[0].dtype)
        start = time.perf_counter()
        encoded = [codec.encode(b, layer_ids) for b in blocks]
        encoded_s = time.perf_counter() - start
        start = time.perf_counter()
        decoded = [codec.decode(memoryview(e), tuple(b.shape), b.dtype, layer_ids) for e, b in zip(encoded, blocks)]
        decoded_s = time.perf_counter() - start
        error = max(float((d.float() - b.float()).abs().max()) for d, b in zip(decoded, blocks))
        entry = statistics.mean(len(e) for e in encoded)
        rows.append({"codec": name, "bytes_per_token": entry * num_groups / block_size,
                     "ratio_to_raw": sum(map(len, encoded)) / raw_bytes,
                     "encode_gb_s": raw_bytes / encoded_s / 1e9, "decode_gb_s": raw_bytes / decoded_s / 1e9,
                     "max_abs_error": error})
    return rows


def _agreement(tokens: list[list[int]], reference: list[list[int]]) -> float:
    same = sum(a == b for x, y in zip(tokens, reference) for a, b in zip(x, y))
    return same / sum(len(y) for y in reference)


def _report(runs: dict[str, list[dict]], args: argparse.Namespace) -> str:
    lines = [f"# KV offload tiers and codecs ({now_iso()[:10]})", "", describe_machine(machine_info()), "",
             f"Default model, {args.num_documents} documents x {args.document_len} tokens, 2 questions each "
             f"(round-robin), {args.output_len} output tokens, `kv_cache_memory={args.kv_cache_memory}`, "
             f"one request at a time; medians of {args.repeats} repeats, settings interleaved; ratios to `none` "
             "of the same repeat.", "",
             "| setting | cold wall s | cold / none | cold TTFT s | warm wall s | warm / none | warm TTFT s | "
             "warm cached tokens | greedy agreement | tier counters (last repeat) |", "|---|---|---|---|---|---|---|---|---|---|"]
    for name, reps in runs.items():
        def med(key: str, part: int) -> float:
            return statistics.median(r["rounds"][part][key] for r in reps)

        def ratio(part: int) -> float:
            return statistics.median(r["rounds"][part]["wall_s"] / b["rounds"][part]["wall_s"]
                                     for r, b in zip(reps, runs["none"]))
        agree = statistics.mean(_agreement(r["rounds"][p]["tokens"], b["rounds"][p]["tokens"])
                                for r, b in zip(reps, runs["none"]) for p in (0, 1))
        tiers = "; ".join(f"{t['tier']}: hits {t['hits']}, misses {t['misses']}, stored {t['stored_bytes'] >> 20} MiB, "
                          f"loaded {t['loaded_blocks']} blocks / {t['loaded_bytes'] >> 20} MiB in "
                          f"{t['load_seconds']:.2f} s, errors {t['errors']}" for t in reps[-1]["tiers"]) or "-"
        lines.append(f"| {name} | {med('wall_s', 0):.2f} | {ratio(0):.3f} | {med('mean_ttft_s', 0):.3f} | "
                     f"{med('wall_s', 1):.2f} | {ratio(1):.3f} | {med('mean_ttft_s', 1):.3f} | "
                     f"{sum(reps[-1]['rounds'][1]['cached_tokens'])} | {agree:.3f} | {tiers} |")
    codecs = runs["none"][-1]["codecs"]
    lines += ["", "Codecs on 64 real blocks of the default model's KV (one group), in this process:", "",
              "| codec | bytes / token (all layers) | size / raw | encode GB/s | decode GB/s | max abs error |",
              "|---|---|---|---|---|---|"]
    lines += [f"| {c['codec']} | {c['bytes_per_token']:.0f} | {c['ratio_to_raw']:.3f} | {c['encode_gb_s']:.2f} | "
              f"{c['decode_gb_s']:.2f} | {c['max_abs_error']:.4f} |" for c in codecs]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num-documents", type=int, default=4)
    parser.add_argument("--document-len", type=int, default=1024)
    parser.add_argument("--output-len", type=int, default=16)
    parser.add_argument("--kv-cache-memory", default="48MiB")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", default=None, help="comma list of settings (default: all)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder, redis_server(Path(folder)) as redis:
        settings = _settings(str(Path(folder) / "disk"), redis.url)
        if args.only:
            settings = {k: v for k, v in settings.items() if k == "none" or k in args.only.split(",")}
        runs: dict[str, list[dict]] = {name: [] for name in settings}
        for repeat in range(args.repeats):
            for name, offload in settings.items():
                redis.client().flushall()
                runs[name].append(_run_setting(offload, args))
                print(f"repeat {repeat} {name}: cold {runs[name][-1]['rounds'][0]['wall_s']:.2f} s, "
                      f"warm {runs[name][-1]['rounds'][1]['wall_s']:.2f} s", flush=True)
    report = _report(runs, args)
    print(report)
    if args.out is not None:
        args.out.write_text(report, encoding="utf-8")
        args.out.with_suffix(".json").write_text(json.dumps({"args": vars(args) | {"out": str(args.out)},
                                                             "machine": machine_info(), "runs": runs}, default=str))


if __name__ == "__main__":
    main()
