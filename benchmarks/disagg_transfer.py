"""KV hand-off between a producer and a consumer engine (one process, the default model): bytes per token, transfer
latency and GB/s per transport, codec and mode (pull, push layer by layer, push whole), the time to the consumer's
first token against a local prefill, and the effect of each codec and of an int8 KV consumer on greedy tokens.

Writes a calibration JSON (``jido plan --calibrate FILE``, ``jido router --calibration FILE``) and prints a
markdown table. Takes /tmp/jido-bench.lock itself (do not wrap it in flock).

    python benchmarks/disagg_transfer.py --prompt-len 1024 --repeats 3
"""
from __future__ import annotations

import argparse
import fcntl
import json
import statistics
import time
from pathlib import Path

from jido.utils.reference_text import reference_text
from jido.bench.machine import cpu_kind, machine_info
from jido.config import EngineConfig
from jido.core.sampling_params import SamplingParams
from jido.engine.llm_engine import LLMEngine

SETTINGS = [  # (transport, mode, layerwise, codec)
    ("tcp", "pull", False, "raw"), ("shm", "pull", False, "raw"),
    ("tcp", "push", True, "raw"), ("tcp", "push", False, "raw"), ("shm", "push", True, "raw"),
    ("tcp", "pull", False, "int8"), ("tcp", "pull", False, "cachegen"),
]
NUM_OUTPUT = 16


def _engine(role: str | None, transport: str = "tcp", mode: str = "pull", layerwise: bool = True,
            codec: str = "raw", **extra) -> LLMEngine:
    kwargs = dict(dtype="float32", kv_cache_memory="400MiB", **extra)
    if role is not None:
        kwargs["kv_transfer_config"] = {"kv_connector": transport, "kv_role": role, "kv_port": 0, "kv_mode": mode,
                                        "kv_layerwise": layerwise, "kv_codec": codec}
    return LLMEngine(EngineConfig.from_kwargs(**kwargs))


def _finish(engine: LLMEngine, req_id: str, prompt: list[int], params: SamplingParams, kv: dict | None = None,
            also: LLMEngine | None = None):
    engine.add_request(req_id, prompt, params, kv_transfer_params=kv)
    output = None
    while engine.has_unfinished_requests():
        for delta in engine.step():
            output = delta if output is None else (output.add(delta) or output)
        if also is not None and also.has_engine_work():
            also.step()
    while also is not None and also.has_engine_work():
        also.step()
    return output


def _prompts(engine: LLMEngine, prompt_len: int, count: int) -> list[list[int]]:
    ids = engine.tokenizer.encode(reference_text())
    return [ids[i * prompt_len:(i + 1) * prompt_len] for i in range(1, count + 1)]


def measure(setting: tuple, prompts: list[list[int]], local: list[list[int]], **consumer_extra) -> dict:
    transport, mode, layerwise, codec = setting
    producer = _engine("kv_producer", transport, mode, layerwise, codec)
    consumer = _engine("kv_consumer", transport, mode, layerwise, codec, **consumer_extra)
    host, port = consumer.kv_connector_info["address"].removeprefix("tcp://").split(":")
    ask = {"do_remote_decode": True, **({"remote_host": host, "remote_port": int(port)} if mode == "push" else {})}
    first = SamplingParams(temperature=0, max_tokens=1)
    greedy = SamplingParams(temperature=0, max_tokens=NUM_OUTPUT, ignore_eos=True)
    rows, agree = [], 0
    for i, prompt in enumerate(prompts):
        start = time.perf_counter()
        handle = _finish(producer, f"p{i}", prompt, first, ask).kv_transfer_params
        prefilled = time.perf_counter()
        consumer.add_request(f"c{i}", prompt, greedy, kv_transfer_params=handle)
        output, first_token = None, None
        while consumer.has_unfinished_requests():
            for delta in consumer.step():
                output = delta if output is None else (output.add(delta) or output)
                first_token = first_token or time.perf_counter()
            if producer.has_engine_work():
                producer.step()
        agree += sum(a == b for a, b in zip(output.outputs[0].token_ids, local[i]))
        rows.append({"prefill_s": prefilled - start, "to_first_token_s": first_token - start,
                     "consumer_s": first_token - prefilled, "transfer_s": output.metrics["kv_transfer_time"]})
    stats = consumer.get_scheduler_stats().kv_connector[0]
    sent = producer.get_scheduler_stats().kv_connector[0]
    num_tokens = sum(len(p) - 1 for p in prompts)
    transfer = statistics.median(r["transfer_s"] for r in rows[1:] or rows)
    result = {"transport": transport, "mode": mode, "layerwise": layerwise, "codec": codec,
              "bytes_per_token": stats.received_bytes / num_tokens, "received_bytes": stats.received_bytes,
              "median_transfer_s": transfer, "median_prefill_s": statistics.median(r["prefill_s"] for r in rows),
              "median_consumer_s": statistics.median(r["consumer_s"] for r in rows),
              "median_to_first_token_s": statistics.median(r["to_first_token_s"] for r in rows),
              "gb_s": stats.received_bytes / len(prompts) / transfer / 1e9 if transfer > 0 else None,
              "sender_s": sent.sent_seconds / max(sent.sent, 1), "greedy_agreement": agree / (NUM_OUTPUT * len(prompts)),
              "failed": stats.failed}
    producer.shutdown()
    consumer.shutdown()
    return result


