"""BenchConfig: one benchmark run's settings, validated on creation; the ``jido bench`` flags come from it."""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Literal, get_args

from jido.config import check_positive_int

DatasetName = Literal["random", "conversation", "shared-prefix", "long-doc-qa", "mixed", "rewrite", "jsonl"]
DATASETS: tuple[str, ...] = get_args(DatasetName)
SLO_KEYS = ("ttft", "tpot", "e2el")


@dataclass(frozen=True)
class BenchConfig:
    """What to send, to whom, and how fast; names follow ``vllm bench serve`` where it has one."""

    base_url: str = "http://127.0.0.1:8000"
    """The server to load: scheme, host and port."""
    model: str | None = None
    """Model name to send (default: the first id the server lists at /v1/models)."""
    endpoint: str = "/v1/completions"
    """API path the requests go to: /v1/completions, or /v1/chat/completions (a path ending so is chat)."""
    dataset_name: DatasetName = "random"
    """Workload the prompts come from (see docs/bench.md)."""
    dataset_path: str | None = None
    """The JSONL file for --dataset-name jsonl, lines like {"prompt": ..., "output_len": N} (default: none)."""
    tokenizer: str | None = None
    """A tokenizer.json (or its folder) that counts prompt tokens exactly (default: the server's /tokenize when
    it has one, else words)."""
    num_prompts: int = 100
    """Requests to send."""
    max_concurrency: int | None = None
    """Requests in flight at most (default: none, no limit)."""
    request_rate: float = math.inf
    """Requests per second of a Poisson process; inf sends them all at once."""
    burstiness: float = 1.0
    """Gamma shape of the gaps between requests: 1 is Poisson, lower is burstier."""
    random_input_len: int = 1024
    """Prompt tokens per request (random and shared-prefix: the part after the prefix)."""
    random_output_len: int = 128
    """Output tokens asked per request (max_tokens)."""
    random_range_ratio: float = 0.0
    """Lengths uniform in [len * (1 - r), len * (1 + r)], r in [0, 1)."""
    num_prefixes: int = 4
    """shared-prefix: distinct system prompts."""
    prefix_len: int = 512
    """shared-prefix: tokens in each system prompt."""
    num_documents: int = 4
    """long-doc-qa: distinct documents, each asked several questions."""
    document_len: int = 2048
    """long-doc-qa: tokens in each document."""
    mixed_long_fraction: float = 0.25
    """mixed: the share of requests that are long prompts (the rest are short prompts that decode long)."""
    mixed_long_len: int = 1024
    """mixed: prompt tokens of a long request (short ones have --random-input-len)."""
    mixed_long_output_len: int = 16
    """mixed: output tokens of a long request (short ones ask --random-output-len)."""
    goodput: str | None = None
    """SLOs in ms for goodput, "ttft=500,tpot=50" (vLLM's "ttft:500 tpot:50" works too; default: none)."""
    temperature: float = 0.0
    """Sampling temperature sent with every request."""
    ignore_eos: bool = False
    """Ask the server to generate past EOS, so every answer has its full length."""
    seed: int = 0
    """Seed of prompts, lengths and arrival times."""
    sweep_concurrency: str | None = None
    """Comma list like 1,4,16: one run per concurrency, on the same prompts (default: none)."""
    sweep_rate: str | None = None
    """Comma list like 1,2,inf: one run per request rate, on the same prompts (default: none)."""
    save_result: bool = False
    """Write the result JSON (and the plots)."""
    result_dir: str | None = None
    """Folder for the result (default: the current one)."""
    result_filename: str | None = None
    """Result file name; saves the result even without --save-result (default: one naming dataset, load and
    time)."""
    plots: bool = True
    """PNGs of the latency CDFs (and the sweep) beside a saved result."""
    disable_tqdm: bool = False
    """Hide the progress bar."""
    request_timeout_s: float = 3600.0
    """Seconds one request may take in all before it fails."""

    def __post_init__(self) -> None:
        if not self.base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must start with http:// or https://, got {self.base_url!r}")
        if not self.endpoint.startswith("/"):
            raise ValueError(f"endpoint must be a path starting with '/', got {self.endpoint!r}")
        if self.dataset_name not in DATASETS:
            raise ValueError(f"dataset_name must be one of {', '.join(DATASETS)}, got {self.dataset_name!r}")
        if self.dataset_name == "jsonl" and not self.dataset_path:
            raise ValueError("dataset_name 'jsonl' needs --dataset-path FILE.jsonl")
        for name in ("num_prompts", "random_input_len", "random_output_len", "num_prefixes", "prefix_len",
                     "num_documents", "document_len", "mixed_long_len", "mixed_long_output_len"):
            check_positive_int(name, getattr(self, name))
        if self.max_concurrency is not None:
            check_positive_int("max_concurrency", self.max_concurrency)
        if not self.request_rate > 0:
            raise ValueError(f"request_rate must be > 0 (inf sends every request at once), got {self.request_rate}")
        if not self.burstiness > 0:
            raise ValueError(f"burstiness must be > 0, got {self.burstiness}")
        if not 0 <= self.mixed_long_fraction <= 1:
            raise ValueError(f"mixed_long_fraction must be in [0, 1], got {self.mixed_long_fraction}")
        if not 0 <= self.random_range_ratio < 1:
            raise ValueError(f"random_range_ratio must be in [0, 1), got {self.random_range_ratio}")
        if self.sweep_concurrency and self.sweep_rate:
            raise ValueError("give --sweep-concurrency or --sweep-rate, not both")
        parse_slos(self.goodput)
        self.sweep_points()

    @property
    def is_chat(self) -> bool:
        return self.endpoint.rstrip("/").endswith("chat/completions")

    @property
    def slos_ms(self) -> dict[str, float]:
        return parse_slos(self.goodput)

    def sweep_points(self) -> list[BenchConfig]:
        """One config per load level of the sweep; just this one when there is no sweep."""
        if self.sweep_concurrency:
            return [replace(self, max_concurrency=int(v), sweep_concurrency=None)
                    for v in _parse_list(self.sweep_concurrency, "sweep_concurrency", int)]
        if self.sweep_rate:
            return [replace(self, request_rate=v, sweep_rate=None)
                    for v in _parse_list(self.sweep_rate, "sweep_rate", float)]
        return [self]


def parse_slos(text: str | None) -> dict[str, float]:
    """'ttft=500,tpot=50' or 'ttft:500 tpot:50' -> {'ttft': 500.0, 'tpot': 50.0} (milliseconds)."""
    slos: dict[str, float] = {}
    for item in (text or "").replace(",", " ").split():
        key, sep, value = item.replace(":", "=").partition("=")
        if not sep or key not in SLO_KEYS:
            raise ValueError(f"SLO {item!r} must look like KEY=MS with KEY one of {', '.join(SLO_KEYS)}")
        try:
            slos[key] = float(value)
        except ValueError:
            raise ValueError(f"SLO {item!r}: {value!r} is not a number of milliseconds") from None
        if slos[key] <= 0:
            raise ValueError(f"SLO {item!r} must be a positive number of milliseconds")
    return slos


def _parse_list(text: str, name: str, kind: type) -> list:
    try:
        values = [kind(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"{name} must be comma-separated {kind.__name__}s like '1,4,16', got {text!r}") from None
    if not values or any(not v > 0 for v in values):
        raise ValueError(f"{name} must list positive values like '1,4,16', got {text!r}")
    return values
