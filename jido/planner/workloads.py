"""Workloads: prompt/output length distributions, prefix sharing, default SLOs and request rate."""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np


class WorkloadError(ValueError):
    """A workload name, file or SLO string is invalid."""


@dataclass(frozen=True)
class Slo:
    """Latency targets in milliseconds: p90 time to first token and p90 time per output token."""

    ttft_ms: float
    tpot_ms: float

    def __post_init__(self) -> None:
        if self.ttft_ms <= 0 or self.tpot_ms <= 0:
            raise WorkloadError(f"SLO targets must be > 0 ms, got ttft={self.ttft_ms}, tpot={self.tpot_ms}")

    @classmethod
    def parse(cls, text: str, default: Slo | None = None) -> Slo:
        """'ttft=500,tpot=50' (milliseconds; '2s' or '500ms' also accepted); missing keys keep default."""
        values = {"ttft": default.ttft_ms if default else None, "tpot": default.tpot_ms if default else None}
        for item in filter(None, text.split(",")):
            key, sep, value = item.partition("=")
            if not sep or key.strip() not in values:
                raise WorkloadError(f"bad SLO item {item!r}: expected ttft=MS or tpot=MS")
            values[key.strip()] = _parse_ms(value.strip())
        if None in values.values():
            raise WorkloadError(f"SLO {text!r} must give both ttft and tpot")
        return cls(values["ttft"], values["tpot"])


def _parse_ms(value: str) -> float:
    try:
        if value.endswith("ms"):
            return float(value[:-2])
        if value.endswith("s"):
            return float(value[:-1]) * 1000
        return float(value)
    except ValueError as exc:
        raise WorkloadError(f"bad SLO value {value!r}: expected a number of ms, like 500 or 0.5s") from exc


@dataclass(frozen=True)
class Workload:
    """Log-normal prompt and output lengths (mean and coefficient of variation), clipped to max_len."""

    name: str
    input_mean: float
    input_cv: float
    output_mean: float
    output_cv: float
    prefix_share: float
    ttft_ms: float
    tpot_ms: float
    rate: float
    max_len: int = 32768

    def __post_init__(self) -> None:
        for key in ("input_mean", "output_mean", "rate", "ttft_ms", "tpot_ms"):
            if getattr(self, key) <= 0:
                raise WorkloadError(f"workload {self.name}: {key} must be > 0, got {getattr(self, key)}")
        if self.input_cv < 0 or self.output_cv < 0:
            raise WorkloadError(f"workload {self.name}: coefficients of variation must be >= 0")
        if not 0 <= self.prefix_share < 1:
            raise WorkloadError(f"workload {self.name}: prefix_share must be in [0, 1), got {self.prefix_share}")

    @property
    def slo(self) -> Slo:
        return Slo(self.ttft_ms, self.tpot_ms)

    @property
    def kind(self) -> str:
        """'prefill-heavy' when prompt tokens dominate the work, else 'decode-heavy'."""
        return "prefill-heavy" if self.input_mean >= 4 * self.output_mean else "decode-heavy"


WORKLOADS: dict[str, Workload] = {
    # long retrieved context, short answer: prefill-heavy
    "rag": Workload("rag", 4000, 0.3, 200, 0.5, 0.1, ttft_ms=1500, tpot_ms=50, rate=4),
    # system prompt plus history, medium answers
    "chat": Workload("chat", 1000, 0.8, 300, 0.7, 0.3, ttft_ms=500, tpot_ms=50, rate=8),
    # repository context reused across requests, long completions, tight inter-token latency
    "codegen": Workload("codegen", 2000, 0.5, 500, 0.5, 0.5, ttft_ms=1000, tpot_ms=30, rate=4),
    # offline jobs: loose latency, long outputs
    "batch": Workload("batch", 1000, 0.5, 1000, 0.5, 0.0, ttft_ms=60000, tpot_ms=200, rate=8),
}


def load_workload(name_or_path: str) -> Workload:
    """A preset by name, or a JSON file with the Workload fields (name defaults to the file stem)."""
    if name_or_path in WORKLOADS:
        return WORKLOADS[name_or_path]
    path = Path(name_or_path)
    if not path.is_file():
        raise WorkloadError(f"unknown workload {name_or_path!r}: use one of {', '.join(WORKLOADS)} or a JSON file")
    raw = json.loads(path.read_text())
    allowed = {f.name for f in fields(Workload)}
    unknown = set(raw) - allowed
    if unknown:
        raise WorkloadError(f"{path}: unknown workload keys {sorted(unknown)}; allowed {sorted(allowed)}")
    raw.setdefault("name", path.stem)
    try:
        return Workload(**raw)
    except TypeError as exc:
        raise WorkloadError(f"{path}: {exc}") from exc


@dataclass(frozen=True)
class RequestTrace:
    """Sampled requests: Poisson arrival times (s), prompt and output lengths (tokens)."""

    arrival_s: np.ndarray
    input_lens: np.ndarray
    output_lens: np.ndarray

    def __len__(self) -> int:
        return len(self.arrival_s)


def sample_trace(workload: Workload, num_requests: int, rate: float, seed: int) -> RequestTrace:
    rng = np.random.default_rng(seed)
    gaps = rng.exponential(1.0 / rate, num_requests)
    return RequestTrace(
        arrival_s=np.cumsum(gaps) - gaps[0],
        input_lens=_lognormal(rng, workload.input_mean, workload.input_cv, num_requests, workload.max_len),
        output_lens=_lognormal(rng, workload.output_mean, workload.output_cv, num_requests, workload.max_len),
    )


def _lognormal(rng: np.random.Generator, mean: float, cv: float, n: int, max_len: int) -> np.ndarray:
    sigma2 = np.log1p(cv * cv)
    mu = np.log(mean) - sigma2 / 2  # so that the distribution's mean is `mean`
    values = rng.lognormal(mu, np.sqrt(sigma2), n)
    return np.clip(np.rint(values), 1, max_len).astype(np.int64)