def _local(prompts: list[list[int]], **extra) -> tuple[list[list[int]], float]:
    engine = _engine(None, **extra)
    params = SamplingParams(temperature=0, max_tokens=NUM_OUTPUT, ignore_eos=True)
    tokens, times = [], []
    for i, prompt in enumerate(prompts):
        start = time.perf_counter()
        tokens.append(_finish(engine, f"l{i}", prompt, params).outputs[0].token_ids)
        times.append(time.perf_counter() - start)
    once = SamplingParams(temperature=0, max_tokens=1)
    prefill = []
    for i, prompt in enumerate(prompts):
        engine.reset_prefix_cache()
        start = time.perf_counter()
        _finish(engine, f"t{i}", prompt, once)
        prefill.append(time.perf_counter() - start)
    engine.shutdown()
    return tokens, statistics.median(prefill)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--prompt-len", type=int, default=1024)
    parser.add_argument("--num-prompts", type=int, default=4)
    parser.add_argument("--out", default=f"benchmarks/results/disagg_transfer-{time.strftime('%Y-%m-%d')}-"
                                         f"{cpu_kind()}.json")
    args = parser.parse_args()
    with open("/tmp/jido-bench.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        probe = _engine(None)
        prompts = _prompts(probe, args.prompt_len, args.num_prompts)
        probe.shutdown()
        local, local_prefill = _local(prompts)
        int8_local, _ = _local(prompts, kv_cache_dtype="int8")
        results = [measure(s, prompts, local) for s in SETTINGS]
        # Precision per role: a float32 producer, an int8-KV consumer (it quantizes the rows it receives).
        int8 = measure(("tcp", "pull", False, "raw"), prompts, local, kv_cache_dtype="int8")
        int8_own = sum(a == b for t, r in zip(int8_local, local) for a, b in zip(t, r)) / (NUM_OUTPUT * len(prompts))
    report = {"date": time.strftime("%Y-%m-%d"), "machine": machine_info(), "prompt_len": args.prompt_len,
              "num_prompts": args.num_prompts, "local_prefill_s": local_prefill, "results": results}
    raw = next(r for r in results if r["transport"] == "shm" and r["mode"] == "pull")
    fixed = max(0.0, raw["median_consumer_s"] - raw["median_transfer_s"])
    report["calibration"] = {
        "prefill_s_per_token": local_prefill / args.prompt_len,
        "transfer_s_per_token": raw["median_transfer_s"] / args.prompt_len, "transfer_fixed_s": fixed,
        "links": {f"jido-{r['transport']}": {"gb_s": r["gb_s"], "latency_us": 1e6 * fixed, "same_node": True,
                                             "source": f"measured by benchmarks/disagg_transfer.py {report['date']}"}
                  for r in results if r["codec"] == "raw" and r["mode"] == "pull"},
        "wire": {f"jido-{r['codec']}": {"ratio": r["bytes_per_token"] / raw["bytes_per_token"], "codec_gb_s": None,
                                        "source": f"measured by benchmarks/disagg_transfer.py {report['date']}"}
                 for r in results if r["codec"] != "raw"},
    }
    report["int8_kv_consumer"] = {"agreement_with_float32": int8["greedy_agreement"],
                                  "local_int8_kv_agreement_with_float32": int8_own,
                                  "bytes_per_token": int8["bytes_per_token"]}
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(f"local prefill of {args.prompt_len} tokens: {local_prefill * 1e3:.0f} ms")
    print("| transport | mode | codec | B/token | transfer ms | GB/s | consumer to 1st token ms | prefill ms | agree |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in results:
        mode = r["mode"] + (" layer-wise" if r["mode"] == "push" and r["layerwise"] else " whole" if r["mode"] == "push" else "")
        print(f"| {r['transport']} | {mode} | {r['codec']} | {r['bytes_per_token']:.0f} | {r['median_transfer_s'] * 1e3:.1f}"
              f" | {r['gb_s'] or 0:.2f} | {r['median_consumer_s'] * 1e3:.0f} | {r['median_prefill_s'] * 1e3:.0f} |"
              f" {r['greedy_agreement']:.2f} |")
    print(f"float32 producer -> int8-KV consumer: greedy agreement with float32 {int8['greedy_agreement']:.2f} "
          f"(a co-located int8-KV run: {int8_own:.2f})")


if __name__ == "__main__":
    main()
