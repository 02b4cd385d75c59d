"""Prefill/decode interference on this 2-core box: one co-located server on both cores against a producer pinned to
core 0 and a consumer pinned to core 1 behind `jido router`, on `jido bench`'s mixed workload (long prompts arriving
while short prompts' streams decode). Reports p99 ITL and TTFT side by side, short and long requests apart.

Starts and stops its own servers on 127.0.0.1; takes /tmp/jido-bench.lock itself (do not wrap it in flock).

    python benchmarks/disagg_interference.py --repeats 3
"""
from __future__ import annotations

import argparse
import fcntl
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from contextlib import ExitStack, contextmanager
from pathlib import Path

from jido.bench.machine import cpu_kind, machine_info

PY = sys.executable


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait(url: str, process: subprocess.Popen, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{url}: the process exited with {process.returncode}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise RuntimeError(f"{url} did not come up in {timeout_s} s")


@contextmanager
def _process(args: list[str], cores: str, threads: int, log: Path):
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    with open(log, "wb") as out:
        process = subprocess.Popen(["taskset", "-c", cores, *args], env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        yield process
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()


def _serve(port: int, extra: list[str]) -> list[str]:
    return [PY, "-m", "jido.cli", "--log-level", "WARNING", "serve", "--port", str(port), "--dtype", "float32",
            "--kv-cache-memory", "600MiB", *extra]


def _kv(role: str, transport: str, kv_port: int) -> list[str]:
    return ["--kv-transfer-config", json.dumps({"kv_connector": transport, "kv_role": role, "kv_port": kv_port})]


def _bench(url: str, args: argparse.Namespace, out_dir: Path, name: str) -> dict:
    result = out_dir / f"{name}.json"
    subprocess.run([PY, "-m", "jido.cli", "bench", "--base-url", url, "--dataset-name", "mixed",
                    "--num-prompts", str(args.num_prompts), "--request-rate", str(args.request_rate),
                    "--random-input-len", "32", "--random-output-len", str(args.output_len),
                    "--mixed-long-len", str(args.long_len), "--mixed-long-fraction", "0.25",
                    "--mixed-long-output-len", "8", "--ignore-eos", "--seed", "0", "--disable-tqdm",
                    "--no-plots", "--result-dir", str(out_dir), "--result-filename", result.name],
                   check=True, stdout=subprocess.DEVNULL)
    return json.loads(result.read_text())


def _summary(run: dict, long_len: int) -> dict:
    """p99 ITL of the short streams, TTFT of short and long requests, from the per-request lists."""
    short = [i for i, n in enumerate(run["input_lens"]) if n < long_len // 2]
    long = [i for i, n in enumerate(run["input_lens"]) if n >= long_len // 2]
    itls = [gap for i in short for gap in run["itls"][i]]

    def pct(values: list[float], q: float) -> float:
        values = sorted(values)
        return values[min(len(values) - 1, int(q * len(values)))] * 1e3 if values else float("nan")

    ttfts = run["ttfts"]
    return {"completed": run["completed"], "failed": run["failed"], "p99_itl_ms": run["p99_itl_ms"],
            "short_p99_itl_ms": pct(itls, 0.99), "short_median_itl_ms": pct(itls, 0.5),
            "p99_ttft_ms": run["p99_ttft_ms"], "mean_ttft_ms": run["mean_ttft_ms"],
            "short_p99_ttft_ms": pct([ttfts[i] for i in short], 0.99),
            "long_median_ttft_ms": pct([ttfts[i] for i in long], 0.5),
            "output_throughput": run["output_throughput"]}


def _colocated(args: argparse.Namespace, tmp: Path) -> dict:
    port = _free_port()
    with _process(_serve(port, []), "0,1", 2, tmp / "colocated.log") as server:
        url = f"http://127.0.0.1:{port}"
        _wait(url, server)
        return _summary(_bench(url, args, tmp, f"colocated-{time.time_ns()}"), args.long_len)


def _disaggregated(args: argparse.Namespace, tmp: Path) -> dict:
    ports = [_free_port() for _ in range(5)]
    with ExitStack() as stack:
        producer = stack.enter_context(_process(_serve(ports[0], _kv("kv_producer", args.transport, ports[3])), "0", 1,
                                                tmp / "producer.log"))
        consumer = stack.enter_context(_process(_serve(ports[1], _kv("kv_consumer", args.transport, ports[4])), "1", 1,
                                                tmp / "consumer.log"))
        _wait(f"http://127.0.0.1:{ports[0]}", producer)
        _wait(f"http://127.0.0.1:{ports[1]}", consumer)
        router = stack.enter_context(_process(
            [PY, "-m", "jido.cli", "router", "--prefill", f"http://127.0.0.1:{ports[0]}", "--decode",
             f"http://127.0.0.1:{ports[1]}", "--port", str(ports[2]), "--prefill-threshold", str(args.long_len // 2)],
            "0", 1, tmp / "router.log"))
        url = f"http://127.0.0.1:{ports[2]}"
        _wait(url, router)
        return _summary(_bench(url, args, tmp, f"disagg-{time.time_ns()}"), args.long_len)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--num-prompts", type=int, default=32)
    parser.add_argument("--request-rate", type=float, default=2.0)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--long-len", type=int, default=1024)
    parser.add_argument("--transport", default="shm")
    parser.add_argument("--out", default=f"benchmarks/results/disagg_interference-{time.strftime('%Y-%m-%d')}-"
                                         f"{cpu_kind()}.json")
    args = parser.parse_args()
    runs: dict[str, list[dict]] = {"colocated": [], "disaggregated": []}
    with open("/tmp/jido-bench.lock", "w") as lock, tempfile.TemporaryDirectory() as tmp:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for _ in range(args.repeats):  # interleaved, so a slow minute of the machine hits both
            runs["colocated"].append(_colocated(args, Path(tmp)))
            runs["disaggregated"].append(_disaggregated(args, Path(tmp)))
    medians = {name: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for name, rs in runs.items()}
    report = {"date": time.strftime("%Y-%m-%d"), "machine": machine_info(), "settings": vars(args), "runs": runs,
              "medians": medians}
    Path(args.out).write_text(json.dumps(report, indent=2))
    keys = ("short_p99_itl_ms", "short_median_itl_ms", "p99_itl_ms", "short_p99_ttft_ms", "long_median_ttft_ms",
            "mean_ttft_ms", "output_throughput", "failed")
    print("| metric | co-located (2 cores) | producer core 0 + consumer core 1 | ratio |")
    print("|---|---|---|---|")
    for key in keys:
        a, b = medians["colocated"][key], medians["disaggregated"][key]
        print(f"| {key} | {a:.1f} | {b:.1f} | {b / a if a else float('nan'):.2f}x |")


if __name__ == "__main__":
    main()
