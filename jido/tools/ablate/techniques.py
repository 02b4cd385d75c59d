"""The registry of techniques `jido ablate` can toggle: each one's values, their `jido serve` flags, its baseline.

A later issue's technique registers here, in one place, and becomes available by itself once `jido serve`
has its flags: a value whose flags (or choice) this jido lacks is reported unavailable, never faked.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

# seed 004's order of application, after measuring: scheduler knobs first, scale-out last.
STAGES: dict[str, str] = {
    "scheduler": "batching/scheduler knobs",
    "prefix-caching": "prefix caching",
    "quantization": "quantization",
    "speculative": "speculative decoding",
    "scale-out": "scale-out",
}


@dataclass(frozen=True)
class Setting:
    """One value of a technique and the `jido serve` flags that select it."""

    value: str
    serve_args: tuple[str, ...] = ()


@dataclass(frozen=True)
class Technique:
    """A serving technique and the values `jido ablate` compares.

    ``values[0]`` is the technique off (the plain engine's value, or the knob's usual one): every value's gain
    is measured from it. ``baseline`` names the value the baseline server runs, jido's default, so the
    baseline is the engine as users get it and each variant server changes one technique.
    """

    name: str
    stage: str  # a key of STAGES
    summary: str
    values: tuple[Setting, ...]
    baseline: str

    def __post_init__(self) -> None:
        if self.stage not in STAGES:
            raise ValueError(f"technique {self.name!r}: stage must be one of {list(STAGES)}, got {self.stage!r}")
        if len(self.values) < 2:
            raise ValueError(f"technique {self.name!r} needs a value besides off to compare")
        if self.baseline not in [v.value for v in self.values]:
            raise ValueError(f"technique {self.name!r}: baseline {self.baseline!r} is none of its values")

    @property
    def off(self) -> Setting:
        return self.values[0]

    def setting(self, value: str) -> Setting:
        return next(s for s in self.values if s.value == value)


def _flag(flag: str, values: tuple[str, ...]) -> tuple[Setting, ...]:
    """Values chosen by one flag, ``--flag value``; the first is off."""
    return tuple(Setting(v, (flag, v)) for v in values)


def _switch(flag: str) -> tuple[Setting, ...]:
    """Off and on behind a boolean flag: ``--no-flag``, ``--flag``."""
    return Setting("off", ("--no-" + flag.removeprefix("--"),)), Setting("on", (flag,))


def _json(flag: str, label: str, value: dict) -> tuple[Setting, ...]:
    """Off (the flag absent) and on, ``--flag '{...}'``."""
    return Setting("off"), Setting(label, (flag, json.dumps(value)))


TECHNIQUES: dict[str, Technique] = {t.name: t for t in (
    Technique("batching", "scheduler", "how waiting requests join the batch (--scheduling-mode)",
              _flag("--scheduling-mode", ("static", "dynamic", "continuous")), "continuous"),
    Technique("chunked-prefill", "scheduler", "long prompts split across steps beside decodes",
              _switch("--enable-chunked-prefill"), "on"),
    Technique("max-num-seqs", "scheduler", "requests running at once",
              _flag("--max-num-seqs", ("128", "4", "16")), "128"),
    Technique("max-num-batched-tokens", "scheduler", "tokens one step computes",
              _flag("--max-num-batched-tokens", ("2048", "512", "8192")), "2048"),
    Technique("scheduling-policy", "scheduler", "which waiting request goes first",
              _flag("--scheduling-policy", ("fcfs", "lpm")), "fcfs"),
    Technique("preemption-mode", "scheduler", "what a request preempted for KV blocks loses (swap: a CPU copy)",
              _flag("--preemption-mode", ("recompute", "swap")), "recompute"),
    Technique("attention-backend", "scheduler", "the attention kernels (torch: the readable reference)",
              _flag("--attention-backend", ("torch", "tiled", "triton")), "tiled"),
    # On a CPU both settings run eager (jido captures CUDA graphs only on CUDA): the rows then measure the same.
    Technique("compilation", "scheduler", "decode steps replayed from CUDA graphs (off: --enforce-eager)",
              (Setting("off", ("--enforce-eager",)), Setting("on")), "on"),
    Technique("prefix-caching", "prefix-caching", "reuse the KV blocks of shared prompt prefixes",
              _switch("--enable-prefix-caching"), "on"),
    Technique("kv-offload", "prefix-caching", "evicted KV blocks kept in CPU memory and loaded back on a hit",
              _json("--kv-offload", "cpu-4GiB", {"cpu": "4GiB"}), "off"),
    Technique("quantization", "quantization", "weights stored and multiplied quantized",
              _flag("--quantization", ("none", "gguf", "gguf_w8a8", "int8", "int4", "w8a8", "fp8")), "gguf"),
    Technique("kv-cache-dtype", "quantization", "one-byte KV cache values with a scale per token and head",
              _flag("--kv-cache-dtype", ("auto", "int8", "fp8_e4m3", "fp8_e5m2")), "auto"),
    Technique("dtype", "quantization", "weights' and activations' precision",
              _flag("--dtype", ("float32", "bfloat16")), "float32"),
    Technique("speculative", "speculative", "n-gram proposals verified several tokens per step",
              _json("--speculative-config", "ngram-4", {"method": "ngram", "num_speculative_tokens": 4}), "off"),
    Technique("tensor-parallel", "scale-out", "each layer split over two workers",
              _flag("--tensor-parallel-size", ("1", "2")), "1"),
    # Round robin beside cache-aware routing: what the router's prefix affinity adds to the second replica.
    Technique("data-parallel", "scale-out", "two engine replicas behind one endpoint (cache-aware or round-robin)",
              (*_flag("--data-parallel-size", ("1", "2")),
               Setting("2-round-robin", ("--data-parallel-size", "2", "--data-parallel-routing", "round_robin"))),
              "1"),
)}


def select(names: str | None) -> list[Technique]:
    """The techniques a comma list names, in the registry's order; every one when ``names`` is empty.

    Raises:
        ValueError: a name the registry lacks (the message lists the known ones).
    """
    wanted = [n.strip() for n in (names or "").split(",") if n.strip()]
    unknown = [n for n in wanted if n not in TECHNIQUES]
    if unknown:
        raise ValueError(f"unknown technique(s) {unknown}; known: {', '.join(TECHNIQUES)}")
    return [t for t in TECHNIQUES.values() if not wanted or t.name in wanted]


def missing(serve_args: tuple[str, ...], options: dict[str, tuple[str, ...] | None]) -> str | None:
    """Why `jido serve` cannot take these flags, or None when it can.

    Args:
        serve_args: flags and their values, as on the command line.
        options: every flag `jido serve` has, with its choices (None: any value).
    """
    for i, arg in enumerate(serve_args):
        if not arg.startswith("--"):
            continue
        if arg not in options:
            return f"jido serve has no {arg} flag"
        choices = options[arg]
        value = serve_args[i + 1] if i + 1 < len(serve_args) and not serve_args[i + 1].startswith("--") else None
        if choices is not None and value is not None and value not in choices:
            return f"jido serve {arg} takes {', '.join(choices)}, not {value}"
    return None
